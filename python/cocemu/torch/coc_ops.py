"""MindSpeed's fused compute-communication kernels (`mindspeed.ops.lcal_functional.coc_ops`) over
cocemu's tile-pipelined fused kernels, priced as the C++ ones. `install()` (ct.install_mindspeed_
shims) puts them under the module name MindSpeed imports. Operands are 2-D float16/bfloat16;
`input2` is [k, n], or [n, k] read as transposed when its first dimension is not k (Ascend's
rule); `bias` is [1, n] or None; outputs are preallocated. The TP group is the caller's world
group unless `set_comm_config` names another (a config whose `comm_domain` is a group
new_group returned)."""
import sys
import types

import torch

import cocemu

from . import _dist, _state
from ._state import error, require

DTYPES = (torch.float16, torch.bfloat16)


class CoCConfig:
    """MindSpeed's CoCConfig; `comm_domain` is the cocemu.torch group the kernels run on."""

    def __init__(self, rank_id, rank_size, comm_domain):
        self.rank_id, self.rank_size, self.comm_domain = rank_id, rank_size, comm_domain


class CoCOperations:
    def set_comm_config(self, config):
        st = require("coc_ops.set_comm_config")
        g = _dist._group(config.comm_domain, st, "coc_ops.set_comm_config")
        if config.rank_size != g.size() or config.rank_id != g.rank():
            raise error(f"rank {st.id}: coc_ops.set_comm_config: rank_id {config.rank_id} / "
                        f"rank_size {config.rank_size} differ from {g.describe()} (rank "
                        f"{g.rank()} of {g.size()})")
        st.coc_group = g

    def _prepare(self, call, input1, input2, output, bias):
        st = require(f"coc_ops.{call}")
        g = getattr(st, "coc_group", None) or st.world
        for what, t in (("input1", input1), ("input2", input2), ("output", output)):
            if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.dtype not in DTYPES:
                raise error(f"rank {st.id}: coc_ops.{call}: {what} must be a 2-D float16 or "
                            f"bfloat16 tensor, got "
                            f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")
            if t.dtype != input1.dtype:
                raise error(f"rank {st.id}: coc_ops.{call}: {what} is {t.dtype}, input1 "
                            f"{input1.dtype}")
        k = input1.size(1)
        trans = input2.size(0) != k
        if trans and input2.size(1) != k:
            raise error(f"rank {st.id}: coc_ops.{call}: input2 {tuple(input2.shape)} is neither "
                        f"[k, n] nor [n, k] for input1 {tuple(input1.shape)} (k = {k})")
        n = input2.size(0) if trans else input2.size(1)
        b = None
        if bias is not None:
            if tuple(bias.shape) not in ((1, n), (n,)) or bias.dtype != input1.dtype:
                raise error(f"rank {st.id}: coc_ops.{call}: bias {tuple(bias.shape)} "
                            f"{bias.dtype} must be [1, {n}] of {input1.dtype}")
            b = _dist._array(bias.contiguous(), st, call, "bias", (n,))
        return st, g, trans, n, b

    def _finish(self, st, call):
        if st.numerics:  # the host reads the outputs next: wait in wall time, record nothing
            st.api.wait_unmodeled(st.rank.current_stream.record())

    def _options(self, st):
        return dict(deterministic=st.rank.deterministic)

    def matmul_all_reduce(self, input1, input2, output, bias=None):
        st, g, trans, n, b = self._prepare("matmul_all_reduce", input1, input2, output, bias)
        w = input2
        if not trans:  # cocemu's kernel reads the weight as [n, k]
            with _unmodeled(st):
                w = input2.t().contiguous()
        st.api.matmul_all_reduce(g.cg, _arr(input1, st), _arr(w, st),
                                 _arr(output, st, "output"), bias=b, **self._options(st))
        self._finish(st, "matmul_all_reduce")
        return output

    def matmul_reduce_scatter(self, input1, input2, output, bias=None):
        st, g, trans, n, b = self._prepare("matmul_reduce_scatter", input1, input2, output, bias)
        st.api.matmul_reduce_scatter(g.cg, _arr(input1, st), _arr(input2.contiguous(), st),
                                     _arr(output, st, "output"), trans_w=trans, bias=b,
                                     **self._options(st))
        self._finish(st, "matmul_reduce_scatter")
        return output

    def all_gather_matmul(self, input1, input2, output, bias=None):
        st, g, trans, n, b = self._prepare("all_gather_matmul", input1, input2, output, bias)
        st.api.all_gather_matmul(g.cg, _arr(input1, st), _arr(input2.contiguous(), st),
                                 _arr(output, st, "output"), trans_w=trans, bias=b,
                                 **self._options(st))
        self._finish(st, "all_gather_matmul")
        return output

    def all_gather_matmul_v2(self, input1, input2, output, comm_output, bias=None):
        st, g, trans, n, b = self._prepare("all_gather_matmul_v2", input1, input2, output, bias)
        st.api.all_gather_matmul(g.cg, _arr(input1, st), _arr(input2.contiguous(), st),
                                 _arr(output, st, "output"), trans_w=trans, bias=b,
                                 gathered=_arr(comm_output, st, "comm_output"),
                                 **self._options(st))
        self._finish(st, "all_gather_matmul_v2")
        return output, comm_output


class _unmodeled:
    def __init__(self, st):
        self.st = st

    def __enter__(self):
        self.st.recording += 1

    def __exit__(self, *exc):
        self.st.recording -= 1


def _arr(t, st, what="input"):
    if not t.is_contiguous():
        raise error(f"rank {st.id}: coc_ops: {what} {tuple(t.shape)} must be contiguous")
    return _dist._array(t, st, "coc_ops", what, tuple(t.shape))


coc_ops = CoCOperations()


def install():
    """`from mindspeed.ops.lcal_functional import coc_ops` gives these kernels."""
    names = ("mindspeed", "mindspeed.ops", "mindspeed.ops.lcal_functional")
    for name in names:
        if name not in sys.modules:
            sys.modules[name] = types.ModuleType(name, "cocemu's MindSpeed shim")
    lf = sys.modules["mindspeed.ops.lcal_functional"]
    lf.coc_ops, lf.CoCOperations, lf.CoCConfig = coc_ops, CoCOperations, CoCConfig
    sys.modules["mindspeed"].ops = sys.modules["mindspeed.ops"]
    sys.modules["mindspeed.ops"].lcal_functional = lf
