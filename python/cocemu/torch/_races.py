"""Stream races (R-PY-16), in checked mode: an op that reads or writes a tensor on one stream while
an op on another stream may still write it is an error naming both ops, their streams and the
rank (as PyTorch's CUDA stream sanitizer reports on a GPU).

"May still write" is decided with vector clocks, one per stream of the rank: ops on a stream are
numbered; a stream's clock holds, for every other stream, the number of its last op known to have
finished before the stream's next op. Events snapshot the clock of the stream they are recorded on
(with its own count), `wait_event` / `wait_stream` / `Work.wait()` merge a snapshot into the waiting
stream's clock, and host synchronisation (stream, event, device) merges into the host's clock,
which every stream knows. Each storage keeps the byte ranges written and their writers (stream,
op number, op name); an access on stream s races with a write of the bytes it touches by another
stream whose op number exceeds what s's clock (or the host's) holds for it.

Collectives (cocemu.torch._dist) report through `collective()` and `work_wait()`: the collective
runs on the comm stream after the stream it was issued from (ProcessGroupNCCL's order), reads its
inputs and writes its outputs there; `Work.wait()` makes the current stream wait for it.
"""
import weakref

from ._state import error


def _storage(t):
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # sparse, nested: not checked
        return None


def _span(t):
    """The (first byte, end byte) of its storage that tensor `t` spans."""
    size = t.element_size()
    start = t.storage_offset() * size
    if t.is_contiguous():
        return start, start + t.numel() * size
    if t.numel() == 0:
        return start, start
    return start, start + size * (1 + sum((n - 1) * abs(d) for n, d in zip(t.shape, t.stride())))


class Races:
    """One rank's streams' clocks and its storages' last writers."""

    def __init__(self, st):
        self.st = st
        self.count = {}   # stream id -> ops numbered on it
        self.clock = {}   # stream id -> {stream id: op number known finished}
        self.names = {}   # stream id -> the stream's name for messages
        self.host = {}    # what host synchronisation established
        self.writer = {}  # storage id -> (weakref to the storage, [(first byte, end byte,
        #                                   stream id, op number, op name)])

    def _stream(self, cs):
        k = hash(cs)
        if k not in self.names:
            self.names[k] = cs.name if hasattr(cs, "name") else repr(cs)
            self.clock[k] = {}
            self.count[k] = 0
        return k

    def access(self, cs, name, reads, writes, fresh=()):
        """An op `name` on stream `cs` reading tensors `reads`, writing `writes` and making the
        new tensors `fresh`: checks each access against the other streams' writes of the same
        bytes, then records the op as the writer of what it wrote."""
        k = self._stream(cs)
        n = self.count[k] = self.count[k] + 1
        clock, host, writer = self.clock[k], self.host, self.writer
        written = []
        for tensors, writes_it in ((reads, False), (writes, True)):
            for t in tensors:
                storage = _storage(t)
                if storage is None:
                    continue
                key = storage._cdata
                e = writer.get(key)
                span = None
                if e is not None:
                    if e[0]() is not storage:  # a dead storage's entry; the address is reused
                        del writer[key]
                    else:
                        start, end = span = _span(t)
                        for s, stop, w, wn, wname in e[1]:
                            if w != k and s < end and start < stop and \
                                    max(clock.get(w, 0), host.get(w, 0)) < wn:
                                self._race(k, name, writes_it, t, (w, wn, wname))
                if writes_it:
                    written.append((key, storage, span or _span(t)))
        for t in fresh:  # a new tensor: the op writes all of its new storage
            storage = _storage(t)
            if storage is not None:
                writer[storage._cdata] = (weakref.ref(storage),
                                          [(0, storage.nbytes(), k, n, name)])
        for key, storage, (start, end) in written:
            e = writer.get(key)
            if e is None or e[0]() is not storage:
                writer[key] = (weakref.ref(storage), [(start, end, k, n, name)])
                continue
            # the new write hides the older ones it covers
            kept = [w for w in e[1] if not (start <= w[0] and w[1] <= end)]
            kept.append((start, end, k, n, name))
            writer[key] = (e[0], kept)
        return n

    def _race(self, k, name, writes_it, t, w):
        st = self.st
        raise error(
            f"rank {st.id}: stream race: aten.{name} on stream {self.names[k]} "
            f"{'writes' if writes_it else 'reads'} a {list(t.shape)} "
            f"{str(t.dtype).replace('torch.', '')} tensor that aten.{w[2]} (op {w[1]} on stream "
            f"{self.names[w[0]]}, rank {st.id}) may still be writing: nothing orders them (make "
            f"stream {self.names[k]} wait first: wait_stream, an event's wait, or Work.wait() "
            f"under it)", code="failed_precondition")

    def record(self, cs):
        """A snapshot of what is finished once everything enqueued on `cs` so far is."""
        k = self._stream(cs)
        snap = dict(self.clock[k])
        snap[k] = self.count[k]
        return snap

    def wait(self, cs, snap):
        """Ops enqueued on `cs` from now on start after `snap`."""
        if snap:
            _merge(self.clock[self._stream(cs)], snap)

    def host_wait(self, snap):
        """The host waited for `snap` (stream/event synchronize): later ops of every stream
        start after it."""
        if snap:
            _merge(self.host, snap)

    def synchronize_all(self):
        for k, n in self.count.items():
            if self.host.get(k, 0) < n:
                self.host[k] = n


def _merge(into, snap):
    for s, n in snap.items():
        if into.get(s, 0) < n:
            into[s] = n


def of(st):
    """The rank's Races, or None when the run is not checked."""
    r = getattr(st, "cocemu_races", None)
    if r is None and st.checked:
        r = st.cocemu_races = Races(st)
    return r


def collective(st, comm_stream, name, reads, writes):
    """For cocemu.torch._dist: a collective issued from the current stream runs on
    `comm_stream` after it, reading `reads` and writing `writes`; returns the token
    `work_wait()` takes (None when the run is not checked)."""
    r = of(st)
    if r is None:
        return None
    r.wait(comm_stream, r.record(st.rank.current_stream))
    r.access(comm_stream, name, reads, writes)
    return r.record(comm_stream)


def work_wait(st, token):
    """For cocemu.torch._dist: Work.wait() on the calling thread's current stream."""
    r = of(st)
    if r is not None and token is not None:
        r.wait(st.rank.current_stream, token)


def work_synchronize(st, token):
    """For cocemu.torch._dist: the host waited for the collective (Work.synchronize, a blocking
    collective)."""
    r = of(st)
    if r is not None and token is not None:
        r.host_wait(token)
