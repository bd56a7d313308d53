"""Checks of torch.distributed's arguments before torch's own code reads them: a rank, a
reduction op or a group's ranks that torch would hand to its C++ options (pybind11's
"incompatible function arguments") or refuse without the value is refused here, naming the
call, the rank, the argument, the value and what is allowed.

The checks refuse only what torch refuses too; a valid call reaches torch's function unchanged.
They are installed once, on `torch.distributed`'s names (code that imported a function before
`import cocemu.torch` keeps torch's). `isend` and `irecv` keep torch's own functions: torch tells
a P2POp's direction by their identity (`op.op is isend`)."""
import functools
import inspect
import operator

import torch.distributed as dist

from ._state import error

_INT64 = 1 << 63

# call -> its rank arguments: (name, the group-rank twin, None allowed when both are None)
_RANKS = {
    "broadcast": ("src", "group_src", False),
    "reduce": ("dst", "group_dst", False),
    "send": ("dst", "group_dst", False),
    "recv": ("src", "group_src", True),    # no source: a receive from any rank
    "gather": ("dst", "group_dst", True),  # torch 2.x: neither names rank 0 of the group
    "scatter": ("src", "group_src", True),
    "broadcast_object_list": ("src", "group_src", True),
    "gather_object": ("dst", "group_dst", True),
    "scatter_object_list": ("src", "group_src", True),
    "send_object_list": ("dst", "group_dst", False),
    "recv_object_list": ("src", "group_src", True),
}
_OPS = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor", "all_reduce_coalesced")
_LISTS = {"gather": ("gather_list", "dst", "group_dst"),
          "scatter": ("scatter_list", "src", "group_src")}


def _where(call, group=None):
    """"rank R (group G): call" — what a multi-rank error starts with."""
    if not dist.is_initialized():
        return call
    rank = dist.get_rank()
    if group is None or group is dist.group.WORLD:
        return f"rank {rank}: {call}"
    try:
        ranks = dist.get_process_group_ranks(group)
    except Exception:
        return f"rank {rank}: {call}"
    return f"rank {rank} (group of ranks {ranks}): {call}"


def _rank_value(call, name, value, group):
    """An int rank (not a bool, within int64), or an error naming it."""
    try:
        if isinstance(value, bool):
            raise TypeError
        v = operator.index(value)
    except TypeError:
        raise error(f"{_where(call, group)}: {name}={value!r} ({type(value).__name__}) is not a "
                    f"rank; allowed an int rank") from None
    if not -_INT64 <= v < _INT64:
        raise error(f"{_where(call, group)}: {name}={v} is not a rank of the group (ranks are "
                    f"0..world size - 1)")
    return v


def _check_ranks(call, a):
    name, twin, none_ok = _RANKS[call]
    group = a.get("group")
    for n in (name, twin):
        if a.get(n) is not None:
            _rank_value(call, n, a[n], group)
    if a.get(name) is None and a.get(twin) is None and not none_ok:
        raise error(f"{_where(call, group)}: {name}=None and {twin}=None; name the peer "
                    f"({name}=its global rank or {twin}=its rank in the group)")
    if call == "send" and a.get(name) is not None and dist.is_initialized() and \
            operator.index(a[name]) == dist.get_rank():
        raise error(f"{_where(call, group)}: dst={a[name]} is this rank; a rank cannot send to "
                    f"itself")
    if call in _LISTS:
        _check_root_list(call, a, group)


def _check_root_list(call, a, group):
    """gather/scatter: the root rank must pass its list (torch's own error does not say which
    rank is the root)."""
    list_name, name, twin = _LISTS[call]
    if a.get(list_name) is not None or not dist.is_initialized():
        return
    if a.get(name) is not None:
        root = operator.index(a[name])
        if group is not None and group is not dist.group.WORLD:
            try:
                root = dist.get_group_rank(group, root)
            except Exception:
                return  # not a member: torch's own error names it
        said = f"{name}={a[name]}"
    else:
        root = 0 if a.get(twin) is None else operator.index(a[twin])
        said = f"{twin}={root}" if a.get(twin) is not None else f"{name}=None: rank 0 of the group"
    if dist.get_rank(group) == root:
        raise error(f"{_where(call, group)}: this rank is the root ({said}) and {list_name} is "
                    f"None; the root passes a list of one tensor per rank of the group")


def _check_op(call, a):
    op = a.get("op")
    if op is None or isinstance(op, (dist.ReduceOp, dist.ReduceOp.RedOpType)):
        return
    allowed = ", ".join(f"ReduceOp.{n}" for n in ("SUM", "AVG", "PRODUCT", "MIN", "MAX"))
    raise error(f"{_where(call, a.get('group'))}: op={op!r} ({type(op).__name__}) is not a "
                f"torch.distributed.ReduceOp; allowed {allowed}")


def _check_new_group(call, a):
    ranks = a.get("ranks")
    if ranks is None:
        return
    if isinstance(ranks, (str, bytes)) or not hasattr(ranks, "__iter__"):
        raise error(f"{_where(call)}: ranks={ranks!r} ({type(ranks).__name__}) is not a list "
                    f"of ranks; allowed a list of distinct ints in 0..world size - 1")
    ranks = list(ranks)
    for r in ranks:
        _rank_value(call, f"rank {r!r} of ranks={ranks!r}", r, None)
    seen = set()
    for r in ranks:
        if r in seen:
            raise error(f"{_where(call)}: ranks={ranks!r} names rank {r} twice; allowed a list "
                        f"of distinct ranks")
        seen.add(r)


def _checked(call, original, checks):
    names = list(inspect.signature(original).parameters)

    @functools.wraps(original)
    def checked(*args, **kwargs):
        a = dict(zip(names, args))
        a.update(kwargs)
        for check in checks:
            check(call, a)
        return original(*args, **kwargs)

    checked.__cocemu_checked__ = True
    return checked


def install():
    """Wraps torch.distributed's functions with their checks (once)."""
    calls = {}
    for call in _RANKS:
        calls.setdefault(call, []).append(_check_ranks)
    for call in _OPS:
        calls.setdefault(call, []).append(_check_op)
    calls["new_group"] = [_check_new_group]
    for call, checks in calls.items():
        original = getattr(dist, call, None)
        if original is None or getattr(original, "__cocemu_checked__", False):
            continue
        setattr(dist, call, _checked(call, original, checks))
