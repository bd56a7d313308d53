"""torch.distributed on cocemu rank threads: the `cocemu` backend.

Each rank thread has its own world ProcessGroup and its own groups; collectives run on cocemu's
group comm streams with ProcessGroupNCCL/HCCL semantics: the comm stream waits for the caller's
current stream, `Work.wait()` makes the current stream wait for the collective (modeled; the host
does not block in modeled time). Torch ops themselves run on the host thread (cocemu.torch._mode
prices them on the current stream), so `Work.wait()` also waits in wall time until the data is
there; reading an async collective's output before its `wait()` is reported (checked mode).
"""
import numpy as np
import torch

import cocemu

from . import _state, _torch113
from ._state import error

DTYPES = {
    torch.float32: "f32", torch.float64: "f64", torch.bfloat16: "bf16", torch.float16: "f16",
    torch.int8: "i8", torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8",
    torch.bool: "bool",
}


class ProcessGroup(_torch113.ProcessGroupBase):
    """A torch ProcessGroup over a cocemu group (one object per rank thread)."""

    def __init__(self, cg, ranks, name):
        super().__init__(cg.rank, cg.size)
        self.cg, self.ranks, self.group_name = cg, list(ranks), name

    def getBackendName(self):
        return "cocemu"

    def describe(self):
        return f"group '{self.group_name}' (world ranks {self.ranks})"

    def __repr__(self):
        return f"cocemu.torch.ProcessGroup('{self.group_name}', rank={self.rank()}, " \
               f"size={self.size()})"


class NonMemberGroup:
    """What new_group returns to a rank not in `ranks` (torch's GroupMember.NON_GROUP_MEMBER);
    a collective on it is an error naming the group."""

    def __init__(self, ranks, name):
        self.ranks, self.group_name = list(ranks), name

    def describe(self):
        return f"group '{self.group_name}' (world ranks {self.ranks})"

    def __repr__(self):
        return f"cocemu.torch.NonMemberGroup({self.ranks})"


class Work(_torch113.WorkBase):
    """torch.distributed's Work for a cocemu collective."""

    def __init__(self, st, cw, call, group, outputs=(), finish=None, inputs=()):
        super().__init__()
        self._st, self._cw, self._call, self._group = st, cw, call, group
        self._finish, self._done = finish, False
        self._regions = []
        if st.checked and st.numerics:  # until wait(): outputs untouchable, inputs unwritable
            for tensors, is_output in ((outputs, True), (inputs, False)):
                for t in tensors:
                    if t is not None and t.device.type == "cpu" and t.numel() > 0:
                        start = t.data_ptr()
                        self._regions.append(
                            (start, start + t.numel() * t.element_size(), self, is_output))
            st.pending.extend(self._regions)

    def describe(self):
        return f"{self._call} on {self._group.describe()}"

    def _complete(self):
        if self._done:
            return
        self._done = True
        if self._regions:
            self._st.pending = [p for p in self._st.pending if p[2] is not self]
        if self._finish is not None:
            self._finish()

    def wait(self, timeout=None):
        """The current stream waits for the collective (the host does not, in modeled time)."""
        if not self._done:
            self._cw.wait()
            if self._st.numerics:
                _state.wall_wait(self._cw.is_completed, self._st,
                                 f"{self.describe()}: Work.wait")
            self._complete()
        return True

    def synchronize(self):
        """The host blocks until the collective has finished (a modeled host wait)."""
        self._cw.synchronize()
        self._complete()

    def is_completed(self):
        return bool(self._cw.is_completed())

    def is_success(self):
        return self.is_completed()

    def __repr__(self):
        return f"cocemu.torch.Work({self.describe()})"


def _group(group, st, call):
    if group is None:
        return st.world
    if isinstance(group, NonMemberGroup):
        raise error(f"rank {st.id}: {call} on {group.describe()}, which rank {st.id} is not a "
                    f"member of (new_group gave this rank a non-member handle)")
    if isinstance(group, ProcessGroup) and group in st.groups:
        return group
    raise error(f"rank {st.id}: {call}: group {group!r} is not one of rank {st.id}'s cocemu "
                f"groups (use None, the world, or what new_group returned on this rank)")


