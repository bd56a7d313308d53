"""PyTorch programs on cocemu: `torch.distributed` on rank threads, NPU/GPU streams on CPU, and
torch compute priced on a modeled device timeline.

    import torch, torch.distributed as dist
    import cocemu.torch as ct

    def fn():
        x = torch.full((1024,), float(dist.get_rank() + 1), device=torch.npu.current_device())
        work = dist.all_reduce(x, async_op=True)   # the comm stream waits for the compute stream
        work.wait()                                # the compute stream waits for the comm stream
        return x.sum()

    r = ct.run(fn, world_size=8)                   # r.returns[rank], r.makespan_ns, r.summary()

Inside `fn` (one call per rank thread), plain torch.distributed works unchanged over the `cocemu`
backend, registered with torch (torch >= 2.1): each rank thread has its own c10d world, whose
default group ct.run initialises with init_process_group("cocemu"); torch's own new_group,
get_rank, DDP, the object collectives … then run on it. torch.npu / torch_npu / torch.cuda
streams and events are
the rank's cocemu streams and events, and every aten op is recorded on the current stream, priced
by the device profile. With numerics=False the device is `meta`: shapes only, the same timeline.
Torch ops run on the host thread; collectives and fused kernels on cocemu's streams.
"""
try:
    import torch as _torch  # noqa: F401
except ImportError as _e:  # pragma: no cover - exercised by the no-torch test
    raise ImportError(
        "cocemu.torch needs PyTorch (Debian 12: apt-get install python3-torch, which "
        "./bootstrap.sh deps installs); the rest of cocemu works without it") from _e

import contextlib as _contextlib
import sys as _sys

import cocemu as _cocemu

from . import _torch2  # refuses a torch older than 2.1 first
from . import _device, _dist, _memory, _mode, _state
from ._dist import ProcessGroup, Work  # noqa: F401

_dist.install()  # init_process_group("cocemu") works from import on (torchrun: ranks as processes)

__all__ = ["run", "RunResult", "unmodeled", "segment", "device", "install_device_shim",
           "install_mindspeed_shims", "ProcessGroup", "Work", "current_rank"]

MAX_WORLD_SIZE = 256


class RunResult:
    """A finished cocemu.torch.run: `returns[rank]`, `makespan_ns`, the ops, traces, summary."""

    def __init__(self, result, returns, ops_recorded, peak_memory_bytes=None):
        self.result = result
        self.returns = returns
        self.ops_recorded = ops_recorded  # aten ops priced, per rank
        self.peak_memory_bytes = peak_memory_bytes  # modeled device memory peak, per rank

    def __getattr__(self, name):  # makespan_ns, wall_ns, ops, write_chrome_trace, write_svg …
        return getattr(self.result, name)

    def elapsed_time(self, start, end):
        """Modeled ms between two torch.npu/torch.cuda Events recorded in the run."""
        return (self._event_ns(end) - self._event_ns(start)) / 1e6

    def _event_ns(self, event):
        ev = event.ev
        if ev is None or ev.op is None:  # recorded on an empty stream: the timeline's start
            return 0
        return self.result.event_time_ns(ev)

    def verdicts(self, baseline, rank=0):
        """MindSpeed's overlap verdict (R-BE-3) for each segment also in `baseline` (the same
        program run without overlap): {name: cocemu.Verdict}."""
        serial = {s.name: s for s in baseline.segments(rank)}
        return {s.name: _cocemu.judge(serial[s.name], s) for s in self.result.segments(rank)
                if s.name in serial}

    def summary(self, rank=0, baseline=None):
        """Modeled and wall time, per-segment figures and, given the serial `baseline` run,
        each segment's overlap verdict."""
        text = self.result.summary(rank)
        if baseline is not None:
            verdicts = self.verdicts(baseline, rank)
            if verdicts:
                text += "\n# overlap verdicts against the baseline (MindSpeed's criteria)\n"
                text += "".join(f"{name:<16} {v.text}\n" for name, v in verdicts.items())
        return text


