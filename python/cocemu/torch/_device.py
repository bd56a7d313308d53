"""torch.npu / torch_npu (Ascend) and torch.cuda on cocemu rank threads (R-PY-7, R-PY-13): a rank
is a device of the emulated node. On a rank thread torch.cuda and torch.npu answer as that device
(`is_available()`, `device_count()` = the node's ranks, `current_device()` = the local rank), device
arguments naming cuda/npu ("cuda", "cuda:N", "npu:N", N, torch.device) and `.cuda()`, `.npu()`,
`.to("cuda")` give the rank's tensors, which live on the CPU (the meta device with numerics=False);
streams and events are the rank's cocemu streams and events, nvtx ranges are cocemu segments, and
the memory and RNG calls answer from the rank's modeled allocator (_memory) and generators (_rng).
Off rank threads torch.cuda answers as before; torch.npu and torch_npu exist only as this shim
(torch has neither)."""
import contextlib
import sys
import types

import torch
from torch.overrides import TorchFunctionMode

from . import _memory, _races, _rng, _state
from ._state import error, require

_ACCEL = ("cuda", "npu")


def local_rank_of(st):
    """The rank's index on its node (the profile's devices_per_node ranks a node)."""
    return st.id % max(int(st.profile.devices_per_node), 1)


def device_count_of(st):
    """Devices of the rank's node: the profile's node size, capped by the world size."""
    return min(max(int(st.profile.devices_per_node), 1), st.world_size)