def _array(t, st, call, what, shape=None):
    """A torch tensor as the array cocemu's collective takes, sharing its memory."""
    if not isinstance(t, torch.Tensor):
        raise error(f"rank {st.id}: {call}: {what} must be a torch.Tensor, got {type(t).__name__}")
    name = DTYPES.get(t.dtype)
    if name is None:
        allowed = ", ".join(str(d).replace("torch.", "") for d in DTYPES)
        raise error(f"rank {st.id}: {call}: {what} has dtype {t.dtype}; allowed: {allowed}")
    if not t.is_contiguous():
        raise error(f"rank {st.id}: {call}: {what} {tuple(t.shape)} is not contiguous "
                    f"(torch.distributed requires contiguous tensors; call .contiguous())")
    shape = tuple(shape) if shape is not None else (t.numel(),)
    if t.device.type == "meta" or not st.numerics:
        return cocemu.Tensor.shape_only(shape, name)
    if t.device.type != "cpu":
        raise error(f"rank {st.id}: {call}: {what} is on {t.device}; cocemu.torch tensors are "
                    f"CPU tensors (meta with numerics=False); use torch.npu.current_device()")
    t = t.detach().reshape(shape)
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def _op(op, st, call):
    if op is None:
        return "sum"
    name = _torch113.reduce_op_name(op)
    if name is None:
        raise error(f"rank {st.id}: {call}: reduce op {op!r} is not supported; allowed: SUM, AVG, "
                    f"MAX, MIN, PRODUCT")
    return name


def _group_rank(g, world_rank, st, call, what):
    if world_rank not in g.ranks:
        raise error(f"rank {st.id}: {call}: {what} {world_rank} is not in {g.describe()}")
    return g.ranks.index(world_rank)


def _result(st, cw, call, g, async_op, outputs=(), finish=None, inputs=()):
    w = Work(st, cw, call, g, outputs, finish, inputs)
    if async_op:
        return w
    w.wait()
    return None


# --- process groups ----------------------------------------------------------------------------

def make_world(st):
    st.world = ProcessGroup(st.rank.world, range(st.world_size), "world")
    st.groups[st.world] = st.world.ranks


def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1,
                       store=None, group_name="", pg_options=None):
    st = _state.current()
    if world_size not in (-1, None) and world_size != st.world_size:
        raise error(f"rank {st.id}: init_process_group: world_size {world_size} differs from the "
                    f"run's {st.world_size} (cocemu.torch.run initialises the world)")
    if rank not in (-1, None) and rank != st.id:
        raise error(f"rank {st.id}: init_process_group: rank {rank} given on rank {st.id}'s "
                    f"thread")


def is_initialized():
    return True


def destroy_process_group(group=None):
    pass


def _get_default_group():
    return _state.current().world


def get_rank(group=None):
    st = _state.current()
    if group is None:
        return st.id
    if isinstance(group, NonMemberGroup):
        return -1
    return _group(group, st, "get_rank").rank()


def get_world_size(group=None):
    st = _state.current()
    if isinstance(group, NonMemberGroup):
        return -1
    return _group(group, st, "get_world_size").size()


def get_backend(group=None):
    return "cocemu"


def get_global_rank(group, group_rank):
    st = _state.current()
    g = _group(group, st, "get_global_rank")
    if not 0 <= group_rank < len(g.ranks):
        raise error(f"rank {st.id}: get_global_rank: group rank {group_rank} out of range "
                    f"0..{len(g.ranks) - 1} of {g.describe()}")
    return g.ranks[group_rank]


_get_global_rank = get_global_rank


def get_process_group_ranks(group):
    return list(_group(group, _state.current(), "get_process_group_ranks").ranks)


def new_group(ranks=None, timeout=None, backend=None, pg_options=None):
    """Every rank calls it, in the same order, with the same ranks (as PyTorch requires)."""
    st = _state.current()
    ranks = list(range(st.world_size)) if ranks is None else list(ranks)
    for r in ranks:
        if not isinstance(r, int) or not 0 <= r < st.world_size:
            raise error(f"rank {st.id}: new_group: rank {r!r} out of range 0..{st.world_size - 1}")
    if len(set(ranks)) != len(ranks):
        raise error(f"rank {st.id}: new_group: ranks {ranks} repeat a rank")
    ranks = sorted(ranks)  # torch 1.13 orders a group's ranks by world rank
    cg = cocemu.new_group(st.rank, ranks)
    name = cg.name
    if not cg.is_member:
        return NonMemberGroup(ranks, name)
    g = ProcessGroup(cg, ranks, name)
    st.groups[g] = ranks
    return g


# --- collectives -------------------------------------------------------------------------------

def all_reduce(tensor, op=None, group=None, async_op=False):
    st = _state.current()
    g = _group(group, st, "all_reduce")
    cw = cocemu.all_reduce(g.cg, _array(tensor, st, "all_reduce", "tensor"),
                           op=_op(op, st, "all_reduce"), async_op=True)
    return _result(st, cw, "all_reduce", g, async_op, (tensor,))


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    return _gather_base(output_tensor, input_tensor, group, async_op, "all_gather_into_tensor")


def _all_gather_base(output_tensor, input_tensor, group=None, async_op=False):
    return _gather_base(output_tensor, input_tensor, group, async_op, "_all_gather_base")


