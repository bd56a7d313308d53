"""Modeled torch compute: a TorchDispatchMode that records each aten op a rank thread runs as an
op on that rank's current cocemu stream, priced by the run's device profile with the functions
the C++ layers use: `gemm_ns` for mm / addmm / bmm / baddbmm (matmul and linear reach these) from
their shapes, dtype and operand layout; `memory_ns` for every other op that touches data, from
the bytes it reads and writes; views, allocations and metadata free. The op itself runs on the
host thread at once (real numerics on CPU tensors; shapes only on meta tensors).

The same mode keeps the rank's modeled device memory (cocemu.torch._memory: every storage an op
creates) and draws each random op from the rank's generators (cocemu.torch._rng); entering it also
pushes the device mode (cocemu.torch._device.DeviceMode) that maps "cuda"/"npu" to the rank."""
import torch

import cocemu

from . import _device, _memory, _races, _rng, _torch2
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

# Random ops that take no generator argument in any overload yet draw from the default one.
RANDOM_WITHOUT_GENERATOR = {"native_dropout"}

# func -> ("free" | "view" | "gemm" | "memory", written argument indices, random: 0 = no, 1 = draws
# from the default generator, 2 = takes a `generator` argument)
_kind_cache = {}


def _random(func):
    if any(a.name == "generator" for a in func._schema.arguments):
        return 2
    packet = func.overloadpacket
    if packet.__name__ in RANDOM_WITHOUT_GENERATOR:
        return 1
    for name in packet.overloads():
        if any(a.name == "generator" for a in getattr(packet, name)._schema.arguments):
            return 1
    return 0


def _kind(func):
    k = _kind_cache.get(func)
    if k is None:
        written = _torch2.op_writes(func)
        names = [a.name for a in func._schema.arguments]
        idx = tuple(names.index(n) for n in written if n in names)
        if func in FREE:
            kind = "free"
        elif func in GEMMS:
            kind = "gemm"
        elif _torch2.op_is_view(func):
            kind = "view"
        else:
            kind = "memory"
        k = _kind_cache[func] = (kind, idx, _random(func))
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


def _storage_key(t):
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):  # sparse, nested
        return None


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


class Recorder(_torch2.TorchDispatchMode):
    """Prices one rank thread's aten ops on its current cocemu stream (`record`), keeps its
    modeled device memory and random state; entering it pushes the rank's DeviceMode first."""

    def __init__(self, st, record=True):
        super().__init__()
        self.st = st
        self.record = record
        self.ops = 0
        self.mem = _memory.of(st)
        self.rng = _rng.of(st)
        self.races = _races.of(st)  # None unless checked
        self.device_mode = None
        st.alloc_device = None

    @classmethod
    def _should_skip_dynamo(cls):
        # torch 2.x wraps a mode's __torch_dispatch__ in a dynamo-disabling frame unless the mode
        # opts out (2 us an op); cocemu.torch does not run torch.compile on rank threads.
        return False

    def __enter__(self):
        self.device_mode = _device.DeviceMode(self.st)
        self.device_mode.__enter__()
        try:
            return super().__enter__()
        except BaseException:
            self.device_mode.__exit__(None, None, None)
            raise

    def __exit__(self, exc_type, exc_value, traceback):
        try:
            return super().__exit__(exc_type, exc_value, traceback)
        finally:
            self.device_mode.__exit__(exc_type, exc_value, traceback)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        st = self.st
        kind, written, random = _kind(func)
        if st.pending and kind != "view" and kind != "free":
            self._check_pending(func, args, kwargs, written)
        if random and kwargs.get("generator") is None:
            out = _rng.call_with(func, args, kwargs, self._generator(args, kwargs), random == 2)
        else:
            out = func(*args, **kwargs)
        if not written and kind != "view":
            self._track(func, args, kwargs, out)
        if self.races is not None and st.recording == 0 and kind != "view" and kind != "free":
            self._access(func, args, kwargs, out, written)
        if self.record and st.recording == 0 and kind != "view" and kind != "free":
            if kind == "gemm":
                self._gemm(func, args, kwargs, out)
            else:
                self._memory(func, args, kwargs, out, written)
        return out

    def _on_device(self, args, kwargs):
        """Whether an op's results are the rank's device tensors: it was called with a device
        argument (DeviceMode), or one of its tensors is a device tensor (a meta tensor, or one
        whose storage the allocator holds)."""
        dev = self.st.alloc_device
        if dev is not None:
            return dev
        live = self.mem.live
        Tensor = torch.Tensor
        for a in args:
            if isinstance(a, Tensor):
                if a.is_meta or _storage_key(a) in live:
                    return True
            elif isinstance(a, (list, tuple)):
                for b in a:
                    if isinstance(b, Tensor) and (b.is_meta or _storage_key(b) in live):
                        return True
        for a in kwargs.values():
            if isinstance(a, Tensor) and (a.is_meta or _storage_key(a) in live):
                return True
        return False

    def _generator(self, args, kwargs):
        return self.rng.device() if self._on_device(args, kwargs) else self.rng.cpu

    def _track(self, func, args, kwargs, out):
        """Registers the device storages `out` brings into being with the rank's allocator
        (host storages are not tracked: a storage it does not hold is a host one)."""
        Tensor = torch.Tensor
        if isinstance(out, Tensor):
            outs = (out,)
        elif isinstance(out, (list, tuple)):
            outs = [o for o in out if isinstance(o, Tensor)]
        else:
            return
        live = self.mem.live
        dev = None
        for t in outs:
            try:
                storage = t.untyped_storage()
            except (RuntimeError, NotImplementedError):  # sparse, nested: not modeled
                continue
            key = storage._cdata
            if key in live:
                continue
            if dev is None:
                dev = t.is_meta or self._on_device(args, kwargs)
                if not dev:
                    return
            self.mem.add(storage, key, t, func.overloadpacket.__name__)

    def _access(self, func, args, kwargs, out, written):
        """Stream-race check (checked mode): the op reads its inputs and writes its written
        arguments and new outputs on the current stream."""
        reads, writes, fresh = [], [], ()
        for t, w in _tensors(args, kwargs, written):
            (writes if w else reads).append(t)
        if not written:
            if isinstance(out, torch.Tensor):
                fresh = (out,)
            elif isinstance(out, (list, tuple)):
                fresh = [o for o in out if isinstance(o, torch.Tensor)]
        self.races.access(self.st.rank.current_stream, func.overloadpacket.__name__, reads,
                          writes, fresh)

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
                    nbytes += a.nbytes
            elif isinstance(a, (list, tuple)):
                nbytes += sum(_nbytes(b) for b in a if isinstance(b, Tensor))
        if kwargs:
            o = kwargs.get("out")
            for a in kwargs.values():
                if isinstance(a, Tensor) and a is not o:
                    nbytes += _nbytes(a)
        if isinstance(out, Tensor):
            nbytes += out.nbytes
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


def finish_run(result, states):
    """After cocemu.torch.run: the run's events answer Event.elapsed_time from `result`."""
    _device.finish_run(result, states)


def peak_memory_bytes(st):
    """The rank's peak of modeled device memory during the run (for RunResult)."""
    return _memory.peak(st)
