"""Frames between a rank process and its hub: a pickled message behind an 8-byte length, on a
stream socket, with file descriptors (the rank's shared-memory segments) passed alongside.

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


def frame(message):
    """`message` as the bytes `send` writes (without file descriptors)."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(data)) + data


def send(sock, message, fds=(), before=b""):
    """Writes `message` (after the frames `before`, already framed) with its file descriptors."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    head = HEADER.pack(len(data))
    if fds:
        if before:
            sock.sendall(before)
        socket.send_fds(sock, [head], list(fds))
        sock.sendall(data)
    else:
        sock.sendall(before + head + data)


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
