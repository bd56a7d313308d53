"""A rank process's side of its hub connection: the cocemu API, served by the hub.

`Connection.api` answers what the `cocemu` module answers on a rank thread (collectives, p2p,
groups, fused kernels, `Tensor.shape_only`); `Connection.rank` what a `cocemu.Rank` answers. The
objects they return (groups, streams, events, works) stay in the hub and are used through
`Remote` proxies. Arrays are copied into the rank's arena when a call is issued and their
outputs copied back when the hub reports the call complete (see arena.py). Calls that only
enqueue work on a stream and return nothing (`Stream.launch`, `set_current_stream`,
`set_segment`) do not wait for the hub's answer; an error they raise is reported by the next call.
"""
import threading
import weakref

import numpy as np

import cocemu

from . import wire
from .arena import Arena

# The arguments a call writes (positions and keywords); other arrays are only read. A call not
# listed that takes arrays has all of them copied back.
OUTPUTS = {
    "all_reduce": (1, "tensor", "output"), "all_gather": (1, "output"),
    "reduce_scatter": (1, "output"), "all_to_all": (1, "output"), "broadcast": (1, "tensor"),
    "reduce": (1, "tensor"), "gather": (1, "output"), "scatter": (1, "output"),
    "irecv": (1, "tensor"), "recv": (1, "tensor"),
    "matmul_all_reduce": (3, "out"), "matmul_reduce_scatter": (3, "out"),
    "all_gather_matmul": (3, "out", "gathered"), "isend": (), "send": (),
    "batch_isend_irecv": (),  # its receives: ("recv", array, peer, tag) entries of `ops`
}
# Calls that return nothing the rank uses (or always the same value): sent without waiting for
# the hub's answer; an error they raise is reported by the next call.
ONEWAY = {"launch": None, "set_current_stream": None, "set_segment": None, "wait": None,
          "wait_stream": None}
ONEWAY_RESULT = {("Work", "wait"): True}
# Collectives issued with async_op=True (and p2p): sent without waiting; the rank names the Work
# they return itself (a negative handle), so a synchronous torch call costs one round trip (its
# wait). An error they raise is reported by the next call, with the collective's name.
PIPELINED = frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
                       "reduce", "gather", "scatter", "barrier", "isend", "irecv",
                       "batch_isend_irecv"})
ALWAYS_WORK = frozenset({"isend", "irecv", "batch_isend_irecv"})
SHARE_BYTES = 256 << 10  # from this size a tensor's storage is shared, not copied
STORAGE_BASE = 1 << 20       # segment numbers of shared storages (the arena's are below)


class Remote:
    """A hub object: attribute reads and method calls go to the hub."""

    def __init__(self, conn, hid, kind, consts=None):
        object.__setattr__(self, "_conn", conn)
        object.__setattr__(self, "_hid", hid)
        object.__setattr__(self, "_kind", kind)
        object.__setattr__(self, "_consts", consts or {})

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name in self._consts:
            return self._consts[name]
        if name == "set_stream":  # a group's stream changes
            self._consts.pop("stream", None)
        return self._conn.attr(self, name)

    def __enter__(self):
        return self._conn.call(self._hid, "__enter__", (), {})

    def __exit__(self, *exc):
        return self._conn.call(self._hid, "__exit__", (None, None, None), {})

    def __repr__(self):
        return f"<{self._kind} in the cocemu hub #{self._hid}>"

    def __del__(self):
        try:
            self._conn.released.append(self._hid)
        except Exception:  # interpreter shutdown
            pass


class _Method:
    """A bound method of a hub object; holds its proxy, so the object lives through the call."""
    __slots__ = ("conn", "hid", "name", "owner")

    def __init__(self, conn, hid, name, owner=None):
        self.conn, self.hid, self.name, self.owner = conn, hid, name, owner

    def __call__(self, *args, **kwargs):
        return self.conn.call(self.hid, self.name, args, kwargs)


