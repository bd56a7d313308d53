"""Modeled torch compute: a TorchDispatchMode that records each aten op a rank thread runs as an
op on that rank's current cocemu stream, priced by the run's device profile with the functions
the C++ layers use: `gemm_ns` for mm / addmm / bmm / baddbmm (matmul and linear reach these) from
their shapes, dtype and operand layout; `memory_ns` for every other op that touches data, from
the bytes it reads and writes; views, allocations and metadata free. The op itself runs on the
host thread at once (real numerics on CPU tensors; shapes only on meta tensors)."""
import torch

import cocemu

from . import _torch113
from ._state import error

aten = torch.ops.aten

GEMM_FLOAT = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
DTYPE_NAMES = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16",
               torch.bfloat16: "bf16"}

# Ops that allocate or only describe memory: no device work.
FREE = {
    aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
    aten.new_empty.default, aten.new_empty_strided.default, aten.lift_fresh.default,
    aten._local_scalar_dense.default, aten.resize_.default, aten.set_.source_Storage,
    aten.set_.source_Storage_storage_offset, aten.is_same_size.default,
    aten.is_nonzero.default, aten.equal.default,
    aten._unsafe_view.default,  # a view whose schema does not say so (reshape of a copy)
}
# (operand a index, operand b index, batched)
GEMMS = {
    aten.mm.default: (0, 1, False), aten.mm.out: (0, 1, False),
    aten.addmm.default: (1, 2, False), aten.addmm.out: (1, 2, False),
    aten.addmm_.default: (1, 2, False),
    aten.bmm.default: (0, 1, True), aten.bmm.out: (0, 1, True),
    aten.baddbmm.default: (1, 2, True), aten.baddbmm_.default: (1, 2, True),
}
# In-place ops whose `self` is written without being read.
WRITE_ONLY = {aten.copy_.default, aten.fill_.Scalar, aten.fill_.Tensor, aten.zero_.default,
              aten.normal_.default, aten.uniform_.default, aten.random_.default}

_kind_cache = {}  # func -> ("free" | "view" | "gemm" | "memory", written argument indices)


def _kind(func):
    k = _kind_cache.get(func)
    if k is None:
        written = _torch113.op_writes(func)
        names = [a.name for a in func._schema.arguments]
        idx = tuple(names.index(n) for n in written if n in names)
        if func in FREE:
            k = ("free", idx)
        elif func in GEMMS:
            k = ("gemm", idx)
        elif _torch113.op_is_view(func):
            k = ("view", idx)
        else:
            k = ("memory", idx)
        _kind_cache[func] = k
    return k


def _tensors(args, kwargs, written):
    """(tensor, whether the op writes it) for each tensor argument."""
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            yield a, i in written
        elif isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, torch.Tensor):
                    yield b, i in written
    for name, a in kwargs.items():
        if isinstance(a, torch.Tensor):
            yield a, name == "out"


def _nbytes(t):
    return t.numel() * t.element_size()


def _col_major(t):
    """A 2-D operand stored column-major (a transposed view of a row-major tensor)."""
    return (t.dim() == 2 and t.size(0) > 1 and t.size(1) > 1 and t.stride(0) == 1
            and t.stride(1) == t.size(0))


def _span(t):
    if t.is_contiguous():
        return t.numel() * t.element_size()
    extent = 1 + sum((s - 1) * abs(d) for s, d in zip(t.shape, t.stride()) if s > 0)
    return extent * t.element_size()


class Recorder(_torch113.TorchDispatchMode):
    """Prices one rank thread's aten ops on its current cocemu stream."""

    def __init__(self, st):
        super().__init__()
        self.st = st
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        st = self.st
        kind, written = _kind(func)
        if st.pending and kind != "view" and kind != "free":
            self._check_pending(func, args, kwargs, written)
        out = func(*args, **kwargs)
        if st.recording == 0 and kind != "view" and kind != "free":
            if kind == "gemm":
                self._gemm(func, args, kwargs, out)
            else:
                self._memory(func, args, kwargs, out, written)
        return out

    def _launch(self, name, ns, flops=None, nbytes=None):
        self.ops += 1
        self.st.rank.current_stream.launch(name, None, work_ns=ns, flops=flops, bytes=nbytes)

    def _memory(self, func, args, kwargs, out, written):
        Tensor = torch.Tensor
        nbytes = 0
        skip = written if func in WRITE_ONLY else ()
        for i, a in enumerate(args):
            if isinstance(a, Tensor):
                if i not in skip:
                    nbytes += a.numel() * a.element_size()
            elif isinstance(a, (list, tuple)):
                nbytes += sum(_nbytes(b) for b in a if isinstance(b, Tensor))
        if kwargs:
            o = kwargs.get("out")
            for a in kwargs.values():
                if isinstance(a, Tensor) and a is not o:
                    nbytes += _nbytes(a)
        if isinstance(out, Tensor):
            nbytes += out.numel() * out.element_size()
        elif isinstance(out, (list, tuple)):
            nbytes += sum(_nbytes(b) for b in out if isinstance(b, Tensor))
        if nbytes == 0:
            return
        cache = self.st.memory_cache
        ns = cache.get(nbytes)
        if ns is None:
            ns = cache[nbytes] = cocemu.memory_ns(self.st.profile, nbytes)
        self.ops += 1
        self.st.rank.current_stream.launch(func.overloadpacket.__name__, None, work_ns=ns,
                                           bytes=nbytes)

    def _gemm(self, func, args, kwargs, out):
        ia, ib, batched = GEMMS[func]
        a, b = args[ia], args[ib]
        if a.dtype not in GEMM_FLOAT:
            return self._memory(func, args, kwargs, out, ())
        batch = a.size(0) if batched else 1
        m, k, n = a.size(-2), a.size(-1), b.size(-1)
        ta = _col_major(a) if not batched else False
        tb = _col_major(b) if not batched else False
        key = (m, n, k, a.dtype, ta, tb)
        ns = self.st.gemm_cache.get(key)
        if ns is None:
            ns = cocemu.gemm_ns(self.st.profile, m, n, k, DTYPE_NAMES[a.dtype], ta, tb)
            self.st.gemm_cache[key] = ns
        # assumption: a batched GEMM costs its batches' GEMMs one after another.
        self._launch(f"{func.overloadpacket.__name__} {m}x{n}x{k}" +
                     (f" x{batch}" if batched else ""),
                     ns * batch, flops=2.0 * batch * m * n * k)

    def _check_pending(self, func, args, kwargs, written):
        """An op touching an async collective's output, or writing its input, before the
        collective's Work.wait() would race with it on a device."""
        for t, writes in _tensors(args, kwargs, written):
            if t.device.type != "cpu" or t.numel() == 0:
                continue
            s = t.data_ptr()
            e = s + _span(t)
            for start, end, work, is_output in self.st.pending:
                if s < end and start < e and (is_output or writes):
                    what = "reads the output" if is_output and not writes else \
                        "writes the output" if is_output else "writes the input"
                    raise error(
                        f"rank {self.st.id}: aten.{func.overloadpacket.__name__} {what} of "
                        f"{work.describe()} before its Work.wait() (on a device it would race "
                        f"with the collective); call wait() first", code="failed_precondition")