def run(fn, world_size=8, profile="ascend-910b", deterministic=True, numerics=True,
        schedule_seed=None, timeout_s=None, checked=True, record=True, processes=False):
    """Runs `fn()` on `world_size` rank threads with torch.distributed initialised (backend
    "cocemu") on each, and returns a RunResult.

    processes: True runs each rank in a process of its own (module globals, torch's generator
        and current device per rank, as under torchrun); fn must be importable (a module-level
        function) and its return value picklable. The same bits and modeled nanoseconds as
        threads.

    The default group exists when fn starts: code written for torchrun guards its own
    init_process_group with `if not dist.is_initialized()`; an unguarded second call raises
    torch's ValueError ("… default process group twice"), with a note saying so. Groups live as
    long as the run: a call on one afterwards is an error saying the run has ended.

    numerics: False runs a dry run: the rank's device tensors are meta tensors (ct.device()),
        collectives and kernels take shapes only, the modeled timeline is the real run's.
    checked: report reading an async collective's output before its Work.wait().
    record: price the aten ops fn runs (TorchDispatchMode) on the current stream; False only
        turns the pricing off (the device mapping, per-rank random state and allocator stay).
    timeout_s: bound of every wait, seconds in (0, 86400] (default: COCEMU_TIMEOUT_MS, else 60 s).
    numerics, checked, record, deterministic: bools (a string such as 'False' is an error).
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or \
            not 1 <= world_size <= MAX_WORLD_SIZE:
        raise _state.error(f"cocemu.torch.run: world_size = {world_size!r} out of range "
                           f"1..{MAX_WORLD_SIZE}")
    if not callable(fn):
        raise _state.error(f"cocemu.torch.run: fn must be callable, got {type(fn).__name__}")
    for name, value in (("numerics", numerics), ("checked", checked), ("record", record),
                        ("deterministic", deterministic)):
        if not isinstance(value, bool):
            raise _state.error(f"cocemu.torch.run: {name} = {value!r} must be True or False "
                               f"(a bool, not {type(value).__name__})")
    if not isinstance(processes, bool):
        raise _state.error(f"cocemu.torch.run: processes = {processes!r} must be True or False "
                           f"(a bool, not {type(processes).__name__})")
    timeout = _timeout_s(timeout_s)
    if processes:
        from . import _processes
        r = _processes.run(fn, world_size, profile, deterministic, numerics, schedule_seed,
                           timeout, checked, record)
        returns = list(r.returns)
        return RunResult(r, [x[0] for x in returns], [x[1] for x in returns],
                         [x[2] for x in returns])
    install_device_shim()
    _dist.install()
    recorded = [0] * world_size
    threads = _torch.get_num_threads()
    _torch.set_num_threads(1)  # eight rank threads already share the machine's cores
    shared = {}  # one dict for every rank of the run (cocemu.torch._dist keeps its state there)
    store = _torch2.new_store()  # one store for the run, as torchrun's rendezvous gives
    states = [None] * world_size

    def body(rank):
        st = states[rank.id] = _state.RankState(rank, numerics, checked, timeout, shared)
        _state.set_current(st)
        try:
            _dist.start_rank(st, store, timeout)
            # Always pushed: the mode maps the device, the random state and the allocator
            # per rank; `record` decides only whether it prices the ops.
            st.mode = _mode.Recorder(st, record)
            with st.mode:
                out = _call(fn)
            rank.synchronize()
            if st.mode is not None:
                recorded[rank.id] = st.mode.ops
            return out
        finally:
            try:
                _dist.end_rank(st, failing=_sys.exc_info()[0] is not None)
            finally:
                _state.set_current(None)

    _torch2.enter_run()
    try:
        r = _cocemu.run(world_size, body, profile=profile, deterministic=deterministic,
                        schedule_seed=schedule_seed, dry_run=not numerics, timeout_s=timeout_s)
    finally:
        _torch2.exit_run()
        _torch.set_num_threads(threads)
    _device.finish_run(r, states)
    return RunResult(r, list(r.returns), recorded,
                     [0 if st is None else _memory.peak(st) for st in states])


def _timeout_s(timeout_s):
    """The run's bound of every wait in seconds: timeout_s, else COCEMU_TIMEOUT_MS, else 60."""
    import math
    import os
    if timeout_s is None:
        env = os.environ.get("COCEMU_TIMEOUT_MS")
        if not env:
            return 60.0
        try:
            ms = float(env)
        except ValueError:
            ms = math.nan
        if not (math.isfinite(ms) and ms > 0):
            raise _state.error(f"cocemu.torch.run: COCEMU_TIMEOUT_MS = {env!r} is not a positive "
                               f"number of milliseconds")
        return ms / 1e3
    return _cocemu._cocemu._check_timeout_s(timeout_s, "cocemu.torch.run", "timeout_s")


def _call(fn):
    """fn(), with a note on torch's error for a second init_process_group."""
    try:
        return fn()
    except ValueError as e:
        if "initialize the default process group twice" in str(e):
            e.add_note("cocemu.torch.run has already initialised the default process group "
                       "(backend 'cocemu') on this rank thread; guard the call with `if not "
                       "torch.distributed.is_initialized():`, as code run under torchrun "
                       "usually does")
        elif "is not initialized in the world group map" in str(e) and \
                "cocemu.torch.ProcessGroup" in str(e):
            e.add_note("cocemu.torch: the group was made on another rank thread: module-level "
                       "state (Megatron's parallel_state, a global holding a group) is shared by "
                       "every rank thread, so one rank's group reaches another; run the ranks as "
                       "processes (cocemu.torch.run(..., processes=True), or torchrun with "
                       "init_process_group('cocemu'))")
        raise


@_contextlib.contextmanager
def unmodeled():
    """Ops inside the block run but are not recorded (setup: inputs, weights)."""
    st = _state.require("cocemu.torch.unmodeled")
    st.recording += 1
    try:
        yield
    finally:
        st.recording -= 1


@_contextlib.contextmanager
def segment(name):
    """Ops recorded inside the block belong to program region `name`: the summary gives its
    figures and, against a baseline run, MindSpeed's overlap verdict."""
    st = _state.require("cocemu.torch.segment")
    with st.rank.segment(name):
        yield


def current_rank():
    """The calling rank thread's cocemu.Rank (streams, profile, segments)."""
    return _state.require("cocemu.torch.current_rank").rank


def device():
    """The device tensors of this run live on: cpu, or meta with numerics=False."""
    return _device.current_device()


def install_device_shim():
    """torch.npu, torch_npu and torch.cuda's stream/event/device calls resolve to cocemu on rank
    threads (ct.run calls it)."""
    _device.install()


def install_mindspeed_shims():
    """Installs `mindspeed.ops.lcal_functional.coc_ops` over cocemu's fused kernels."""
    from . import coc_ops
    coc_ops.install()
    return coc_ops
