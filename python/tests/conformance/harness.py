"""Runs torch's own distributed API tests (DistributedTest._DistTestBase in
torch/testing/_internal/distributed/distributed_test.py of the installed torch) on cocemu.torch's
rank threads with backend `cocemu`.

Harness only, as torch's own launcher (TestDistBackend) is for processes: the rank comes from
the thread, the backend name is `cocemu` (declared, as an out-of-tree backend declares itself, in
DistTestCases' feature sets it implements: ddp, subgroup, plugin — not gpu or cuda), the test's
file-based cross-process barrier is dist.barrier(), ct.run initialises the default group, and
the world size is 3 (torch's CPU runs) or 8 for the tests torch marks skip_if_small_worldsize.
Torch's skip marks are honoured (as unittest's runner does) except those that only restrict a
CPU test to other backends (gloo, mpi …): the subset is every test that is not a CUDA test.
Test bodies run unchanged, with two exceptions the harness declares:
- CUDA tests (torch's GPU decorators: skip_if_lt_x_gpu, skip_if_no_gpu …) are skipped without
  running: on a rank torch.cuda answers as the emulated device, so they would otherwise run and
  ask for CUDA-only features (device_ids, the accelerator API).
- torch's profilers (torch.autograd.profiler.profile, torch.profiler.profile) are one per
  process; several rank threads starting one abort the interpreter. On rank threads they are
  context managers that record nothing. The bodies only read events for gloo/nccl/mpi/ucc, so the
  collective checks still run; the tests about profiling itself fail (listed).

    python harness.py [test_name …]      # every test (or those named): one line each, counts

A test that kills the interpreter (torch's profiler tests abort the process from a second
thread) only ends the child process running it: `run_all` runs the tests in a child and starts
a new child after the crashed test, which it reports as failed.
"""
import os
import subprocess
import sys
import tempfile
import time
import traceback
import unittest

WORLD_SIZE = 3  # torch's CI runs these tests with 3 CPU ranks for gloo
TIMEOUT_S = 10  # per test: every wait of the run is bounded by it
LISTED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "listed.txt")

os.environ["BACKEND"] = "cocemu"
os.environ["WORLD_SIZE"] = str(WORLD_SIZE)
if "TEMP_DIR" not in os.environ:  # the parent makes it, its children inherit it
    import atexit
    import shutil
    os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="cocemu-conformance-")
    atexit.register(shutil.rmtree, os.environ["TEMP_DIR"], True)
os.environ["INIT_METHOD"] = f"file://{os.environ['TEMP_DIR']}/init_file"
for sub in ("barrier", "test_dir", "init_dir"):
    os.makedirs(os.path.join(os.environ["TEMP_DIR"], sub), exist_ok=True)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.testing._internal import common_distributed  # noqa: E402

import cocemu.torch as ct  # noqa: E402  (registers the backend)
from cocemu.torch import _state  # noqa: E402

for feature in ("ddp", "subgroup", "plugin"):
    common_distributed.DistTestCases.backend_feature[feature].add("cocemu")

from torch.testing._internal.common_utils import TestCase  # noqa: E402
from torch.testing._internal.distributed import distributed_test  # noqa: E402

SKIP_CODES = {s.exit_code: s.message for s in common_distributed.TEST_SKIPS.values()}
GPU_DECORATORS = {"skip_if_lt_x_gpu", "skip_if_no_gpu", "nccl_skip_if_lt_x_gpu",
                  "require_n_gpus_for_nccl_backend", "with_nccl_blocking_wait"}
_trees = {}


def decorators(name):
    """The names of the module-level decorators wrapping torch's test `name` (innermost last)."""
    import ast
    out, f = [], getattr(distributed_test.DistributedTest._DistTestBase, name)
    while getattr(f, "__wrapped__", None) is not None:
        code = f.__code__
        if code.co_filename not in _trees:
            with open(code.co_filename) as src:
                _trees[code.co_filename] = ast.parse(src.read())
        out += [n.name for n in _trees[code.co_filename].body if isinstance(n, ast.FunctionDef)
                and n.lineno <= code.co_firstlineno <= n.end_lineno]
        f = f.__wrapped__
    return out


def backend_only(why):
    """True for torch's skip marks that only restrict a CPU test to other backends ("Test
    requires backend cocemu to be one of {'gloo'}", "Only MPI supports CPU all_to_all_single"):
    the harness runs those tests, since the subset is every test that is not CUDA's."""
    text = why.lower()
    return "cuda" not in text and any(b in text for b in ("gloo", "mpi", "nccl", "ucc",
                                                           "backend"))


class _NoProfile:
    """torch's profiler on a rank thread: records nothing (one profiler per process)."""

    def __init__(self, *args, **kwargs):
        self.function_events = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def key_averages(self, *args, **kwargs):
        return []

    def events(self):
        return []

    def step(self):
        pass

    def export_chrome_trace(self, path):
        with open(path, "w") as f:
            f.write("[]")


def _per_thread(real):
    def make(*args, **kwargs):
        if _state.current() is None:
            return real(*args, **kwargs)
        return _NoProfile(*args, **kwargs)
    return make


def stub_profilers():
    torch.autograd.profiler.profile = _per_thread(torch.autograd.profiler.profile)
    torch.profiler.profile = _per_thread(torch.profiler.profile)


