"""Everything in cocemu.torch that depends on torch's version: torch >= 2.1 by the API used,
2.13 tested. No other module of cocemu.torch touches torch's private names.

torch.distributed keeps its process groups in `distributed_c10d._world` (a `_World`) and names
them in a C++ registry. cocemu.torch runs one rank per thread, so, as PyTorch 2.x's own threaded
test process group does (torch/testing/_internal/distributed/multi_threaded_pg.py), it swaps
`_world` for an object that answers from the calling rank thread's own world (torch's module
otherwise, unchanged) and turns on the registry's thread isolation during a run. The backend is
registered through `Backend.register_backend("cocemu", …, extended_api=True)`; its creator returns
a Python subclass of `ProcessGroup` (torch has no Python-subclassable `Backend`), whose methods
torch.distributed's public functions and C++ (DDP's Reducer) call. torch.distributed's functions
are not replaced.
"""
import sys
import threading

import torch
import torch.distributed as _dist
import torch.distributed.distributed_c10d as _c10d
from torch._C import _distributed_c10d as _C10D
from torch._C._distributed_c10d import ProcessGroup as ProcessGroupBase  # noqa: F401
from torch._C._distributed_c10d import Work as WorkBase  # noqa: F401
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: F401

MINIMUM = (2, 1)  # older: refused by version; newer ones lacking a hook: by check_hooks
TESTED = (2, 13)


def check_version(version=None):
    """Refuses a torch older than MINIMUM (its process-group extension points differ)."""
    version = version or torch.__version__
    try:
        major, minor = (int(p) for p in version.split("+")[0].split(".")[:2])
    except ValueError:
        raise ImportError(f"cocemu.torch: cannot read the torch version {version!r}") from None
    if (major, minor) < MINIMUM:
        raise ImportError(
            f"cocemu.torch: torch {version} is not supported (needs torch >= "
            f"{MINIMUM[0]}.{MINIMUM[1]}, tested with {TESTED[0]}.{TESTED[1]}): its process-group "
            f"extension points differ, so cocemu.torch refuses it rather than misbehave.")


def check_hooks():
    """Refuses a torch without the extension points this module uses (whatever its version):
    the default group's `new_group` hook (every rank, members or not, creates a group through
    it) and the per-thread group-name registry."""
    import inspect
    missing = []
    if "default_pg.new_group" not in inspect.getsource(_c10d._new_group_with_tag):
        missing.append("new_group on the default process group")
    if not hasattr(_C10D, "_set_thread_isolation_mode"):
        missing.append("_set_thread_isolation_mode")
    if missing:
        raise ImportError(f"cocemu.torch: torch {torch.__version__} lacks the process-group "
                          f"extension points cocemu.torch uses ({', '.join(missing)}); tested "
                          f"with torch {TESTED[0]}.{TESTED[1]}")


check_version()
check_hooks()

BACKEND = "cocemu"
NON_GROUP_MEMBER = _c10d.GroupMember.NON_GROUP_MEMBER


# --- the per-thread world --------------------------------------------------------------------

class RankWorld:
    """What torch's `_World` holds, for one rank thread (torch's `_World` keeps its maps in module
    globals, so a second instance would share them)."""

    def __init__(self):
        self.default_pg = None
        self.pg_map, self.pg_names, self.pg_group_ranks = {}, {}, {}
        self.pg_backend_config, self.tags_to_pg, self.pg_to_tag = {}, {}, {}
        self.pg_coalesce_state = {}
        self.group_count = 0
        self.comms = []

    pg_config_info = _c10d._World.pg_config_info


class ThreadWorld:
    """Stands in for `distributed_c10d._world`: the calling rank thread's RankWorld on rank
    threads (`current()` gives it), torch's own world elsewhere."""

    def __init__(self, outside, current):
        object.__setattr__(self, "_outside", outside)
        object.__setattr__(self, "_current", current)

    def _target(self):
        w = self._current()
        return self._outside if w is None else w

    def __getattr__(self, name):
        return getattr(self._target(), name)

    def __setattr__(self, name, value):
        setattr(self._target(), name, value)


def install_world(current):
    """Swaps c10d's `_world` for a ThreadWorld (once); `current()` returns the calling thread's
    RankWorld or None."""
    if not isinstance(_c10d._world, ThreadWorld):
        _c10d._world = ThreadWorld(_c10d._world, current)


_isolation_lock = threading.Lock()
_isolation_runs = 0


def enter_run():
    """A run starts: torch's group-name registry becomes per thread (each rank thread names its
    groups "0", "1" … as one process would)."""
    global _isolation_runs
    with _isolation_lock:
        if _isolation_runs == 0:
            _C10D._set_thread_isolation_mode(True)
        _isolation_runs += 1


def exit_run():
    global _isolation_runs
    with _isolation_lock:
        _isolation_runs -= 1
        if _isolation_runs == 0:
            _C10D._set_thread_isolation_mode(False)


def register_backend(creator):
    """`init_process_group("cocemu")` names this backend; `creator(options)` gets torch's
    _DistributedBackendOptions (group_rank, group_size, global_ranks_in_group, group_id)."""
    if BACKEND.upper() not in _dist.Backend._plugins:
        _dist.Backend.register_backend(BACKEND, lambda opts, pg_options: creator(opts),
                                       extended_api=True, devices=["cpu", "cuda"])


def init_default_group(rank, world_size, store, timeout):
    """init_process_group("cocemu"); torch's prefixing of sys.excepthook with the rank (a
    process-wide hook) is undone on rank threads, whose ranks share the process."""
    hook = sys.excepthook
    try:
        _dist.init_process_group(BACKEND, rank=rank, world_size=world_size, store=store,
                                 timeout=timeout)
    finally:
        if threading.current_thread() is not threading.main_thread():
            sys.excepthook = hook


def default_group():
    return _c10d._get_default_group()


def destroy_groups():
    if _dist.is_initialized():
        _dist.destroy_process_group()


def new_store():
    return _dist.HashStore()


def batch_p2p_ops():
    """Inside torch's batch_isend_irecv (which issues a Python process group's ops one at a time),
    the list of P2POps it is issuing; None elsewhere. torch ≥ 2.1 names the list `p2p_op_list`."""
    f = sys._getframe(2)
    code = _c10d.batch_isend_irecv.__code__
    for _ in range(6):
        if f is None:
            return None
        if f.f_code is code:
            return f.f_locals.get("p2p_op_list")
        f = f.f_back
    return None


def in_backward():
    """True while the autograd engine runs a backward pass on this thread."""
    return torch._C._current_graph_task_id() != -1


def after_backward(callback):
    """Runs `callback()` when the current backward pass ends (after DDP's own finalisation)."""
    torch.autograd.Variable._execution_engine.queue_callback(callback)


# torch ReduceOp -> cocemu's name.
def reduce_op_name(op):
    R = _dist.ReduceOp
    table = {R.SUM: "sum", R.MAX: "max", R.MIN: "min", R.PRODUCT: "prod", R.AVG: "avg"}
    key = getattr(op, "op", op)  # AllreduceOptions.reduceOp gives a ReduceOp; some a RedOpType
    for k, name in table.items():
        if key == k:
            return name
    return None


def op_is_view(func):
    """True for aten ops that only make a view (their output aliases an input, nothing written)."""
    rets = func._schema.returns
    return bool(rets) and all(r.alias_info is not None and not r.alias_info.is_write
                              for r in rets)


def op_writes(func):
    """The names of the arguments an aten op writes (in-place and out= variants)."""
    return tuple(a.name for a in func._schema.arguments
                 if a.alias_info is not None and a.alias_info.is_write)
