"""Frames between a rank process and its hub: a pickled message behind an 8-byte length, on a
stream socket, with file descriptors (the rank's shared-memory segments) passed alongside. Calls
that go together (a blocking collective's launch, stream wait and data wait) travel as one
("calls", [message, ...]) frame. A `Reader` takes whatever the socket holds in one system call
and hands out the frames in it, and the descriptors in the order they came.

Values that stay in the hub travel as `Ref`s (a handle the hub keeps, with the object's type name);
arrays travel as `Shm` (where their bytes sit in the rank's shared-memory arena); dry-run tensors
as `ShapeOnly`. Everything else is pickled by value.
"""
import pickle
import socket
import struct

HEADER = struct.Struct("<Q")
MAX_FDS = 8


class Ref:
    """An object that lives in the hub: handle `hid`, its type's name `kind`, and the attributes
    that never change (a group's name, ranks, size …), answered without asking the hub."""
    __slots__ = ("hid", "kind", "consts")

    def __init__(self, hid, kind, consts=None):
        self.hid, self.kind, self.consts = hid, kind, consts

    def __reduce__(self):
        return (Ref, (self.hid, self.kind, self.consts))


class Shm:
    """An array in the rank's arena: segment, byte offset, shape and NumPy dtype string."""
    __slots__ = ("seg", "offset", "shape", "dtype")

    def __init__(self, seg, offset, shape, dtype):
        self.seg, self.offset, self.shape, self.dtype = seg, offset, shape, dtype

    def __reduce__(self):
        return (Shm, (self.seg, self.offset, self.shape, self.dtype))


class ShapeOnly:
    """cocemu.Tensor.shape_only(shape, dtype), made in the hub (a dry run's tensor)."""
    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), dtype

    def __reduce__(self):
        return (ShapeOnly, (self.shape, self.dtype))


class IsMethod:
    """The hub's answer to an attribute read that names a method."""

    def __reduce__(self):
        return (IsMethod, ())


class ErrorInfo:
    """A cocemu.Error crossing the socket (its C++ payload does not pickle): message, code, rank
    and notes, made a cocemu.Error again on the other side."""
    __slots__ = ("message", "code", "rank", "notes")

    def __init__(self, message, code, rank, notes):
        self.message, self.code, self.rank, self.notes = message, code, rank, notes

    def __reduce__(self):
        return (ErrorInfo, (self.message, self.code, self.rank, self.notes))

    def error(self):
        import cocemu
        e = cocemu.Error(self.message)
        e.code, e.rank = self.code, self.rank
        for n in self.notes:
            e.add_note(n)
        return e


def portable(exc):
    """`exc` as something pickle carries: a cocemu.Error as ErrorInfo, an exception pickle
    cannot carry as a RuntimeError naming its type."""
    import cocemu
    if isinstance(exc, cocemu.Error):
        return ErrorInfo(str(exc), getattr(exc, "code", None), getattr(exc, "rank", None),
                         list(getattr(exc, "__notes__", ())))
    try:
        pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
        return exc
    except Exception:
        e = RuntimeError(f"{type(exc).__name__}: {exc}")
        for n in getattr(exc, "__notes__", ()):
            e.add_note(n)
        return e


def restore(exc):
    return exc.error() if isinstance(exc, ErrorInfo) else exc


class Closed(ConnectionError):
    """The peer closed the connection (its process ended)."""


def send(sock, message, fds=()):
    """Writes `message` with its file descriptors (passed with its header)."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    head = HEADER.pack(len(data))
    if fds:
        socket.send_fds(sock, [head], list(fds))
        sock.sendall(data)
    else:
        sock.sendall(head + data)


class Reader:
    """Frames from `sock`, read in chunks: a frame its peer wrote at once (most are) costs one
    recvmsg, not two, and frames that arrived together one between them.

    A sender passes a frame's file descriptors with its header (`send`), and a Unix socket ends a
    read after the bytes that carried descriptors: they belong to the frame holding the last byte
    of the read that brought them, and `recv` returns them with that frame."""
    CHUNK = 1 << 16

    def __init__(self, sock):
        self.sock = sock
        self.buf = bytearray()
        self.start = 0   # the stream offset of buf[0]
        self.fds = []    # [(stream offset of the byte they came with, [fd, ...])]

    def _fill(self, need=0):
        data, fds, _, _ = socket.recv_fds(self.sock, max(self.CHUNK, need), MAX_FDS)
        if fds:
            self.fds.append((self.start + len(self.buf) + len(data) - 1, fds))
        if not data:
            raise Closed("connection closed")
        self.buf += data

    def recv(self):
        """(message, fds); raises Closed when the peer has gone, and socket.timeout (a Python
        socket timeout) or BlockingIOError (the kernel's SO_RCVTIMEO) when the socket's timeout
        passes first: nothing is lost, what was read stays buffered for the next call."""
        while len(self.buf) < HEADER.size:
            self._fill()
        (n,) = HEADER.unpack_from(self.buf)
        end = HEADER.size + n
        while len(self.buf) < end:
            self._fill(min(end - len(self.buf), 1 << 22))
        message = pickle.loads(self.buf[HEADER.size:end])
        del self.buf[:end]
        self.start += end
        fds = []
        while self.fds and self.fds[0][0] < self.start:
            fds.extend(self.fds.pop(0)[1])
        return message, fds

    def close(self):
        """Closes descriptors received and not handed out."""
        import os
        for _, fds in self.fds:
            for fd in fds:
                os.close(fd)
        self.fds = []


def _exact(sock, n, first=b""):
    chunks, got = [first], len(first)
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 22))
        if not chunk:
            raise Closed("connection closed")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv(sock):
    """(message, fds); raises Closed when the peer has gone."""
    head, fds, _, _ = socket.recv_fds(sock, HEADER.size, MAX_FDS)
    if not head:
        for fd in fds:
            import os
            os.close(fd)
        raise Closed("connection closed")
    head = _exact(sock, HEADER.size, head)
    (n,) = HEADER.unpack(head)
    return pickle.loads(_exact(sock, n)), fds