def _gather_base(output, input, group, async_op, call):
    st = _state.current()
    g = _group(group, st, call)
    cw = cocemu.all_gather(g.cg, _array(output, st, call, "output"),
                           _array(input, st, call, "input"), async_op=True)
    return _result(st, cw, call, g, async_op, (output,), inputs=(input,))


def all_gather(tensor_list, tensor, group=None, async_op=False):
    st = _state.current()
    g = _group(group, st, "all_gather")
    if len(tensor_list) != g.size():
        raise error(f"rank {st.id}: all_gather: tensor_list has {len(tensor_list)} tensors; "
                    f"{g.describe()} has {g.size()} ranks")
    flat = torch.empty((g.size() * tensor.numel(),), dtype=tensor.dtype, device=tensor.device)
    cw = cocemu.all_gather(g.cg, _array(flat, st, "all_gather", "output"),
                           _array(tensor, st, "all_gather", "tensor"), async_op=True)

    def finish():
        for i, t in enumerate(tensor_list):
            t.copy_(flat[i * tensor.numel():(i + 1) * tensor.numel()].view(t.shape))
    return _result(st, cw, "all_gather", g, async_op, (flat, *tensor_list), finish)


def reduce_scatter_tensor(output, input, op=None, group=None, async_op=False):
    return _scatter_base(output, input, op, group, async_op, "reduce_scatter_tensor")


def _reduce_scatter_base(output, input, op=None, group=None, async_op=False):
    return _scatter_base(output, input, op, group, async_op, "_reduce_scatter_base")


def _scatter_base(output, input, op, group, async_op, call):
    st = _state.current()
    g = _group(group, st, call)
    cw = cocemu.reduce_scatter(g.cg, _array(output, st, call, "output"),
                               _array(input, st, call, "input"), op=_op(op, st, call),
                               async_op=True)
    return _result(st, cw, call, g, async_op, (output,), inputs=(input,))


