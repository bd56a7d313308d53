#!/usr/bin/env bash
# Installs the build into a temporary prefix and uses it as a user would (ctest label `install`):
#  1. builds examples/cpp (the README's example, as printed) as a separate CMake project with
#     find_package(cocemu), runs it and checks its output; builds the quickstart again in a
#     project that sets no C++ standard (the target must carry C++20);
#  2. compiles the same file with the pkg-config line and runs it, and every installed header;
#  3. checks that the installed CLI, a program linked to the installed library and the installed
#     Python module find their configs under the prefix (a profile only the prefix has);
#  4. imports the installed Python module and runs an 8-rank all_reduce.
#   test_install.sh BUILD_DIR SOURCE_DIR [PYTHON]
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
python="${3:-}"
unset COCEMU_CONFIG_DIR
export OPENBLAS_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"
step() { echo "== $*"; }
fail() { echo "FAILED: $*" >&2; exit 1; }

step "cmake --install $build --prefix $prefix"
cmake --install "$build" --prefix "$prefix" > "$tmp/install.log" || { cat "$tmp/install.log"; fail "install"; }
for f in bin/cocemu include/cocemu/runtime/world.h include/cocemu/collectives/ops.h \
         include/cocemu/layers/linear.h share/cocemu/devices/ascend-910b.yaml \
         share/cocemu/models share/cocemu/coc.yaml share/cocemu/validation.yaml; do
  [ -e "$prefix/$f" ] || fail "$f is not installed"
done
[ ! -e "$prefix/include/cocemu/runtime/detail" ] || fail "internal headers installed"
pc=$(find "$prefix" -name cocemu.pc)
[ -n "$pc" ] || fail "no cocemu.pc"
[ -n "$(find "$prefix" -name cocemuConfig.cmake)" ] || fail "no cocemuConfig.cmake"

check_quickstart() {  # DIR: the quickstart's output and files there
  grep -qx "x\[0\] = 36 on every rank" "$1/out.txt" || { cat "$1/out.txt"; fail "quickstart output"; }
  grep -q "^modeled time [0-9.]* us (host wall time [0-9.]* ms)$" "$1/out.txt" || fail "modeled time"
  python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$1/trace.json" || fail "trace.json"
  grep -q "<svg" "$1/timeline.svg" || fail "timeline.svg"
}

step "examples/cpp with find_package(cocemu)"
cmake -S "$src/examples/cpp" -B "$tmp/examples" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release > "$tmp/examples.log" || { cat "$tmp/examples.log"; fail "configure"; }
cmake --build "$tmp/examples" -j 2 >> "$tmp/examples.log" || { cat "$tmp/examples.log"; fail "build"; }
mkdir "$tmp/run1"
(cd "$tmp/run1" && "$tmp/examples/quickstart" > out.txt)
check_quickstart "$tmp/run1"
cat "$tmp/run1/out.txt"
(cd "$tmp/run1" && "$tmp/examples/overlap" > overlap.txt)
grep -q "chunked result equal to serial: yes" "$tmp/run1/overlap.txt" || fail "overlap example"

step "a CMake consumer that sets no C++ standard (the target carries cxx_std_20)"
mkdir "$tmp/consumer"
cat > "$tmp/consumer/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.20)
project(consumer LANGUAGES CXX)
find_package(cocemu CONFIG REQUIRED)
add_executable(quickstart "$src/examples/cpp/quickstart.cpp")
target_link_libraries(quickstart PRIVATE cocemu::cocemu)
CMAKE
cmake -S "$tmp/consumer" -B "$tmp/consumer/build" -DCMAKE_PREFIX_PATH="$prefix" \
  > "$tmp/consumer.log" || { cat "$tmp/consumer.log"; fail "configure the consumer"; }
cmake --build "$tmp/consumer/build" -j 2 >> "$tmp/consumer.log" 2>&1 \
  || { cat "$tmp/consumer.log"; fail "build a consumer without CMAKE_CXX_STANDARD"; }
mkdir "$tmp/run3"
(cd "$tmp/run3" && "$tmp/consumer/build/quickstart" > out.txt)
check_quickstart "$tmp/run3"

step "the pkg-config line"
flags=$(PKG_CONFIG_PATH="$(dirname "$pc")" pkg-config --cflags --libs cocemu)
echo "c++ -std=c++20 quickstart.cpp $flags"
# shellcheck disable=SC2086
c++ -std=c++20 "$src/examples/cpp/quickstart.cpp" $flags -o "$tmp/quickstart_pc"
mkdir "$tmp/run2"
(cd "$tmp/run2" && "$tmp/quickstart_pc" > out.txt)
check_quickstart "$tmp/run2"

step "every installed header compiles on its own include path"
(cd "$prefix/include" && find cocemu -name '*.h' | sort | sed 's/.*/#include "&"/') > "$tmp/all_headers.cpp"
# shellcheck disable=SC2086
c++ -std=c++20 -fsyntax-only "$tmp/all_headers.cpp" $flags || fail "the installed headers"

step "configs from the prefix"
want=$(cd "$prefix/share/cocemu" && pwd -P)
sed 's/^name: .*/name: install-probe/' "$prefix/share/cocemu/devices/ascend-910b.yaml" \
  > "$prefix/share/cocemu/devices/install-probe.yaml"
[ ! -e "$src/configs/devices/install-probe.yaml" ] || fail "the source tree has install-probe"
"$prefix/bin/cocemu" collbench --profile install-probe -n 2 -b 4096 -e 4096 --ops all_reduce \
  > "$tmp/collbench.txt" || { cat "$tmp/collbench.txt"; fail "installed CLI with an installed profile"; }
# shellcheck disable=SC2086
c++ -std=c++20 "$src/tests/install/config_probe.cpp" $flags -o "$tmp/config_probe"
"$tmp/config_probe" install-probe > "$tmp/probe.txt"
[ "$(sed -n 1p "$tmp/probe.txt")" = "$want" ] || fail "library config dir $(sed -n 1p "$tmp/probe.txt") != $want"
[ "$(sed -n 2p "$tmp/probe.txt")" = "install-probe" ] || fail "profile from the prefix"

if [ -z "$python" ]; then
  echo "== the Python module was not built: skipping its install checks"
  exit 0
fi
step "import cocemu from the prefix ($python)"
module=$(find "$prefix" -name "_cocemu*.so")
[ -n "$module" ] || fail "the Python module is not installed"
site=$(dirname "$(dirname "$module")")
echo "installed into $site"
PYTHONPATH="$site" "$python" - "$prefix" "$want" <<'PY'
import os, sys
import cocemu
prefix, want = sys.argv[1], sys.argv[2]
assert os.path.realpath(cocemu.__file__).startswith(os.path.realpath(prefix)), cocemu.__file__
assert os.path.realpath(cocemu.config_dir()) == want, cocemu.config_dir()
assert cocemu.load_profile("install-probe").name == "install-probe"
def body(rank):
    x = rank.zeros((1024,), "f32"); x[:] = rank.id + 1
    cocemu.all_reduce(rank.world, x)
    rank.synchronize()
    return float(x[0])
r = cocemu.run(8, body)
assert r.returns == [36.0] * 8 and r.makespan_ns > 0, (r.returns, r.makespan_ns)
print("8-rank all_reduce from the installed module:", r.returns[0], r.makespan_ns, "ns")
PY
echo "== install test passed"
