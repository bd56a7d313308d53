"""Per-rank-thread state of a cocemu.torch run (torch.distributed's groups, the device shim's
streams, the recording mode), kept per thread as PyTorch 2.x's threaded process group keeps it."""
import threading
import time

import cocemu

_local = threading.local()


_process = None  # a rank process's state (every thread of the process is the rank)


def current():
    """The calling rank thread's state; in a rank process, the process's; else None."""
    return getattr(_local, "state", _process)


def set_current(state):
    _local.state = state


def set_process(state):
    """Makes `state` the rank of this process (ranks as processes), or None."""
    global _process
    _process = state


class RankState:
    def __init__(self, rank, numerics, checked, timeout_s, shared=None, api=cocemu,
                 profile=None):
        self.rank = rank
        self.api = api              # cocemu's module; a rank process's hub connection
        self.id = rank.id
        self.world_size = rank.world_size
        self.numerics = numerics
        self.checked = checked
        self.timeout_s = timeout_s
        self.profile = rank.profile if profile is None else profile
        self.world = None           # the world ProcessGroup (cocemu.torch._dist)
        self.groups = {}            # ProcessGroup -> its world ranks (this rank's groups)
        self.c10d_world = None      # torch's process-group state for this rank (_torch2)
        self.ended = False          # the run is over: this rank's groups refuse calls
        self.shared = {} if shared is None else shared  # one dict for all ranks of the run
        self.p2p_batches = {}       # batch_isend_irecv's list -> its _dist._Batch
        self.pending = []           # [(start, end, Work)] outputs of collectives not yet waited
        self.recording = 0          # > 0 while ct.unmodeled() pauses recording
        self.streams = {}           # cocemu stream -> device-shim Stream
        self.gemm_cache = {}
        self.memory_cache = {}
        self.mode = None
        self.process = None         # ranks as processes: the connection to the hub

    def shared_object(self, key, kind):
        """The run's object `kind` (cocemu.processes.shared) under `key`, one for all ranks."""
        if self.process is not None:
            return self.process.shared_object(key, kind)
        from cocemu.processes import shared
        return shared.get(self.shared, _shared_lock, key, kind)


_shared_lock = threading.Lock()


def error(message, code="invalid_argument"):
    e = cocemu.Error(message)
    e.code, e.rank = code, None
    return e


def require(call):
    """The rank state, or a clear error: `call` only works inside cocemu.torch.run."""
    st = current()
    if st is None:
        raise error(f"{call}: called outside cocemu.torch.run (it answers on rank threads only)")
    return st


def wall_wait(done, st, what):
    """Waits in host wall time (no modeled op is recorded) until `done()`; the data a host-side
    torch op reads is then there. Bounded by the run's timeout; `what` names the call."""
    if done():
        return
    deadline = time.monotonic() + st.timeout_s + 1.0
    delay = 2e-5
    while not done():
        if time.monotonic() > deadline:
            raise error(f"rank {st.id}: {what} did not complete within {st.timeout_s:g} s "
                        f"(is a peer missing from the call?)", code="timeout")
        time.sleep(delay)
        delay = min(delay * 2, 1e-3)
