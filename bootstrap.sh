#!/usr/bin/env bash
# Installs what cocemu needs on Debian 12 or 13 (if missing), builds it, and runs it.
#
#   ./bootstrap.sh run    install, build (Release) and run the main job: cocemu bench
#   ./bootstrap.sh test   install, build (Release) and run every test with ctest (the C++ tests,
#                         the Python module's pytest tests, labels python and torch, and the
#                         install test)
#   ./bootstrap.sh install [PREFIX]
#                         build (Release) and install into PREFIX (default /usr/local): headers,
#                         libcocemu.so, the cocemu CLI, configs in PREFIX/share/cocemu, the CMake
#                         package and pkg-config file, and `import cocemu` for .venv's python
#   ./bootstrap.sh tsan   ThreadSanitizer build; runs the runtime, collectives, attention, layers
#                         and bench tests
#   ./bootstrap.sh asan   AddressSanitizer + UBSan build; runs every C++ test
#   ./bootstrap.sh fuzz   libFuzzer targets (clang): each parser fuzzed for FUZZ_SECONDS (30)
#   ./bootstrap.sh avx2   on a CPU with AVX-512, also builds det_gemm's AVX2 kernel (the one a CPU
#                         without AVX-512 runs) and runs its tests
#   ./bootstrap.sh deps   only install: the Debian packages, and the project environment .venv/
#                         (torch, NumPy, pytest from PyPI, pinned in python/requirements.txt)
#
# The project environment is made from COCEMU_PYTHON if set, else the first Python 3.11 found
# (python3.11 on PATH, then Debian 12's /usr/bin/python3.11), else python3: the pinned torch is a
# CPU build for Python 3.11. CMake builds the module for .venv/bin/python when .venv exists.
set -euo pipefail
cd "$(dirname "$0")"

# Debian 12 (bookworm) and 13 (trixie) name these packages alike; their Pythons differ (3.11 and
# 3.13), which the project environment takes care of. Open MPI (libopenmpi-dev, openmpi-bin: 4.1
# on Debian 12, 5.0 on 13) gives the cocemu CLI its transport for `mpirun -n H cocemu …`.
PKGS="build-essential cmake pkg-config libopenblas-dev libopenblas-pthread-dev libtbb-dev \
libyaml-cpp-dev libfmt-dev libgtest-dev libgmock-dev libcli11-dev nlohmann-json3-dev librsvg2-bin \
python3-dev python3-numpy python3-venv pybind11-dev libopenmpi-dev openmpi-bin"
JOBS="${JOBS:-$(nproc)}"

deps() {
  local missing=""
  for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
  [ -z "$missing" ] && return 0
  echo "bootstrap: installing$missing"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  # shellcheck disable=SC2086
  $sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null
}

pick_python() {  # the interpreter .venv is made from
  if [ -n "${COCEMU_PYTHON:-}" ]; then
    echo "$COCEMU_PYTHON"
    return
  fi
  local p
  for p in python3.11 /usr/bin/python3.11 python3; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import venv, ensurepip' >/dev/null 2>&1; then
      command -v "$p"
      return
    fi
  done
  echo "bootstrap: no Python with venv and ensurepip found (Debian: apt-get install python3-venv)" >&2
  exit 1
}

venv() {  # the project environment: .venv/ with python/requirements.txt installed
  if [ ! -x .venv/bin/python ]; then
    local py
    py=$(pick_python)
    echo "bootstrap: making .venv from $py ($("$py" --version 2>&1))"
    "$py" -m venv .venv
  fi
  if ! .venv/bin/python -m pip install -q -r python/requirements.txt >.venv/pip.log 2>&1; then
    cat .venv/pip.log >&2
    echo "bootstrap: pip install -r python/requirements.txt failed (log above)" >&2
    exit 1
  fi
}

build() {  # build DIR [cmake args...]
  local dir="$1"
  shift
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
  cmake --build "$dir" -j "$JOBS"
}