def reduce_scatter(output, input_list, op=None, group=None, async_op=False):
    st = _state.current()
    g = _group(group, st, "reduce_scatter")
    if len(input_list) != g.size():
        raise error(f"rank {st.id}: reduce_scatter: input_list has {len(input_list)} tensors; "
                    f"{g.describe()} has {g.size()} ranks")
    flat = torch.cat([t.reshape(-1) for t in input_list])
    return _scatter_base(output, flat, op, group, async_op, "reduce_scatter")


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None,
                      group=None, async_op=False):
    st = _state.current()
    call = "all_to_all_single"
    g = _group(group, st, call)
    def rows(t):  # splits count rows of dimension 0: the tensor as [rows, the rest]
        if t.dim() == 0:
            return (1, 1)
        return (t.shape[0], t.numel() // t.shape[0] if t.shape[0] else 0)
    shape_in, shape_out = rows(input), rows(output)
    given = (output_split_sizes is not None and len(output_split_sizes) > 0,
             input_split_sizes is not None and len(input_split_sizes) > 0)
    splits = {}
    if any(given):
        n = g.size()
        outs = list(output_split_sizes) if given[0] else [shape_out[0] // n] * n
        ins = list(input_split_sizes) if given[1] else [shape_in[0] // n] * n
        splits = dict(output_splits=outs, input_splits=ins)
    cw = cocemu.all_to_all(g.cg, _array(output, st, call, "output", shape_out),
                           _array(input, st, call, "input", shape_in), async_op=True, **splits)
    return _result(st, cw, call, g, async_op, (output,), inputs=(input,))


def broadcast(tensor, src, group=None, async_op=False):
    st = _state.current()
    g = _group(group, st, "broadcast")
    root = _group_rank(g, src, st, "broadcast", "src")
    cw = cocemu.broadcast(g.cg, _array(tensor, st, "broadcast", "tensor"), root, async_op=True)
    return _result(st, cw, "broadcast", g, async_op, (tensor,))


def reduce(tensor, dst, op=None, group=None, async_op=False):
    st = _state.current()
    g = _group(group, st, "reduce")
    root = _group_rank(g, dst, st, "reduce", "dst")
    cw = cocemu.reduce(g.cg, _array(tensor, st, "reduce", "tensor"), root,
                       op=_op(op, st, "reduce"), async_op=True)
    return _result(st, cw, "reduce", g, async_op, (tensor,))


def gather(tensor, gather_list=None, dst=0, group=None, async_op=False):
    st = _state.current()
    g = _group(group, st, "gather")
    root = _group_rank(g, dst, st, "gather", "dst")
    flat, finish = None, None
    if g.rank() == root:
        if gather_list is None or len(gather_list) != g.size():
            raise error(f"rank {st.id}: gather: the destination needs a gather_list of "
                        f"{g.size()} tensors for {g.describe()}, got {gather_list!r:.60}")
        flat = torch.empty((g.size() * tensor.numel(),), dtype=tensor.dtype,
                           device=tensor.device)

        def finish():
            for i, t in enumerate(gather_list):
                t.copy_(flat[i * tensor.numel():(i + 1) * tensor.numel()].view(t.shape))
    elif gather_list:
        raise error(f"rank {st.id}: gather: gather_list must be empty on a non-destination rank")
    out = None if flat is None else _array(flat, st, "gather", "gather_list")
    cw = cocemu.gather(g.cg, out, _array(tensor, st, "gather", "tensor"), root, async_op=True)
    return _result(st, cw, "gather", g, async_op, (flat, *(gather_list or ())), finish,
                   inputs=(tensor,))


def scatter(tensor, scatter_list=None, src=0, group=None, async_op=False):
    st = _state.current()
    g = _group(group, st, "scatter")
    root = _group_rank(g, src, st, "scatter", "src")
    flat = None
    if g.rank() == root:
        if scatter_list is None or len(scatter_list) != g.size():
            raise error(f"rank {st.id}: scatter: the source needs a scatter_list of "
                        f"{g.size()} tensors for {g.describe()}")
        flat = torch.cat([t.reshape(-1) for t in scatter_list])
    elif scatter_list:
        raise error(f"rank {st.id}: scatter: scatter_list must be empty on a non-source rank")
    inp = None if flat is None else _array(flat, st, "scatter", "scatter_list")
    cw = cocemu.scatter(g.cg, _array(tensor, st, "scatter", "tensor"), inp, root, async_op=True)
    return _result(st, cw, "scatter", g, async_op, (tensor,))


def isend(tensor, dst, group=None, tag=0):
    st = _state.current()
    g = _group(group, st, "isend")
    peer = _group_rank(g, dst, st, "isend", "dst")
    return Work(st, cocemu.isend(g.cg, _array(tensor, st, "isend", "tensor"), peer, tag),
                f"isend to rank {dst}", g, inputs=(tensor,))


def irecv(tensor, src=None, group=None, tag=0):
    st = _state.current()
    if src is None:
        raise error(f"rank {st.id}: irecv: a receive from any source is not supported; give src")
    g = _group(group, st, "irecv")
    peer = _group_rank(g, src, st, "irecv", "src")
    return Work(st, cocemu.irecv(g.cg, _array(tensor, st, "irecv", "tensor"), peer, tag),
                f"irecv from rank {src}", g, (tensor,))


def send(tensor, dst, group=None, tag=0):
    isend(tensor, dst, group, tag).wait()


def recv(tensor, src=None, group=None, tag=0):
    irecv(tensor, src, group, tag).wait()
    return src


def batch_isend_irecv(p2p_op_list):
    st = _state.current()
    if not p2p_op_list:
        raise error(f"rank {st.id}: batch_isend_irecv: the list of P2POps is empty")
    groups = {id(p.group) for p in p2p_op_list}
    if len(groups) != 1:
        raise error(f"rank {st.id}: batch_isend_irecv: every P2POp must use one group")
    g = _group(p2p_op_list[0].group, st, "batch_isend_irecv")
    ops, outputs, inputs = [], [], []
    for p in p2p_op_list:
        kind = getattr(p.op, "__name__", "")
        if kind not in ("isend", "irecv"):
            raise error(f"rank {st.id}: batch_isend_irecv: op {p.op!r} is not isend or irecv")
        peer = _group_rank(g, p.peer, st, "batch_isend_irecv", "peer")
        arr = _array(p.tensor, st, "batch_isend_irecv", "tensor")
        ops.append(("send" if kind == "isend" else "recv", arr, peer, p.tag))
        (outputs if kind == "irecv" else inputs).append(p.tensor)
    w = Work(st, cocemu.batch_isend_irecv(g.cg, ops), "batch_isend_irecv", g, outputs,
             inputs=inputs)
    return [w] * len(p2p_op_list)


def barrier(group=None, async_op=False, device_ids=None):
    st = _state.current()
    g = _group(group, st, "barrier")
    return _result(st, cocemu.barrier(g.cg, async_op=True), "barrier", g, async_op)


IMPLS = {name: globals()[name] for name in _torch113.FUNCTIONS}


def dispatch(name, original):
    """torch.distributed's `name`: cocemu's on rank threads, torch's own elsewhere."""
    impl = IMPLS[name]

    def function(*args, **kwargs):
        if _state.current() is None:
            if original is None:
                raise AttributeError(f"torch.distributed.{name} is not in this torch")
            return original(*args, **kwargs)
        return impl(*args, **kwargs)
    function.__name__ = function.__qualname__ = name
    function.__doc__ = (original.__doc__ if original is not None else impl.__doc__)
    function.__wrapped__ = original
    return function


def install():
    _torch113.install_functions(dispatch)
    _torch113.register_backend(lambda *a, **k: _state.require("the cocemu backend").world)
