"""cocemu: emulated accelerator nodes for compute-communication overlap.

Each rank is a thread with its own compute and comm streams; collectives, point-to-point
transfers and fused compute-communication kernels run with real numerics on NumPy arrays, and
every op is recorded into a modeled device timeline (nanoseconds, from a device profile).

    import cocemu

    def body(rank):
        x = rank.zeros((1024,), "f32"); x[:] = rank.id + 1
        cocemu.all_reduce(rank.world, x)          # async_op=False: as torch.distributed
        rank.synchronize()
        return float(x[0])

    r = cocemu.run(8, body)                       # r.returns == [36.0] * 8, r.makespan_ns > 0

Tensors are NumPy arrays used in place, never copied: C-contiguous, aligned, native byte order,
at most 4 dimensions, of dtype float32, float64, float16, int8, int32, int64, uint8 or bool --
and uint16, which holds bf16 (NumPy has no bfloat16; `to_bf16` and `from_bf16` convert; a torch
bf16 tensor `t` is `t.view(torch.int16).numpy().view(numpy.uint16)`, no copy). Anything else is
a `cocemu.Error`. Integers wrap like the device's; bool reduces as NCCL does (sum and max: or;
prod and min: and). `rank.zeros` and `rank.empty` give arrays over cocemu's own memory (in a dry run,
shape-only `cocemu.Tensor`s). Collectives take the group first, then PyTorch's arguments and
semantics: with `async_op=True` they return a `Work` whose `wait()` makes the rank's current
stream wait (the host does not block); without, they return None after that wait.

Errors are `cocemu.Error` (a RuntimeError with `code` and `rank`). A Python exception raised on a
rank unwinds every rank and is re-raised by `run` with its own type, its `rank` attribute set.
Every call that can block (synchronize, Work.synchronize, Event.synchronize, barrier, group
creation, symmetric waits, layers) releases the GIL; calls that only enqueue keep it. The rank
functions' Python runs one thread at a time, so a program issuing many small ops is bounded by
the interpreter: bench/python_overhead.py measures it against C++. Preloading oneTBB's malloc
(LD_PRELOAD=libtbbmalloc_proxy.so.2, as the `cocemu` CLI links it) makes the C++ side's
cross-thread frees cheaper.
"""

import contextlib as _contextlib

from . import _cocemu
from ._cocemu import (  # noqa: F401  (re-exported)
    ColumnParallelLinear,
    CocConfig,
    Error,
    Event,
    Group,
    Mesh,
    Op,
    OpRef,
    Profile,
    Rank,
    ReduceOp,
    RowParallelLinear,
    RunResult,
    SegmentStats,
    Stream,
    SymmetricBuffer,
    Tensor,
    Verdict,
    Work,
    all_gather,
    all_gather_matmul,
    all_reduce,
    all_to_all,
    attention_ns,
    barrier,
    batch_isend_irecv,
    broadcast,
    collective_ns,
    config_dir,
    current_rank,
    flash_attention_ns,
    from_bf16,
    fused_kernel_ns,
    gather,
    gemm_efficiency,
    gemm_ns,
    irecv,
    isend,
    judge,
    launch_ns,
    load_coc_config,
    load_profile,
    make_mesh,
    matmul_all_reduce,
    matmul_reduce_scatter,
    memory_ns,
    new_group,
    numpy_dtype,
    overlapped_ns,
    recv,
    reduce,
    reduce_scatter,
    scatter,
    send,
    split,
    to_bf16,
    unfused_attention_ns,
)

__version__ = _cocemu.__version__
__all__ = [name for name in dir() if not name.startswith("_")] + ["run", "P2POp",
                                                                   "wait_unmodeled"]


def run(n_ranks, fn, profile="ascend-910b", deterministic=True, schedule_seed=None,
        dry_run=False, timeout_s=None, record_wall_times=True):
    """Runs `fn(rank)` on `n_ranks` rank threads (1..256) and returns a `RunResult`.

    profile: a device profile name (configs/devices/<name>.yaml), a YAML path or a `Profile`.
    deterministic: reductions sum in rank order (bitwise identical across algorithms and runs).
    schedule_seed: a nonzero seed injects random yields and sleeps into the threads' waits, so
        tests see other interleavings (results and modeled times must not change).
    dry_run: shapes only: op bodies and numerics are skipped, `rank.zeros` gives shape-only
        `Tensor`s; modeled times are those of the real run.
    timeout_s: bound of every wait, in seconds, at most 86400 (a day; default:
        COCEMU_TIMEOUT_MS, else 60 s).

    Every argument is checked strictly: n_ranks and schedule_seed (0..2**63-1) are integers,
    not bools; the flags are bools, not strings; anything else is a `cocemu.Error` naming it.
    Ctrl-C (or any signal handler that raises) stops the run within about a second: every rank's
    waits fail, ranks running Python get KeyboardInterrupt, and the handler's exception is
    re-raised here with a note saying where each rank was. A rank still inside a call that
    cannot be interrupted (time.sleep) is named there and left running detached until it
    returns; its cocemu calls then fail.
    """
    return _cocemu._run(n_ranks, fn, profile=profile, deterministic=deterministic,
                        schedule_seed=schedule_seed, dry_run=dry_run, timeout_s=timeout_s,
                        record_wall_times=record_wall_times)


def wait_unmodeled(event):
    """Blocks until `event` (an Event, or a Work's event) has run, recording nothing: see
    Event.wait_unmodeled."""
    getattr(event, "event", event).wait_unmodeled()


def _error(message, code="invalid_argument"):
    e = Error(message)
    e.code, e.rank = code, None
    return e


class P2POp:
    """One op of `batch_isend_irecv`: `P2POp(cocemu.isend, tensor, peer)` (or "send"/"recv")."""

    def __init__(self, op, tensor, peer, tag=0):
        if op is isend or op == "send":
            self.kind = "send"
        elif op is irecv or op == "recv":
            self.kind = "recv"
        else:
            raise _error(f"P2POp: op must be cocemu.isend, cocemu.irecv, 'send' or 'recv', "
                         f"got {op!r}")
        self.tensor, self.peer, self.tag = tensor, peer, tag

    def __repr__(self):
        return f"cocemu.P2POp({self.kind}, peer={self.peer}, tag={self.tag})"


@_contextlib.contextmanager
def _segment(self, name):
    """Ops recorded inside the block belong to program region `name` (reports group by it)."""
    previous = self.current_segment
    self.set_segment(name)
    try:
        yield self
    finally:
        self.set_segment(previous)


@_contextlib.contextmanager
def _use_stream(self, stream):
    """Makes `stream` the rank's current stream inside the block (torch.cuda.stream(s))."""
    previous = self.current_stream
    self.set_current_stream(stream)
    try:
        yield stream
    finally:
        self.set_current_stream(previous)


Rank.segment = _segment
Rank.stream = _use_stream