class Stream:
    """torch.cuda.Stream / torch.npu.Stream over a cocemu stream of the calling rank."""

    def __new__(cls, device=None, priority=0, _cocemu=None, **kwargs):
        st = _state.current()
        if st is None and _cocemu is None:
            if _original_stream is None:
                raise error("torch.npu.Stream: called outside cocemu.torch.run")
            return _original_stream(device=device, priority=priority, **kwargs)
        if _cocemu is None and (isinstance(priority, bool) or not isinstance(priority, int)):
            raise error(f"rank {st.id}: torch.npu.Stream: priority={priority!r} ({type(priority).__name__}) is "
                        f"not an int; allowed an int, lower is higher priority (CUDA clamps it "
                        f"to torch.cuda.Stream.priority_range(); cocemu's streams ignore it)")
        self = object.__new__(cls)
        if _cocemu is None:
            st.stream_count = getattr(st, "stream_count", 0) + 1
            _cocemu = st.rank.new_stream(f"stream{st.stream_count}")
        self.cs = _cocemu
        self.device = torch.device("cuda", local_rank_of(st or _state.current()))
        self.priority = priority
        return self

    def wait_event(self, event):
        if not isinstance(event, Event):
            st = _state.current()
            raise error(f"rank {st.id if st else '?'}: Stream.wait_event: event={event!r} ({type(event).__name__}) is not a "
                        f"torch.npu/torch.cuda Event of this run")
        event._check()
        if event.ev is not None:
            self.cs.wait(event.ev)
            _race_wait(self.cs, event.snap)

    def wait_stream(self, stream):
        other = _cocemu_stream(stream)
        self.cs.wait_stream(other)
        races = _races_of_current()
        if races is not None:
            races.wait(self.cs, races.record(other))

    def record_event(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def query(self):
        return bool(self.cs.query())

    def synchronize(self):
        self.cs.synchronize()
        races = _races_of_current()
        if races is not None:
            races.host_wait(races.record(self.cs))

    def __eq__(self, other):
        return isinstance(other, Stream) and self.cs == other.cs

    def __hash__(self):
        return hash(self.cs)

    def __repr__(self):
        return f"cocemu.torch.Stream({self.cs!r})"


def _races_of_current():
    st = _state.current()
    return None if st is None else _races.of(st)


def _race_wait(cs, snap):
    races = _races_of_current()
    if races is not None and snap is not None:
        races.wait(cs, snap)


def _cocemu_stream(stream):
    if isinstance(stream, Stream):
        return stream.cs
    raise error(f"expected a cocemu.torch Stream (torch.npu/torch.cuda.Stream inside "
                f"cocemu.torch.run), got {type(stream).__name__}")


def _wrap(st, cs):
    s = st.streams.get(cs)
    if s is None:
        s = st.streams[cs] = Stream(_cocemu=cs)
    return s


class Event:
    """torch.cuda.Event / torch.npu.Event over a cocemu event."""

    def __new__(cls, enable_timing=False, blocking=False, interprocess=False, **kwargs):
        st = _state.current()
        if st is None:
            if _original_event is None:
                raise error("torch.npu.Event: called outside cocemu.torch.run")
            return _original_event(enable_timing=enable_timing, blocking=blocking,
                                   interprocess=interprocess, **kwargs)
        self = object.__new__(cls)
        self.ev, self.st, self.enable_timing = None, st, enable_timing
        self.snap = None  # the race checker's clock snapshot at record()
        return self

    def _check(self):
        if _state.current() is not self.st:
            raise error("torch.npu.Event: used on another rank's thread than the one that made it")

    def record(self, stream=None):
        self._check()
        cs = _cocemu_stream(stream) if stream is not None else self.st.rank.current_stream
        self.ev = cs.record()
        races = _races.of(self.st)
        self.snap = None if races is None else races.record(cs)

    def wait(self, stream=None):
        self._check()
        cs = _cocemu_stream(stream) if stream is not None else self.st.rank.current_stream
        if self.ev is not None:
            cs.wait(self.ev)
            _race_wait(cs, self.snap)

    def query(self):
        return self.ev is None or bool(self.ev.query())

    def synchronize(self):
        if self.ev is not None:
            self.ev.synchronize()
            self.st.pending = []
            races = _races.of(self.st)
            if races is not None and self.snap is not None:
                races.host_wait(self.snap)

    def elapsed_time(self, end_event):
        """Modeled ms from this event to `end_event`: known once the run has ended (the
        timeline is computed then), as on a GPU once both events completed."""
        if not isinstance(end_event, Event):
            raise error(f"Event.elapsed_time: expected a torch.cuda.Event of the run, got "
                        f"{type(end_event).__name__}")
        if not (self.enable_timing and end_event.enable_timing):
            raise error("Event.elapsed_time: both events need Event(enable_timing=True)")
        if self.ev is None or end_event.ev is None:
            raise error("Event.elapsed_time: both events must be recorded first")
        result = getattr(self.st, "cocemu_result", None)
        if result is None or getattr(end_event.st, "cocemu_result", None) is not result:
            raise error("Event.elapsed_time: modeled times exist once cocemu.torch.run has "
                        "returned (the timeline is computed then); return the events from fn and "
                        "call elapsed_time after the run, or result.elapsed_time(start, end)")
        return (_event_ns(result, end_event) - _event_ns(result, self)) / 1e6


def _event_ns(result, event):
    if event.ev.op is None:  # recorded on an empty stream: the timeline's start
        return 0
    return result.event_time_ns(event.ev)


def finish_run(result, states):
    """After a run: its events answer elapsed_time from `result` (cocemu.torch.run calls it)."""
    for st in states:
        if st is not None:
            st.cocemu_result = result


def current_device():
    """The device the rank's tensors live on: cpu, or meta with numerics=False (ct.device())."""
    st = require("cocemu.torch.device")
    return torch.device("cpu" if st.numerics else "meta")


def current_index():
    """torch.cuda.current_device(): the rank's local rank on its node."""
    return local_rank_of(require("torch.cuda.current_device"))


def set_device(device):
    st = require("torch.cuda.set_device")
    local = local_rank_of(st)
    index = _rng.device_index(_rng.of(st), device, "torch.cuda.set_device")
    if index != local:
        raise error(f"rank {st.id}: torch.cuda.set_device({device!r}): the rank is device "
                    f"{local} of its node (its local rank) and can select only {local} "
                    f"(or 'cuda:{local}')")


def device_count():
    return device_count_of(require("torch.cuda.device_count"))


def is_available():
    return _state.current() is not None


def get_device_name(device=None):
    st = require("torch.cuda.get_device_name")
    _rng.device_index(_rng.of(st), device, "torch.cuda.get_device_name")
    return f"cocemu {st.profile.name}"


def current_stream(device=None):
    st = require("torch.npu.current_stream")
    return _wrap(st, st.rank.current_stream)


def default_stream(device=None):
    st = require("torch.npu.default_stream")
    return _wrap(st, st.rank.compute_stream)


@contextlib.contextmanager
def stream(s):
    """Makes `s` the current stream inside the block (torch.cuda.stream)."""
    st = require("torch.npu.stream")
    if s is None:
        yield
        return
    with st.rank.stream(_cocemu_stream(s)):
        yield s


def synchronize(device=None):
    st = require("torch.npu.synchronize")
    st.rank.synchronize()
    st.pending = []
    races = _races.of(st)
    if races is not None:
        races.synchronize_all()


def set_stream(s):
    require("torch.npu.set_stream").rank.set_current_stream(_cocemu_stream(s))


class device:
    """torch.cuda.device(i) on a rank thread: a context naming the rank's own device (checked as
    set_device is); -1 and None select nothing."""

    def __init__(self, device):
        if device is not None and device != -1:
            set_device(device)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


API = dict(Stream=Stream, Event=Event, current_device=current_index, set_device=set_device,
           device_count=device_count, is_available=is_available, current_stream=current_stream,
           default_stream=default_stream, stream=stream, synchronize=synchronize,
           set_stream=set_stream, get_device_name=get_device_name, device=device,
           **_memory.API)

_original_stream = getattr(torch.cuda, "Stream", None)
_original_event = getattr(torch.cuda, "Event", None)


# Device arguments on rank threads -----------------------------------------------------------

class DeviceMode(TorchFunctionMode):
    """Pushed on each rank thread (function-mode stacks are per thread): rewrites device
    arguments naming cuda/npu to the device the rank's tensors live on, marks what the call
    allocates as device memory (st.alloc_device, read by the recording dispatch mode), and gives
    `.cuda()`, `.to("cuda")`, `.cpu()` torch's copy semantics between host and device tensors."""

    def __init__(self, st):
        super().__init__()
        self.st = st
        self.target = torch.device("cpu" if st.numerics else "meta")
        self.rng = _rng.of(st)
        self.mem = _memory.of(st)
        st.alloc_device = None

    def __enter__(self):
        self.st.cocemu_device_mode = self
        return super().__enter__()

    def __exit__(self, exc_type, exc_value, traceback):
        self.st.cocemu_device_mode = None
        return super().__exit__(exc_type, exc_value, traceback)

    def active(self):
        """Whether the mode is on the thread's stack (torch pops it while a call it intercepted
        runs, e.g. during `loss.backward()`)."""
        return any(torch._C._get_function_stack_at(i) is self
                   for i in range(torch._C._len_torch_function_stack()))

    def map(self, d, call):
        """(the device to give torch, True if `d` names the rank's device, False for the host,
        None when it names neither)."""
        if isinstance(d, str):
            kind = d.partition(":")[0]
            if kind in _ACCEL:
                _rng.device_index(self.rng, d, call)
                return self.target, True
            return d, (True if kind == "meta" else False if kind == "cpu" else None)
        if isinstance(d, torch.device):
            if d.type in _ACCEL:
                _rng.device_index(self.rng, d, call)
                return self.target, True
            return d, (True if d.type == "meta" else False if d.type == "cpu" else None)
        if isinstance(d, int) and not isinstance(d, bool):
            _rng.device_index(self.rng, d, call)
            return self.target, True
        return d, None

    def call(self, func, args, kwargs, dev):
        st = self.st
        previous = st.alloc_device
        st.alloc_device = dev
        try:
            return func(*args, **kwargs)
        finally:
            st.alloc_device = previous

    def __torch_function__(self, func, types, args=(), kwargs=None):
        special = _SPECIAL.get(func)
        if special is not None:
            return special(self, func, args, kwargs or {})
        if kwargs:
            d = kwargs.get("device")
            if d is not None:
                d, dev = self.map(d, _name(func))
                kwargs = dict(kwargs)
                kwargs["device"] = d
                return self.call(func, args, kwargs, dev)
            return func(*args, **kwargs)
        return func(*args)


def _name(func):
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
    if name.startswith("_VariableFunctionsClass."):
        return "torch." + name.partition(".")[2]
    return name.replace("TensorBase.", "Tensor.")


def _tensor_to(mode, func, args, kwargs):
    t = args[0]
    d, positional = kwargs.get("device"), False
    if d is None and len(args) > 1 and isinstance(args[1], (str, torch.device, int)) and \
            not isinstance(args[1], bool):
        d, positional = args[1], True
    if d is None:
        other = args[1] if len(args) > 1 else kwargs.get("other")
        if isinstance(other, torch.Tensor) and not t.is_meta and not other.is_meta:
            dev = mode.mem.is_device(other)  # to(other): other's device and dtype
            if dev != mode.mem.is_device(t) and len(args) <= 3:
                return mode.call(func, args, dict(kwargs, copy=True), dev)
        return func(*args, **kwargs)
    mapped, dev = mode.map(d, "Tensor.to")
    if positional:
        args = (t, mapped) + tuple(args[2:])
    else:
        kwargs = dict(kwargs)
        kwargs["device"] = mapped
    # Host <-> device on the CPU-backed device is a copy, as on a GPU.
    if dev is not None and not t.is_meta and mode.mem.is_device(t) != dev and len(args) <= 4:
        kwargs = dict(kwargs)
        kwargs["copy"] = True
    return mode.call(func, args, kwargs, dev)


def _tensor_cuda(mode, func, args, kwargs):
    t = args[0]
    d = args[1] if len(args) > 1 else kwargs.get("device")
    if d is not None and mode.map(d, "Tensor.cuda")[1] is not True:
        raise error(f"rank {mode.st.id}: Tensor.cuda({d!r}): not a cuda/npu device")
    if mode.mem.is_device(t):
        return t  # already on the rank's device
    non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
    memory_format = kwargs.get("memory_format", torch.preserve_format)
    return mode.call(torch.Tensor.to, (t, mode.target),
                     dict(non_blocking=non_blocking, copy=True, memory_format=memory_format),
                     True)


def _tensor_cpu(mode, func, args, kwargs):
    t = args[0]
    if t.is_meta or not mode.mem.is_device(t):
        return func(*args, **kwargs)
    memory_format = kwargs.get("memory_format", torch.preserve_format)
    return mode.call(torch.Tensor.to, (t, "cpu"), dict(copy=True, memory_format=memory_format),
                     False)


def _tensor_get_device(mode, func, args, kwargs):
    return local_rank_of(mode.st) if mode.mem.is_device(args[0]) else func(*args, **kwargs)


_SPECIAL = {torch.Tensor.to: _tensor_to, torch.Tensor.cuda: _tensor_cuda,
            torch.Tensor.cpu: _tensor_cpu, torch.Tensor.get_device: _tensor_get_device}


def _tensor_npu(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
    """torch_npu's Tensor.npu(): the rank's device tensor (rank threads only)."""
    require("Tensor.npu")
    return self.cuda(device, non_blocking=non_blocking, memory_format=memory_format)


def _module_npu(self, device=None):
    """torch_npu's Module.npu(): the module's parameters and buffers on the rank's device."""
    require("Module.npu")
    return self._apply(lambda t: t.npu(device))


def _with_device_mode(original):
    """A custom autograd Function's backward runs inside `loss.backward()`, a call the device
    mode intercepted (and so left); the mode is pushed again around it on rank threads."""
    def apply(self, *args):
        st = _state.current()
        mode = None if st is None else getattr(st, "cocemu_device_mode", None)
        if mode is None or mode.active():
            return original(self, *args)
        torch._C._push_on_torch_function_stack(mode)
        try:
            return original(self, *args)
        finally:
            torch._C._pop_torch_function_stack()
    apply.__wrapped__ = original
    return apply


def _record_stream(original):
    def record_stream(self, stream):
        """On a rank thread: `stream` must be a cocemu stream; the modeled allocator frees a
        tensor's memory when the tensor dies (no block reuse is modeled), so nothing is kept."""
        st = _state.current()
        if st is None:
            return original(self, stream)
        _cocemu_stream(stream)
        if not isinstance(self, torch.Tensor):
            raise error(f"rank {st.id}: Tensor.record_stream: called on a "
                        f"{type(self).__name__}")
    record_stream.__wrapped__ = original
    return record_stream


# torch.cuda.nvtx ranges as cocemu segments -------------------------------------------------

def _nvtx_stack(st):
    stack = getattr(st, "cocemu_nvtx", None)
    if stack is None:
        stack = st.cocemu_nvtx = []
    return stack


def nvtx_range_push(msg):
    """Starts a segment named `msg` (the summary's and trace's program region); returns its
    zero-based depth, as NVTX does."""
    st = require("torch.cuda.nvtx.range_push")
    stack = _nvtx_stack(st)
    stack.append(st.rank.current_segment)
    st.rank.set_segment(str(msg))
    return len(stack) - 1


def nvtx_range_pop():
    """Ends the innermost range (the enclosing one's segment resumes); -1 when none is open,
    as NVTX answers."""
    st = require("torch.cuda.nvtx.range_pop")
    stack = _nvtx_stack(st)
    if not stack:
        return -1
    st.rank.set_segment(stack.pop())
    return len(stack)


@contextlib.contextmanager
def nvtx_range(msg, *args, **kwargs):
    nvtx_range_push(msg.format(*args, **kwargs))
    try:
        yield
    finally:
        nvtx_range_pop()


def nvtx_mark(msg):
    require("torch.cuda.nvtx.mark")


NVTX = dict(range_push=nvtx_range_push, range_pop=nvtx_range_pop, range=nvtx_range,
            mark=nvtx_mark)


def _npu_module(name):
    m = types.ModuleType(name, "cocemu's torch.npu: the NPU API on cocemu rank threads")
    for k, v in API.items():
        setattr(m, k, v)
    return m


def _unmodeled_fused_op(name):
    def op(*args, **kwargs):
        raise error(f"torch_npu.{name}: this fused NPU operator is not modeled by cocemu (it "
                    f"provides torch.npu streams/events and mindspeed coc_ops); write it with "
                    f"torch ops or ask for it to be modeled", code="unimplemented")
    op.__name__ = name
    return op


def _torch_npu_module(npu):
    m = types.ModuleType("torch_npu", "cocemu's torch_npu: the device API on rank threads; fused "
                                      "operators it does not model raise a clear error")
    m.npu = npu
    m.__version__ = "cocemu"

    def __getattr__(name):
        if name.startswith("npu_") or name.startswith("_npu"):
            return _unmodeled_fused_op(name)
        raise AttributeError(f"torch_npu.{name} is not provided by cocemu's torch_npu shim")
    m.__getattr__ = __getattr__
    return m


_installed = False


def install():
    """Makes torch.npu, torch_npu and torch.cuda's device calls resolve to cocemu on rank threads
    (torch.cuda's answer as before off them)."""
    global _installed
    if _installed:
        return
    npu = _npu_module("torch.npu")
    if not hasattr(torch, "npu"):
        torch.npu = npu
        sys.modules.setdefault("torch.npu", npu)
    sys.modules.setdefault("torch_npu", _torch_npu_module(npu))
    for name, impl in API.items():
        original = getattr(torch.cuda, name, None)
        if name in ("Stream", "Event"):
            setattr(torch.cuda, name, impl)  # their __new__ falls through off rank threads
            continue
        setattr(torch.cuda, name, _on_ranks(impl, original, name))
    import torch.cuda.nvtx as nvtx
    for name, impl in NVTX.items():
        setattr(nvtx, name, _on_ranks(impl, getattr(nvtx, name, None), name))
    npu.nvtx = types.SimpleNamespace(**NVTX)
    torch.Tensor.record_stream = _record_stream(torch.Tensor.record_stream)
    backward = torch.autograd.function.BackwardCFunction
    backward.apply = _with_device_mode(backward.apply)
    backward.apply_boxed = _with_device_mode(backward.apply_boxed)
    if not hasattr(torch.Tensor, "npu"):
        torch.Tensor.npu = _tensor_npu
    if not hasattr(torch.nn.Module, "npu"):
        torch.nn.Module.npu = _module_npu
    _rng.install(npu)
    _installed = True


def _on_ranks(impl, original, name):
    """`impl` on rank threads, torch's `original` elsewhere."""
    def function(*args, **kwargs):
        if _state.current() is None and original is not None:
            return original(*args, **kwargs)
        return impl(*args, **kwargs)
    function.__name__ = name
    function.__wrapped__ = original
    return function
