"""Everything that depends on the torch version, for torch 1.13 (Debian 12's python3-torch).

cocemu.torch runs torch code on cocemu's rank threads. Torch 1.13 keeps its process-group state in
module globals of torch.distributed.distributed_c10d (one default group per process), so
per-thread groups come from replacing the public torch.distributed functions listed here with
functions that answer from the calling rank thread's state and fall through to torch's own
anywhere else (PyTorch 2.x's threaded test process group swaps its `_world` object instead; 1.13
has none). A TorchDispatchMode is thread-local in 1.13: pushing one on a rank thread records that
thread's aten ops only.
"""
import torch
import torch.distributed as _dist
import torch.distributed.distributed_c10d as _c10d
from torch._C._distributed_c10d import ProcessGroup as ProcessGroupBase  # noqa: F401
from torch._C._distributed_c10d import Work as WorkBase  # noqa: F401
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: F401

TESTED = ((1, 13),)


def check_version(version=None):
    """Refuses a torch whose major.minor this module was not written and tested for."""
    version = version or torch.__version__
    try:
        major, minor = (int(p) for p in version.split("+")[0].split(".")[:2])
    except ValueError:
        raise ImportError(f"cocemu.torch: cannot read the torch version {version!r}") from None
    if (major, minor) not in TESTED:
        tested = ", ".join(f"{a}.{b}" for a, b in TESTED)
        raise ImportError(
            f"cocemu.torch: torch {version} is untested (tested: {tested}); its process-group "
            f"internals differ, so cocemu.torch refuses it rather than misbehave. Add a module "
            f"like cocemu/torch/_torch113.py for it.")


check_version()

# The torch.distributed functions cocemu.torch answers on rank threads (name -> the
# implementation's name in cocemu.torch._dist). Each is replaced in torch.distributed and in
# torch.distributed.distributed_c10d (P2POp and the helpers there look them up as globals).
FUNCTIONS = (
    "init_process_group", "is_initialized", "destroy_process_group", "get_rank",
    "get_world_size", "get_backend", "new_group", "get_global_rank", "_get_global_rank",
    "get_process_group_ranks", "_get_default_group", "all_reduce", "all_gather",
    "all_gather_into_tensor", "_all_gather_base", "reduce_scatter", "reduce_scatter_tensor",
    "_reduce_scatter_base", "all_to_all_single", "broadcast", "reduce", "gather", "scatter",
    "send", "recv", "isend", "irecv", "batch_isend_irecv", "barrier",
)


def install_functions(impls):
    """Replaces FUNCTIONS in torch.distributed with `dispatch(name, original)` wrappers (once)."""
    if getattr(_c10d, "_cocemu_installed", False):
        return
    for name in FUNCTIONS:
        original = getattr(_c10d, name, None)
        wrapper = impls(name, original)
        setattr(_c10d, name, wrapper)
        if hasattr(_dist, name) or name in ("all_gather_into_tensor", "reduce_scatter_tensor"):
            setattr(_dist, name, wrapper)
    _c10d._cocemu_installed = True


def register_backend(creator):
    """`init_process_group("cocemu")` names this backend (torch 1.13's plugin registry)."""
    if not hasattr(_c10d.Backend, "COCEMU"):
        _c10d.Backend.register_backend("cocemu", creator)


# torch ReduceOp -> cocemu's name (1.13: ReduceOp members are ReduceOp.RedOpType values).
def reduce_op_name(op):
    R = _dist.ReduceOp
    table = {R.SUM: "sum", R.MAX: "max", R.MIN: "min", R.PRODUCT: "prod"}
    if hasattr(R, "AVG"):
        table[R.AVG] = "avg"
    for key, name in table.items():
        if op == key:
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
