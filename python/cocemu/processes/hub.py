"""The hub: cocemu's runtime for ranks that are processes.

Each rank process connects to the hub over a Unix socket (an abstract name: nothing on disk) and
sends its calls there; in the hub, a rank thread of an ordinary `cocemu.run` makes each call on
the rank's behalf, on views of the rank's shared-memory arena. Group matching, collectives, p2p,
fused kernels, streams, events and the modeled clock are the thread mode's own: the same program
gives the same bits and the same nanoseconds whether its ranks are threads or processes. A
transport that carries the same messages over another byte stream (TCP between hosts) plugs in
at `Hub.accept`.

A rank that raises, exits or is killed fails the run: the hub names it (rank, pid, exit code or
signal, the call it was in) and every other rank's next call, or the call it is waiting in, raises
that error.
"""
import os
import secrets
import signal
import socket
import struct
import threading
import time

import numpy as np

import cocemu

from . import shared as _shared
from . import wire
from .arena import Mapped

TICK_S = 0.1  # how often a rank thread waiting for its process looks at the run's state


class RankConnection:
    def __init__(self, sock, rank, pid, config):
        self.sock, self.rank, self.pid, self.config = sock, rank, pid, config
        self.mapped = Mapped()
        self.last_call = None
        self.deferred = None   # an error of a call that did not wait for its answer


class Hub:
    def __init__(self, world_size, timeout_s, address=None):
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.address = address or f"\0cocemu-{os.getpid()}-{secrets.token_hex(6)}"
        self.server.bind(self.address)
        self.server.listen(max(world_size, 8))
        self.conns = [None] * world_size
        self.failure = None
        self.lock = threading.Lock()
        self.objects = {}
        self.processes = None  # rank -> multiprocessing.Process, when the hub started them

    # --- start ----------------------------------------------------------------------------------

    def accept(self, alive=None):
        """Waits (bounded by the timeout) until every rank process has said hello; `alive()`
        raises when a process the caller started has ended before connecting."""
        deadline = time.monotonic() + self.timeout_s
        self.server.settimeout(TICK_S)
        while any(c is None for c in self.conns):
            if alive is not None:
                alive()
            if time.monotonic() > deadline:
                missing = [r for r, c in enumerate(self.conns) if c is None]
                raise _error(f"cocemu hub: ranks {missing} of {self.world_size} did not connect "
                             f"within {self.timeout_s:g} s", "timeout")
            try:
                sock, _ = self.server.accept()
            except (socket.timeout, BlockingIOError):
                continue
            sock.settimeout(None)
            message, fds = wire.recv(sock)
            _, rank, pid, config = message[:4]
            problem = None
            if not isinstance(rank, int) or not 0 <= rank < self.world_size:
                problem = f"rank {rank!r} is not a rank of a world of {self.world_size}"
            elif self.conns[rank] is not None:
                problem = (f"rank {rank} connected twice (pids {self.conns[rank].pid} and "
                           f"{pid})")
            else:
                first = next((c.config for c in self.conns if c is not None), None)
                if first is not None and config != first:
                    diff = {k: (first.get(k), config.get(k)) for k in set(first) | set(config)
                            if first.get(k) != config.get(k)}
                    problem = (f"rank {rank} (pid {pid}) was started with other settings than "
                               f"the ranks before it: {diff}")
            if problem:
                wire.send(sock, ("err", _error(f"cocemu hub: {problem}"), []))
                sock.close()
                if "settings" in problem:
                    raise _error(f"cocemu hub: {problem}")
                continue
            c = self.conns[rank] = RankConnection(sock, rank, pid, config)
            for (index, size), fd in zip(message[4] if len(message) > 4 else [], fds):
                c.mapped.add(index, size, fd)
        self.server.close()

    # --- a rank ---------------------------------------------------------------------------------

    def serve(self, rank):
        """cocemu.run's body for `rank`: makes the rank process's calls until it ends."""
        c = self.conns[rank.id]
        try:
            return _Server(self, c, rank).loop()
        except BaseException as e:
            with self.lock:
                if self.failure is None:
                    self.failure = (rank.id, c.pid, str(e).split("\n")[0])
            raise
        finally:
            try:
                c.sock.close()
            finally:
                c.mapped.close()

    def shared(self, key, kind):
        return _shared.get(self.objects, self.lock, key, kind)

    def lost(self, c):
        """How rank `c`'s process ended, for the error naming it."""
        how = "closed its connection without ending (its process exited or was killed)"
        p = (self.processes or {}).get(c.rank)
        if p is not None:
            p.join(0.5)
            if p.exitcode is not None:
                how = describe_exit(p.exitcode)
        where = (f"after its {c.last_call} (its last cocemu call)" if c.last_call
                 else "before its first collective")
        return _error(f"rank {c.rank} (pid {c.pid}) {how} {where}", "peer_failed")