class _TensorClass:
    """`api.Tensor`: shape-only tensors of a dry run, made in the hub."""

    @staticmethod
    def shape_only(shape, dtype):
        return wire.ShapeOnly(shape, dtype)


class Api:
    """The `cocemu` module's collectives and groups, run by the hub for this rank."""
    Tensor = _TensorClass

    def __init__(self, conn):
        self._conn = conn

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Method(self._conn, 0, name)


class RemoteRank(Remote):
    """This process's cocemu.Rank: constants and the current stream and segment answered here."""

    def __init__(self, conn, hid, info):
        super().__init__(conn, hid, "Rank")
        for k in ("id", "world_size", "numerics", "deterministic", "profile"):
            object.__setattr__(self, k, info[k])
        object.__setattr__(self, "_current_stream", info["current_stream"])
        object.__setattr__(self, "_current_segment", info["current_segment"])

    @property
    def current_stream(self):
        return self._current_stream

    def set_current_stream(self, stream):
        self._conn.call(self._hid, "set_current_stream", (stream,), {})
        object.__setattr__(self, "_current_stream", stream)

    @property
    def current_segment(self):
        return self._current_segment

    def set_segment(self, name):
        self._conn.call(self._hid, "set_segment", (name,), {})
        object.__setattr__(self, "_current_segment", name)

    segment = cocemu.Rank.segment
    stream = cocemu.Rank.stream