case "${1:-}" in
  deps)
    deps
    venv
    ;;
  run)
    deps
    venv
    build build
    shift
    ./build/cli/cocemu bench --json cocemu-bench-out/bench.json "$@"
    ;;
  test)
    deps
    venv
    build build
    ctest --test-dir build -j "$JOBS" --output-on-failure --timeout 600
    ;;
  install)
    deps
    venv
    build build
    prefix="${2:-/usr/local}"
    sudo=""
    mkdir -p "$prefix" 2>/dev/null || true
    [ -w "$prefix" ] || sudo="sudo"
    $sudo cmake --install build --prefix "$prefix" | { grep -v '^-- \(Up-to-date\|Installing\): ' || true; }
    # Say how to reach what was installed: the CLI, and the Python package, built for the
    # project environment's interpreter (.venv/bin/python), when that does not look in the
    # prefix's packages folder.
    echo "bootstrap: installed into $prefix: $prefix/bin/cocemu"
    module=$(find "$prefix"/lib/python3* -maxdepth 3 -path '*-packages/cocemu/_cocemu*.so' 2>/dev/null | head -n1)
    if [ -n "$module" ]; then
      site=$(dirname "$(dirname "$module")")
      py=$(grep -s '^COCEMU_PYTHON_EXECUTABLE:' build/CMakeCache.txt | cut -d= -f2-)
      py=${py:-.venv/bin/python}
      if (cd / && "$py" -c "import cocemu, os, sys; \
          sys.exit(os.path.realpath(cocemu.__file__).startswith(os.path.realpath('$site')) == 0)" \
          2>/dev/null); then
        echo "bootstrap: $py imports cocemu from $site"
      else
        echo "bootstrap: for import cocemu with $py: export PYTHONPATH=$site"
      fi
    fi
    ;;
  tsan)
    deps
    # Sanitizer builds leave out the Python module and its tests, and the install test: a
    # sanitized extension or library needs the sanitizer's runtime loaded before anything else
    # (LD_PRELOAD into python3 and every program linking libcocemu.so), and then reports the
    # interpreter's own allocations and threads. They test the C++ libraries; the Release build
    # (`test`) tests the module and the package.
    build build-tsan -DCOCEMU_SANITIZE=thread
    # The `plan` tests are not run here: Debian's libtbb is not built with TSan, so its
    # scheduler's synchronisation (task stealing, its small-object pool, joins) is invisible and
    # TSan reports races inside oneTBB's own frames; suppressing those would also hide races in
    # code that oneTBB calls.
    # The training step's tests load both cores for minutes under TSan; they run after the
    # others, so the timeout tests' deadlines are not measured on a starved machine.
    # LargeWorld (256 ranks, 768 threads) runs last and alone: under TSan on 2 cores it takes
    # 20-28 s by itself and up to 167 s beside another instance. Every wait of the runtime
    # re-checks its counter at least every 5 ms, so a lost futex wake costs latency, never
    # progress; the one stall seen (180 s, inside `ctest -j` beside other tests) is read as TSan
    # starving its 768 threads: no lost wakeup was found, and 30 Release and 9 TSan runs under
    # COCEMU_SCHEDULE_SEED passed.
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
      ctest --test-dir build-tsan -j "$JOBS" -L 'runtime|collectives|attention|layers|bench' \
      -E '^LargeWorld[.]' --output-on-failure --timeout 900
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
      ctest --test-dir build-tsan -j "$JOBS" -L train --output-on-failure --timeout 900
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
      ctest --test-dir build-tsan -j 1 -R '^LargeWorld[.]' --output-on-failure --timeout 900
    ;;
  asan)
    deps
    build build-asan -DCOCEMU_SANITIZE=address
    ASAN_OPTIONS="detect_leaks=1" UBSAN_OPTIONS="print_stacktrace=1" \
      ctest --test-dir build-asan -j "$JOBS" --output-on-failure --timeout 900
    ;;
  avx2)
    deps
    # det_gemm picks its kernel at compile time (-march=native): the AVX2 one is only built, and
    # so only tested, on a machine without AVX-512 unless it is asked for here.
    if grep -qw avx512f /proc/cpuinfo && grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
      cmake -S . -B build-avx2 -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS=-mno-avx512f >/dev/null
      cmake --build build-avx2 -j "$JOBS" --target test_runtime
      ./build-avx2/tests/test_runtime --gtest_filter='DetGemm.*'
    else
      echo "bootstrap: no AVX-512 here, so the main build already runs det_gemm's AVX2 kernel"
    fi
    ;;
  fuzz)
    deps
    # libFuzzer and the sanitizer runtimes come in packages of clang's own major version
    # (Debian 12: 14, 13: 19): libfuzzer-N-dev and libclang-rt-N-dev.
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    if ! command -v clang++ >/dev/null 2>&1; then
      $sudo apt-get update -qq || true
      $sudo apt-get install -y -qq --no-install-recommends clang >/dev/null || true
    fi
    if command -v clang++ >/dev/null 2>&1; then
      major=$(clang++ -dumpversion | cut -d. -f1)
      for pkg in "libfuzzer-$major-dev" "libclang-rt-$major-dev"; do
        if ! dpkg -s "$pkg" >/dev/null 2>&1; then
          $sudo apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null || true
        fi
      done
    fi
    if ! command -v clang++ >/dev/null 2>&1; then
      echo "bootstrap: clang is not available: the fuzz targets are skipped"
      exit 0
    fi
    probe=$(mktemp -d)
    printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' \
      >"$probe/probe.cpp"
    if ! clang++ -fsanitize=fuzzer,address,undefined "$probe/probe.cpp" -o "$probe/probe" 2>"$probe/log"; then
      echo "bootstrap: clang++ $(clang++ -dumpversion) cannot link -fsanitize=fuzzer,address,undefined:" >&2
      head -n 5 "$probe/log" >&2
      echo "bootstrap: install libfuzzer-$major-dev and libclang-rt-$major-dev" >&2
      rm -rf "$probe"
      exit 1
    fi
    rm -rf "$probe"
    CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Release -DCOCEMU_FUZZ=ON \
      -DCOCEMU_NATIVE=OFF >/dev/null
    cmake --build build-fuzz -j "$JOBS" --target fuzz_targets
    seconds="${FUZZ_SECONDS:-30}"
    for t in npy profile model coc validation train; do
      corpus="build-fuzz/corpus-$t"
      mkdir -p "$corpus"
      case "$t" in
        npy) cp tests/fuzz/corpus/npy/*.npy "$corpus"/ ;;
        profile) cp configs/devices/*.yaml tests/fuzz/corpus/profile/*.yaml "$corpus"/ ;;
        model) cp configs/models/*.yaml "$corpus"/ ;;
        coc) cp configs/coc.yaml "$corpus"/ ;;
        validation) cp configs/validation.yaml "$corpus"/ ;;
        train) cp configs/train/*.yaml "$corpus"/ ;;
      esac
      # validate models every shipped reference (training runs through the step model): one
      # input of the seed corpus takes longer than 10 s under ASan and UBSan.
      per_input=10
      [ "$t" = validation ] && per_input=120
      echo "fuzz_$t: ${seconds} s"
      ASAN_OPTIONS="detect_leaks=0" "./build-fuzz/tests/fuzz/fuzz_$t" "$corpus" \
        -max_total_time="$seconds" -max_len=65536 -timeout="$per_input" -rss_limit_mb=4096 \
        -artifact_prefix="build-fuzz/finding-$t-" -print_final_stats=1 2>&1 | tail -n 3
    done
    ;;
  *)
    sed -n '2,17p' "$0"
    exit 2
    ;;
esac
