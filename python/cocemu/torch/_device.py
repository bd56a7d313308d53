"""torch.npu / torch_npu (Ascend) and torch.cuda on cocemu rank threads: the device is the CPU
(the meta device with numerics=False), streams and events are the rank's cocemu streams and
events. Off rank threads torch.cuda answers as before; torch.npu and torch_npu exist only as this
shim (Debian's torch has neither)."""
import contextlib
import sys
import types

import torch

from . import _state
from ._state import error, require


class Stream:
    """torch.cuda.Stream / torch.npu.Stream over a cocemu stream of the calling rank."""

    def __new__(cls, device=None, priority=0, _cocemu=None, **kwargs):
        st = _state.current()
        if st is None and _cocemu is None:
            if _original_stream is None:
                raise error("torch.npu.Stream: called outside cocemu.torch.run")
            return _original_stream(device=device, priority=priority, **kwargs)
        self = object.__new__(cls)
        if _cocemu is None:
            st.stream_count = getattr(st, "stream_count", 0) + 1
            _cocemu = st.rank.new_stream(f"stream{st.stream_count}")
        self.cs = _cocemu
        self.device = current_device()
        self.priority = priority
        return self

    def wait_event(self, event):
        event._check()
        if event.ev is not None:
            self.cs.wait(event.ev)

    def wait_stream(self, stream):
        self.cs.wait_stream(_cocemu_stream(stream))

    def record_event(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def query(self):
        return bool(self.cs.query())

    def synchronize(self):
        self.cs.synchronize()

    def __eq__(self, other):
        return isinstance(other, Stream) and self.cs == other.cs

    def __hash__(self):
        return hash(self.cs)

    def __repr__(self):
        return f"cocemu.torch.Stream({self.cs!r})"


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
        return self

    def _check(self):
        if _state.current() is not self.st:
            raise error("torch.npu.Event: used on another rank's thread than the one that made it")

    def record(self, stream=None):
        self._check()
        cs = _cocemu_stream(stream) if stream is not None else self.st.rank.current_stream
        self.ev = cs.record()

    def wait(self, stream=None):
        self._check()
        cs = _cocemu_stream(stream) if stream is not None else self.st.rank.current_stream
        if self.ev is not None:
            cs.wait(self.ev)

    def query(self):
        return self.ev is None or bool(self.ev.query())

    def synchronize(self):
        if self.ev is not None:
            self.ev.synchronize()
            self.st.pending = []

    def elapsed_time(self, end_event):
        """Modeled ms: known once the run has ended (the timeline is computed then)."""
        raise error("Event.elapsed_time: modeled times exist once cocemu.torch.run has returned; "
                    "return the events from fn and call result.elapsed_time(start, end)")


def current_device():
    st = require("torch.npu.current_device")
    return torch.device("cpu" if st.numerics else "meta")


def set_device(device):
    require("torch.npu.set_device")


def device_count():
    return require("torch.npu.device_count").world_size


def is_available():
    return _state.current() is not None


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


def set_stream(s):
    require("torch.npu.set_stream").rank.set_current_stream(_cocemu_stream(s))


API = dict(Stream=Stream, Event=Event, current_device=current_device, set_device=set_device,
           device_count=device_count, is_available=is_available, current_stream=current_stream,
           default_stream=default_stream, stream=stream, synchronize=synchronize,
           set_stream=set_stream)

_original_stream = getattr(torch.cuda, "Stream", None)
_original_event = getattr(torch.cuda, "Event", None)


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
        if name in ("is_available", "device_count"):
            continue  # torch itself asks these of torch.cuda; they keep torch's answers
        original = getattr(torch.cuda, name, None)
        if name in ("Stream", "Event"):
            setattr(torch.cuda, name, impl)  # their __new__ falls through off rank threads
            continue

        def function(*args, _impl=impl, _original=original, **kwargs):
            if _state.current() is None and _original is not None:
                return _original(*args, **kwargs)
            return _impl(*args, **kwargs)
        function.__name__ = name
        function.__wrapped__ = original
        setattr(torch.cuda, name, function)
    _installed = True