class Connection:
    def __init__(self, sock, rank_id, timeout_s):
        self.sock, self.rank_id, self.timeout_s = sock, rank_id, timeout_s
        self.reader = wire.Reader(sock)  # the hub's answers
        self.arena = Arena()
        self.proxies = weakref.WeakValueDictionary()  # hid -> Remote, while the rank holds it
        self.kinds = {}          # (type name, attribute) -> True for methods
        self.released = []
        self.pending = {}        # token -> [(user array, seg, offset, n, is_output)]
        self.copies = {}         # (address, bytes) of a copied array -> [seg, offset, n, calls]
        self.token = 0
        self.lock = threading.RLock()
        self.closed = None       # the error every call raises once the hub has ended the run
        self.api = Api(self)
        self.rank = None
        self.storages = {}       # segment -> (start, end, alive()) of shared torch storages
        self.next_storage = STORAGE_BASE
        self.new_storages = []   # [(segment, size, fd)] not yet sent to the hub
        self.dead = []           # freed storages not yet dropped by the hub
        self.share_bytes = SHARE_BYTES
        self.local = 0           # the last handle this rank gave a pipelined call's Work
        self.holding = False     # one-way calls wait in `held` for the next frame sent
        self.held = []

    # --- shared storages ----------------------------------------------------------------------

    def segment_of(self, start, nbytes):
        """(segment, offset) of a live shared storage holding [start, start + nbytes), or None
        (torch may put a new storage where a freed shared one was)."""
        for seg, (s, e, alive) in list(self.storages.items()):
            if s <= start and start + nbytes <= e:
                if alive():
                    return seg, start - s
                del self.storages[seg]
                self.dead.append(seg)
        return None

    def busy(self, start, end):
        """True while a copied array of an unfinished call lies in [start, end)."""
        for regions in self.pending.values():
            for a, *_ in regions:
                p = a.ctypes.data
                if p < end and start < p + a.nbytes:
                    return True
        return False

    def share(self, start, size, fd, alive):
        """Registers a shared storage: [start, start + size) of this process, `fd` for the hub;
        `alive()` turns False when torch frees it."""
        seg = self.next_storage
        self.next_storage += 1
        self.storages[seg] = (start, start + size, alive)
        self.new_storages.append((seg, size, fd))

    def _segments(self):
        """New segments to announce ([(index, size)], fds) and freed storages to drop."""
        segs, fds = self.arena.take_new()
        for seg, size, fd in self.new_storages:
            segs.append((seg, size))
            fds.append(fd)
        self.new_storages = []
        dropped, self.dead = self.dead, []
        for seg, (_, _, alive) in list(self.storages.items()):
            if not alive():
                del self.storages[seg]
                dropped.append(seg)
        return segs, fds, dropped

    # --- calls --------------------------------------------------------------------------------

    def hello(self, pid, config):
        """Introduces the rank; returns the hub's description of the run and the rank."""
        segs, fds = self.arena.take_new()
        wire.send(self.sock, ("hello", self.rank_id, pid, config), fds)
        info = self._reply()
        info["current_stream"] = self._decode(info["current_stream"])
        self.rank = RemoteRank(self, 1, info)
        return info

    def attr(self, proxy, name):
        method = self.kinds.get((proxy._kind, name))
        if method:
            return _Method(self, proxy._hid, name, proxy)
        value = self.call(proxy._hid, name, None, None)  # args None: an attribute read
        if isinstance(value, wire.IsMethod):
            self.kinds[(proxy._kind, name)] = True
            return _Method(self, proxy._hid, name, proxy)
        return value

    def call(self, hid, name, args, kwargs):
        with self.lock:
            if self.closed is not None:
                raise self.closed
            token, regions = 0, []
            if args:
                outputs = OUTPUTS.get(name)
                args = tuple(self._encode(a, regions, _is_out(outputs, i, name, a))
                             for i, a in enumerate(args))
            if kwargs:
                outputs = OUTPUTS.get(name)
                kwargs = {k: self._encode(v, regions, outputs is None or k in outputs)
                          for k, v in kwargs.items()}
            if regions:
                self.token += 1
                token = self.token
                self.pending[token] = regions
            oneway = args is not None and name in ONEWAY
            if oneway and hid == 0:
                oneway = False
            result = 0
            if hid == 0 and name in PIPELINED and (name in ALWAYS_WORK or
                                                   (kwargs or {}).get("async_op") is True):
                self.local -= 1
                result = self.local
                oneway = True
            segs, fds, dropped = self._segments()
            released, self.released = self.released, []
            message = ("call", hid, name, args, kwargs, token, oneway, released, segs, dropped,
                       result)
            if oneway and self.holding and not fds:
                self.held.append(message)
            else:
                self._send(message, fds)
            if result:
                p = self.proxies[result] = Remote(self, result, "Work")
                return p
            if oneway:
                proxy = self.proxies.get(hid)
                return ONEWAY_RESULT.get((proxy._kind if proxy is not None else None, name))
            return self._decode(self._reply())

    def hold(self):
        """One-way calls from now on wait and go with the next frame sent, or at `release()`:
        a blocking collective's launch, its stream wait and the host's wait for its data then
        cross the socket in one write (torch calls `work.wait()` right after the launch)."""
        self.holding = True

    def release(self):
        """Sends the held one-way calls (if any) and stops holding."""
        with self.lock:
            self.holding = False
            if self.held and self.closed is None:
                held, self.held = self.held, []
                wire.send(self.sock, held[0] if len(held) == 1 else ("calls", held))

    def _send(self, message, fds=()):
        """Sends `message` after the held calls, all in one frame (its fds with it)."""
        if self.held:
            message, self.held = ("calls", self.held + [message]), []
        wire.send(self.sock, message, fds)

    def shared_object(self, key, kind):
        return self.api.shared(key, kind)

    def end(self, value):
        """The rank's function returned `value`: the hub's rank ends with it."""
        with self.lock:
            if self.closed is None:
                self.holding = False
                self._send(("end", value, None))
                self._reply()

    def fail(self, exc):
        """The rank's function raised `exc`: the hub's rank raises it too (the run fails)."""
        with self.lock:
            if self.closed is not None:
                return
            import traceback
            text = "".join(traceback.format_exception(exc))
            self.holding = False
            try:
                self._send(("fail", wire.portable(exc), text))
            except OSError:
                return
            try:
                self._reply()
            except Exception:
                pass

    # --- encoding -----------------------------------------------------------------------------

    def _encode(self, value, regions, is_output):
        if isinstance(value, np.ndarray):
            return self._array(value, regions, is_output)
        if isinstance(value, Remote):
            return wire.Ref(value._hid, value._kind)
        if isinstance(value, list):
            return [self._encode(v, regions, is_output) for v in value]
        if isinstance(value, tuple):
            if len(value) == 4 and value[0] in ("send", "recv") and \
                    isinstance(value[1], np.ndarray):  # a p2p op of a batch
                return (value[0], self._array(value[1], regions, value[0] == "recv"),
                        value[2], value[3])
            return tuple(self._encode(v, regions, is_output) for v in value)
        return value

    def _array(self, a, regions, is_output):
        if not a.flags.c_contiguous:
            raise cocemu.Error(f"rank {self.rank_id}: an array {a.shape} {a.dtype} is not "
                               f"C-contiguous (cocemu takes contiguous arrays)")
        if a.nbytes >= self.share_bytes:
            where = self.segment_of(a.ctypes.data, a.nbytes)
            if where is not None:  # in a shared storage: the hub works on it in place
                return wire.Shm(where[0], where[1], a.shape, a.dtype.str)
        key = (a.ctypes.data, a.nbytes)
        copy = self.copies.get(key) if a.nbytes else None
        if copy is not None:
            # The array of an unfinished call: this call works on that call's copy, after it in
            # stream order, as it would on the tensor itself (async collectives chained in place).
            seg, off, n = copy[:3]
            copy[3] += 1
        else:
            start, end = key[0], key[0] + a.nbytes
            for (s0, size), (_, _, _, calls) in self.copies.items():
                if s0 < end and start < s0 + size:
                    raise cocemu.Error(
                        f"rank {self.rank_id}: an array {a.shape} {a.dtype} overlaps, without "
                        f"being it, the {size}-byte array of an unfinished call: in process mode "
                        f"a small tensor (under {self.share_bytes} bytes, COCEMU_SHARE_BYTES) "
                        f"crosses to the hub as a copy; wait() for that call first")
            seg, off, n = self.arena.alloc(a.nbytes)
            if a.nbytes:
                self.arena.view(seg, off, a.shape, a.dtype)[...] = a
                self.copies[key] = [seg, off, n, 1]
        regions.append((a, seg, off, n, is_output))
        return wire.Shm(seg, off, a.shape, a.dtype.str)

    def _decode(self, value):
        if isinstance(value, wire.Ref):
            p = self.proxies.get(value.hid)
            if p is None:
                if value.hid in self.released:  # dropped, not yet told: alive again
                    self.released.remove(value.hid)
                consts = value.consts
                if consts and isinstance(consts.get("stream"), wire.Ref):
                    consts["stream"] = self._decode(consts["stream"])
                p = self.proxies[value.hid] = Remote(self, value.hid, value.kind, consts)
            return p
        if isinstance(value, list):
            return [self._decode(v) for v in value]
        if isinstance(value, tuple):
            return tuple(self._decode(v) for v in value)
        return value

    def _reply(self):
        try:
            message, _ = self.reader.recv()
        except (wire.Closed, OSError) as e:
            self.closed = cocemu.Error(f"rank {self.rank_id}: the cocemu hub has gone ({e}): "
                                       f"the run ended")
            raise self.closed from None
        kind = message[0]
        if kind == "abort":
            self.closed = _error(message[1], message[2])
            raise self.closed
        done = message[2]
        for token in done:
            self._copy_back(token)
        if kind == "ok":
            return message[1]
        raise wire.restore(message[1])

    def _copy_back(self, token):
        for a, seg, off, n, is_output in self.pending.pop(token, ()):
            if is_output and a.nbytes:
                a[...] = self.arena.view(seg, off, a.shape, a.dtype)
            key = (a.ctypes.data, a.nbytes)
            copy = self.copies.get(key)
            if copy is not None:
                copy[3] -= 1
                if copy[3] > 0:
                    continue  # a later call still works on this copy
                del self.copies[key]
            self.arena.release(seg, off, n)


def _is_out(outputs, i, name, a):
    if outputs is None:
        return True
    return i in outputs


def _error(message, code):
    e = cocemu.Error(message)
    e.code, e.rank = code, None
    return e