class CocemuDistTest(TestCase, distributed_test.DistributedTest._DistTestBase):
    """One per rank thread and test, as TestDistBackend makes one per process."""

    def _barrier(self, *args, **kwargs):
        """torch's file-based barrier between processes: between the rank threads."""
        if dist.is_initialized():
            dist.barrier()
        else:
            _state.current().shared["harness_barrier"].wait(TIMEOUT_S)

    @property
    def world_size(self):
        return os.environ["WORLD_SIZE"]

    @property
    def init_method(self):
        return f"file://{self.file_name}"

    def runTest(self):  # unittest needs one method to construct an instance
        pass


def test_names():
    return sorted(n for n in dir(distributed_test.DistributedTest._DistTestBase)
                  if n.startswith("test_"))


def listed():
    """{test name: reason} from listed.txt (`name: reason` lines, # comments)."""
    out = {}
    with open(LISTED) as f:
        for line in f:
            line = line.split("#", 1)[0].strip() if line.lstrip().startswith("#") else line.strip()
            if line:
                name, _, reason = line.partition(":")
                out[name.strip()] = reason.strip()
    return out


def run_one(name, timeout_s=TIMEOUT_S):
    """("pass" | "skip" | "fail", detail) for torch's test `name` on rank threads."""
    method = getattr(distributed_test.DistributedTest._DistTestBase, name)
    decs = decorators(name)
    gpu = [d for d in decs if d in GPU_DECORATORS]
    if gpu:
        return ("skip", f"CUDA test (torch marks it {gpu[0]})")
    why = getattr(method, "__unittest_skip_why__", "")
    if getattr(method, "__unittest_skip__", False) and not backend_only(why):
        return ("skip", why)  # torch's own skip mark (unittest's runner honours it)
    world_size = 8 if "skip_if_small_worldsize" in decs else WORLD_SIZE
    os.environ["WORLD_SIZE"] = str(world_size)
    file_name = os.path.join(os.environ["TEMP_DIR"], f"init_dir/{name}")

    import threading
    barrier = threading.Barrier(world_size)

    def fn():
        _state.current().shared.setdefault("harness_barrier", barrier)
        test = CocemuDistTest("runTest")
        test.rank, test.file_name = dist.get_rank(), file_name
        dist.barrier()
        try:
            getattr(test, name)()
        except unittest.SkipTest as e:
            return ("skip", str(e))
        except SystemExit as e:
            return ("skip", SKIP_CODES.get(e.code, f"exit {e.code}"))
        if dist.is_initialized():
            dist.barrier()
        return ("pass", "")
    try:
        res = ct.run(fn, world_size=world_size, timeout_s=timeout_s).returns
    except BaseException as e:  # noqa: B036  (a rank's SystemExit, KeyboardInterrupt aside)
        if isinstance(e, KeyboardInterrupt):
            raise
        return ("fail", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                        f"\n{''.join(traceback.format_exception(e)[-6:])}")
    kinds = {k for k, _ in res}
    if kinds == {"pass"}:
        return ("pass", "")
    if "pass" not in kinds:
        return ("skip", res[0][1])
    return ("fail", f"ranks disagree: {res}")


def child(names):
    """Runs `names` here, one `start`/`done` line pair each on stdout."""
    stub_profilers()
    for name in names:
        print(f"start {name}", flush=True)
        kind, detail = run_one(name)
        print(f"done {kind} {name} {detail!r}", flush=True)


def run_all(names=None, silence_s=120, log=None):
    """{name: (kind, detail, seconds)} for every test, run in child processes; a test that
    kills its child, or prints nothing for `silence_s`, fails."""
    import ast
    import selectors
    names = list(names or test_names())
    results, i = {}, 0
    while i < len(names):
        p = subprocess.Popen([sys.executable, "-u", os.path.abspath(__file__), "--child",
                              *names[i:]], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True)
        sel = selectors.DefaultSelector()
        sel.register(p.stdout, selectors.EVENT_READ)
        current, t0 = None, time.monotonic()
        while True:
            if not sel.select(timeout=silence_s):
                p.kill()
                results[current] = ("fail", f"no progress for {silence_s} s (killed)",
                                    time.monotonic() - t0)
                i = names.index(current) + 1
                break
            line = p.stdout.readline()
            if not line:  # the child ended
                p.wait()
                if current is not None and current not in results:
                    results[current] = ("fail", f"the test killed the interpreter (exit "
                                        f"{p.returncode})", time.monotonic() - t0)
                i = names.index(current) + 1 if current is not None else len(names)
                break
            if line.startswith("start "):
                current, t0 = line.split()[1], time.monotonic()
            elif line.startswith("done "):
                _, kind, name, detail = line.rstrip("\n").split(" ", 3)
                results[name] = (kind, ast.literal_eval(detail), time.monotonic() - t0)
                if log is not None:
                    log(name, *results[name])
                if name == names[-1]:
                    p.wait()
                    i = len(names)
                    break
        sel.close()
        p.stdout.close()
    return results


def main(names):
    start = time.monotonic()

    def log(name, kind, detail, seconds):
        first = detail.splitlines()[0] if detail else ""
        print(f"{kind:4} {seconds:6.2f}s {name} {first[:200]}", flush=True)
    results = run_all(names, log=log)
    counts = {"pass": 0, "skip": 0, "fail": 0}
    for name, (kind, detail, seconds) in results.items():
        counts[kind] += 1
        if detail.startswith(("the test killed", "no progress")):
            log(name, kind, detail, seconds)
    print(f"# {counts} in {time.monotonic() - start:.1f} s")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2:])
    else:
        main(sys.argv[1:])