def describe_exit(code):
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class _Api:
    """Handle 0: the cocemu module, and the run's shared objects."""

    def __init__(self, hub):
        self._hub = hub

    def shared(self, key, kind):
        return self._hub.shared(key, kind)

    def __getattr__(self, name):
        return getattr(cocemu, name)


class _Server:
    def __init__(self, hub, c, rank):
        self.hub, self.c, self.rank = hub, c, rank
        self.handles = {0: _Api(hub), 1: rank}
        self.index = {}
        self.next = 2
        self.tracked = {}      # token -> Work whose completion lets the rank copy outputs back
        self.finished = []     # tokens complete but not yet reported
        self.streams = {}      # the rank's streams the hub has handed out (drained when needed)

    def loop(self):
        c, rank = self.c, self.rank
        info = dict(id=rank.id, world_size=rank.world_size, numerics=rank.numerics,
                    deterministic=rank.deterministic, profile=rank.profile.name,
                    current_stream=self.encode(rank.current_stream),
                    current_segment=rank.current_segment)
        wire.send(c.sock, ("ok", info, []))
        _tick(c.sock, self.hub.timeout_s)
        reader = wire.Reader(c.sock)
        try:
            while True:
                try:
                    message, fds = reader.recv()
                except BlockingIOError:  # a tick without a frame
                    self.check_run()
                    continue
                except (wire.Closed, OSError):
                    raise self.hub.lost(c) from None
                if message[0] != "calls":
                    ended, value = self.handle(message, fds)
                else:  # calls sent together: the fds are the last one's (the others held none)
                    last = len(message[1]) - 1
                    for i, m in enumerate(message[1]):
                        ended, value = self.handle(m, fds if i == last else ())
                if ended:
                    return value
        finally:
            reader.close()

    def handle(self, message, fds):
        """Makes one message's call; (True, the rank's result) when the rank has ended."""
        c, kind = self.c, message[0]
        if kind == "call":
            self.call(message, fds)
        elif kind == "end":
            self.drain()
            wire.send(c.sock, ("ok", None, self.finished + self.done()))
            return True, message[1]
        elif kind == "fail":
            _, exc, text = message
            wire.send(c.sock, ("ok", None, []))
            exc = wire.restore(exc)
            if not isinstance(exc, BaseException):
                exc = RuntimeError(text)
            try:
                exc.add_note(f"raised in rank {c.rank}'s process (pid {c.pid}):\n"
                             + text.rstrip())
            except AttributeError:
                pass
            raise exc
        return False, None

    def check_run(self):
        """Another rank failed: this rank's process learns it at its next call."""
        failure = self.hub.failure
        if failure is not None and failure[0] != self.c.rank:
            r, pid, what = failure
            message = f"rank {self.c.rank}: the run has ended: rank {r} (pid {pid}) failed: {what}"
            try:
                wire.send(self.c.sock, ("abort", message, "peer_failed"))
            except OSError:
                pass
            raise _error(message, "peer_failed")

    def call(self, message, fds):
        c = self.c
        _, hid, name, args, kwargs, token, oneway, released, segs, dropped, result = message
        for (index, size), fd in zip(segs, fds):
            c.mapped.add(index, size, fd)
        for index in dropped:
            c.mapped.drop(index)
        # Before the call: a handle the call returns again gets a new number, never a dropped one
        # (the rank holds a proxy of every object its call names, the target included).
        for h in released:
            obj = self.handles.pop(h, None)
            if obj is not None:
                self.index.pop(id(obj), None)
        if hid == 0 and name not in ("wait_unmodeled", "shared"):  # a collective or p2p call
            c.last_call = name
        done = []
        try:
            if c.deferred is not None:
                e, c.deferred = c.deferred, None
                raise e
            target = self.handles[hid]
            if args is None:  # an attribute read
                value = getattr(target, name)
                if callable(value):
                    value = wire.IsMethod()
            else:
                value = getattr(target, name)(*self.decode(args),
                                              **(self.decode(kwargs) if kwargs else {}))
            if result:  # the rank named the Work this call returns
                self.handles[result] = value
                self.index[id(value)] = result
            if token:
                if isinstance(value, cocemu.Work):
                    self.tracked[token] = value
                else:  # it returned after queueing: its outputs are final when the streams idle
                    self.drain()
                    done.append(token)
            reply = ("ok", self.encode(value))
        except Exception as e:
            if token:
                done.append(token)
            if oneway:
                try:
                    e.add_note(f"(raised by rank {c.rank}'s earlier call {name}, reported at "
                               f"its next call)")
                except AttributeError:
                    pass
                c.deferred = e
                self.finished.extend(done)
                return
            try:
                e.add_note(f"(rank {c.rank}'s call {name}, made in the cocemu hub)") \
                    if not isinstance(e, cocemu.Error) else None
            except AttributeError:
                pass
            reply = ("err", wire.portable(e))
        if oneway:  # no answer: what completed is reported with the next one
            self.finished.extend(done)
            return
        done = self.finished + done + self.done()
        self.finished = []
        wire.send(c.sock, reply + (done,))

    def done(self):
        finished = [t for t, w in self.tracked.items() if w.is_completed()]
        for t in finished:
            del self.tracked[t]
        return finished

    def drain(self):
        """Waits in wall time (nothing modeled) until every stream of the rank is idle."""
        streams = [self.rank.compute_stream, self.rank.comm_stream, *self.streams.values()]
        deadline = time.monotonic() + self.hub.timeout_s
        delay = 2e-5
        while not all(s.query() for s in streams):
            if time.monotonic() > deadline:
                raise _error(f"rank {self.c.rank}: {self.c.last_call} did not complete within "
                             f"{self.hub.timeout_s:g} s", "timeout")
            time.sleep(delay)
            delay = min(delay * 2, 1e-3)

    # --- values ---------------------------------------------------------------------------------

    def encode(self, value):
        if value is None or isinstance(value, (bool, int, float, str, bytes)):
            return value
        if isinstance(value, (list, tuple)):
            return type(value)(self.encode(v) for v in value)
        if isinstance(value, dict):
            return {k: self.encode(v) for k, v in value.items()}
        if isinstance(value, np.ndarray):
            raise _error(f"rank {self.c.rank}: {self.c.last_call} returns an array over the "
                         f"hub's memory, which a rank process cannot use; pass your own arrays")
        if isinstance(value, (wire.IsMethod, np.generic)):
            return value
        if type(value).__module__.startswith("cocemu") or isinstance(value, (_shared.AnySource,
                                                                            _shared.Arrivals)):
            hid = self.index.get(id(value))
            if hid is None:
                hid = self.next
                self.next += 1
                self.handles[hid] = value
                self.index[id(value)] = hid
                if isinstance(value, cocemu.Stream):
                    self.streams[hid] = value
                elif isinstance(value, cocemu.Group) and value.is_member:
                    self.streams[-hid] = value.stream
            return wire.Ref(hid, type(value).__name__, self.consts(value))
        return value

    def consts(self, value):
        if isinstance(value, cocemu.Group):
            consts = {k: getattr(value, k) for k in ("name", "size", "ranks", "is_member")}
            if value.is_member:
                consts["rank"] = value.rank
                consts["stream"] = self.encode(value.stream)
            return consts
        if isinstance(value, cocemu.Stream):
            return {k: getattr(value, k) for k in ("name", "lane", "rank_id")}
        return None

    def decode(self, value):
        if isinstance(value, wire.Shm):
            return self.c.mapped.view(value.seg, value.offset, value.shape, value.dtype)
        if isinstance(value, wire.Ref):
            return self.handles[value.hid]
        if isinstance(value, wire.ShapeOnly):
            return cocemu.Tensor.shape_only(value.shape, value.dtype)
        if isinstance(value, list):
            return [self.decode(v) for v in value]
        if isinstance(value, tuple):
            return tuple(self.decode(v) for v in value)
        if isinstance(value, dict):
            return {k: self.decode(v) for k, v in value.items()}
        return value


def _tick(sock, timeout_s):
    """A rank's socket as its hub thread uses it: blocking, a read ending empty-handed
    (BlockingIOError) after TICK_S so the thread looks at the run's state, a write bounded by the
    run's timeout. The kernel keeps the time (SO_RCVTIMEO, SO_SNDTIMEO): one system call per
    read or write, where a Python socket timeout polls before each."""
    def tv(seconds):
        return struct.pack("ll", int(seconds), int(seconds % 1 * 1e6))
    sock.settimeout(None)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv(TICK_S))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv(timeout_s))


def _error(message, code="invalid_argument"):
    e = cocemu.Error(message)
    e.code, e.rank = code, None
    return e
