"""A rank process's shared-memory arena: memfd segments the hub maps too.

A small array a rank passes to a collective is copied into the arena when the call is issued and
its outputs are copied back when the hub reports the call complete (Work done, or the streams
idle): torch owns the rank's tensors and allocates them wherever it likes, and below a few hundred
KiB one copy in and one out costs less than sharing the tensor's memory. A large tensor's storage
is moved into shared memory once (torch's own `share_memory_`, an unlinked file passed by fd) and
the hub then reads and writes it in place, with no copy, until torch frees it. memfd segments
and torch's unlinked files have no name: they vanish with the last process that maps them, so no
/dev/shm file outlives a run, even after SIGKILL.
"""
import mmap
import os

import numpy as np

ALIGN = 64
FIRST_SEGMENT = 64 << 20


class Arena:
    def __init__(self):
        self.segments = []      # [(fd, mmap, size)]
        self.free = []          # per segment: sorted [(offset, size)]
        self.new = []           # segments the hub has not mapped yet: [(index, size, fd)]

    def _add_segment(self, need):
        size = max(FIRST_SEGMENT, need, 2 * (self.segments[-1][2] if self.segments else 0))
        size = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
        fd = os.memfd_create(f"cocemu-rank-{os.getpid()}-{len(self.segments)}",
                             os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        m = mmap.mmap(fd, size)
        self.segments.append((fd, m, size))
        self.free.append([(0, size)])
        self.new.append((len(self.segments) - 1, size, fd))
        return len(self.segments) - 1

    def alloc(self, nbytes):
        """(segment, offset) of `nbytes` bytes, aligned."""
        n = max(ALIGN, (nbytes + ALIGN - 1) // ALIGN * ALIGN)
        for seg, blocks in enumerate(self.free):
            for i, (off, size) in enumerate(blocks):
                if size >= n:
                    if size == n:
                        del blocks[i]
                    else:
                        blocks[i] = (off + n, size - n)
                    return seg, off, n
        seg = self._add_segment(n)
        off, size = self.free[seg][0]
        self.free[seg][0] = (off + n, size - n)
        return seg, off, n

    def release(self, seg, off, n):
        blocks = self.free[seg]
        blocks.append((off, n))
        blocks.sort()
        merged = []
        for o, s in blocks:
            if merged and merged[-1][0] + merged[-1][1] == o:
                merged[-1] = (merged[-1][0], merged[-1][1] + s)
            else:
                merged.append((o, s))
        self.free[seg] = merged

    def view(self, seg, off, shape, dtype):
        return np.ndarray(shape, dtype=dtype, buffer=self.segments[seg][1], offset=off)

    def take_new(self):
        """Segments to announce to the hub with the next message: [(index, size)], [fds]."""
        new, self.new = self.new, []
        return [(i, s) for i, s, _ in new], [fd for _, _, fd in new]


class Mapped:
    """The hub's side: a rank's segments (its arena's and its shared torch storages), mapped
    from the fds it sent."""

    def __init__(self):
        self.maps = {}
        self.closing = []  # dropped segments an op still views: closed when it lets go

    def add(self, index, size, fd):
        self.maps[index] = mmap.mmap(fd, size)
        os.close(fd)

    def drop(self, index):
        m = self.maps.pop(index, None)
        if m is not None:
            self.closing.append(m)
        still = []
        for m in self.closing:
            try:
                m.close()
            except BufferError:
                still.append(m)
        self.closing = still

    def view(self, seg, off, shape, dtype):
        return np.ndarray(shape, dtype=np.dtype(dtype), buffer=self.maps[seg], offset=off)

    def close(self):
        for m in self.maps.values():
            try:
                m.close()
            except BufferError:  # a view still held by a finishing op: freed with it
                pass
        self.maps.clear()
