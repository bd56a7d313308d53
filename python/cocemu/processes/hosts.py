"""Ranks on other hosts: the hub's frames and the arrays of a rank on another host cross through
torch's own gloo, never a protocol of cocemu's.

A rank whose host is not the hub's (another kernel or network namespace: the hub's Unix socket
and shared memory do not reach it) makes a two-member `ProcessGroupGloo` with the hub process,
from the rendezvous store (`MASTER_ADDR`/`MASTER_PORT`, a `PrefixStore` per run and rank). Its
`RemoteConnection` is the rank side of process mode unchanged (client.py) over a `Channel`: the
frames it writes, the bytes of the arrays it copied into its arena for the call, and which arena
bytes each call writes, go to the hub's host as uint8 tensors by gloo send; the hub's answers and
the outputs of the calls they report complete come back the same way, received straight into the
rank's own arrays (into the arena, then copied, while a later call still works on that copy).

In the hub process, a `Bridge` per remote rank keeps a mirror of the rank's arena in memfds and
is, towards the hub, an ordinary local rank process: it forwards the frames over the hub's Unix
socket with the mirror's fds. Placement, group matching and the modeled clock stay the hub's, so
the bits and modeled nanoseconds are those of one host. No shared memory crosses hosts: every
array of a remote rank is copied to the hub's host and its outputs back (arrays of any size:
torch storages are not shared there).

Each transfer starts with one control message (a header, then the frames and their metadata when
they fit in `CONTROL` bytes), then one message per array region, received in place. Tags: `UP`
rank to hub, `DOWN` hub to rank. A thread of the rank keeps a receive of the next control message
posted, so the hub's `abort` reaches it while it computes.
"""
import datetime
import os
import pickle
import queue
import socket
import struct
import sys
import threading
import time

import numpy as np

from . import client as _client
from . import wire

HEAD = struct.Struct("<QQQ")  # kind, frame bytes, metadata bytes
CONTROL = 64 << 10
FRAMES, CLOSED = 1, 2
UP, DOWN = 1, 2
RANK, HUB = 1, 0              # members of each two-member group
IDLE = datetime.timedelta(days=30)  # gloo's own bound on a wait without one (a rank may compute
# for hours between calls); the rank bounds its waits for answers by the run's timeout
GRACE_S = 10.0                # beyond the run's timeout, before a silent hub counts as gone
# Calls whose output arrays they overwrite whole: their outputs are not sent to the hub first.
WHOLE_OUTPUTS = frozenset({"recv", "irecv", "all_gather", "reduce_scatter", "all_to_all",
                           "batch_isend_irecv"})


def identity():
    """What decides whether the hub's transport reaches this process: the kernel (shared memory,
    fd passing) and the network namespace (abstract Unix socket names)."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    return f"{boot}/{os.stat('/proc/self/ns/net').st_ino}"


def address_toward(host):
    """This host's address on the route to `host` (the kernel's choice; nothing is sent)."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, kind, proto) as s:
        s.connect(addr)
        return s.getsockname()[0]


def rendezvous_store(timeout_s):
    """A client of the launcher's store (torchrun's MASTER_ADDR:MASTER_PORT)."""
    import torch.distributed as dist
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        raise _error("cocemu on several hosts needs torchrun's MASTER_ADDR and MASTER_PORT (the "
                     f"rendezvous store), got MASTER_ADDR={host!r} MASTER_PORT={port!r}",
                     "invalid_argument")
    return dist.TCPStore(host, int(port), is_master=False,
                         timeout=datetime.timedelta(seconds=timeout_s))


def run_store(store, run):
    import torch.distributed as dist
    return dist.PrefixStore(f"cocemu/{run}", store)


def process_group(store, rank, own_address, member, timeout_s, who):
    """The two-member gloo group of `member` (a rank) and the hub, bounded by the timeout."""
    import torch.distributed as dist
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = IDLE
    ifname = os.environ.get("GLOO_SOCKET_IFNAME")
    if ifname:
        opts._devices = [dist.ProcessGroupGloo.create_device(interface=ifname.split(",")[0])]
    else:
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=own_address)]
    box = {}

    def make():
        try:
            box["pg"] = dist.ProcessGroupGloo(dist.PrefixStore(f"pg/{member}", store), rank, 2,
                                              opts)
        except BaseException as e:  # noqa: BLE001 (handed to the waiting thread)
            box["error"] = e
    t = threading.Thread(target=make, daemon=True, name=f"cocemu-gloo-{member}")
    t.start()
    t.join(timeout_s)
    if "pg" in box:
        return box["pg"]
    raise _error(f"{who}: no gloo connection within {timeout_s:g} s"
                 + (f" ({box['error']})" if "error" in box else ""), "timeout")


def _bytes_of(buffer, offset, n):
    """A uint8 tensor over `n` bytes of `buffer` (an mmap) at `offset`: gloo reads or writes in
    place."""
    import torch
    return torch.frombuffer(buffer, dtype=torch.uint8, count=n, offset=offset)


# --- the rank's side -----------------------------------------------------------------------------

class Channel:
    """The socket a remote rank's Connection uses: what it writes goes to the hub's host in one
    transfer per batch of whole frames; what it reads comes from the hub's transfers."""

    def __init__(self, pg, hub_host, rank_id, timeout_s):
        self.pg, self.hub_host, self.rank_id, self.timeout_s = pg, hub_host, rank_id, timeout_s
        self.conn = None
        self.out = bytearray()
        self.whole = 0          # bytes of `out` that are whole frames
        self.fds_at = []        # (offset of a frame in `out`, [(segment, size)]) it announces
        self.inbox = bytearray()
        self.arrived = queue.Queue()  # the frames of each transfer from the hub, or the error
        self.lost = None
        self.receiver = threading.Thread(target=self._receive_all, daemon=True,
                                         name=f"cocemu-rank-{rank_id}-from-hub")

    def start(self, conn):
        self.conn = conn
        self.receiver.start()

    def _gone(self, what, e):
        why = str(e).split(". This is typically")[0].split("] ", 1)[-1]
        return wire.Closed(f"{what} the cocemu hub's host {self.hub_host} (gloo: {why})")

    # sending
    def settimeout(self, _):
        pass

    def sendmsg(self, buffers, ancdata=()):
        fds = [fd for _, _, data in ancdata for fd in data]
        if fds:
            segs = [(i, size) for i, (fd, _, size) in enumerate(self.conn.arena.segments)
                    if fd in fds]
            self.fds_at.append((len(self.out), segs))
        data = b"".join(bytes(b) for b in buffers)
        self.sendall(data)
        return len(data)

    def sendall(self, data):
        self.out += data
        while self.whole + wire.HEADER.size <= len(self.out):
            (n,) = wire.HEADER.unpack_from(self.out, self.whole)
            if self.whole + wire.HEADER.size + n > len(self.out):
                break
            self.whole += wire.HEADER.size + n
        if self.whole == len(self.out):
            self._flush()

    def _flush(self):
        conn = self.conn
        frames, fds_at = bytes(self.out), self.fds_at
        self.out, self.whole, self.fds_at = bytearray(), 0, []
        uploads, conn.uploads = conn.uploads, []
        meta = pickle.dumps({"fds": fds_at, "in": uploads, "out": conn.take_outputs()})
        arena = conn.arena.segments
        regions = [_bytes_of(arena[seg][1], off, n) for seg, off, n in uploads]
        try:
            _send_transfer(self.pg, FRAMES, frames, meta, regions, HUB, UP,
                           self.timeout_s + GRACE_S)
        except RuntimeError as e:
            raise self._gone(f"rank {self.rank_id} cannot reach", e) from None

    # receiving
    def recvmsg(self, bufsize, ancbufsize=0):
        return self.recv(bufsize), [], 0, None

    def recv(self, bufsize):
        if not self.inbox:
            self._receive()
        data = bytes(self.inbox[:bufsize])
        del self.inbox[:bufsize]
        return data

    def _receive(self):
        """Waits (bounded by the run's timeout) for the hub's next transfer."""
        if self.lost is not None and self.arrived.empty():
            raise self.lost
        try:
            item = self.arrived.get(timeout=self.timeout_s + GRACE_S)
        except queue.Empty:
            self.lost = wire.Closed(f"rank {self.rank_id}: the cocemu hub's host "
                                    f"{self.hub_host} did not answer within "
                                    f"{self.timeout_s + GRACE_S:g} s (gone or unreachable)")
            raise self.lost from None
        if isinstance(item, BaseException):
            raise item
        self.inbox += item

    def _receive_all(self):
        """The receiving thread: each transfer from the hub, its arrays received in place in
        the arena (only answers to a call the rank waits for carry any). A receive is always
        posted, so the hub's abort reaches the rank while it computes; the hub's host going
        away is said at once on stderr, as torchrun may end the rank before its next call."""
        import torch
        while True:
            control = torch.empty(CONTROL, dtype=torch.uint8)
            try:
                self.pg.recv([control], HUB, DOWN).wait()
                kind, nframes, nmeta = HEAD.unpack(control[:HEAD.size].numpy().tobytes())
                if kind == CLOSED:
                    self.lost = wire.Closed(f"the cocemu hub on {self.hub_host} closed rank "
                                            f"{self.rank_id}'s connection")
                    self.arrived.put(self.lost)
                    return
                body = _body(self.pg, control, nframes + nmeta, HUB, DOWN)
                arena = self.conn.arena.segments
                targets = []
                for token, seg, off, n in pickle.loads(body[nframes:]):
                    t = self.conn.landing(token, seg, off, n)
                    targets.append(_bytes_of(arena[seg][1], off, n) if t is None else t)
                works = [self.pg.recv([t], HUB, DOWN) for t in targets]
                for w in works:
                    w.wait()
            except Exception as e:  # gloo's RuntimeError: the connection is lost
                self.lost = self._gone(f"rank {self.rank_id} lost", e)
                print(f"cocemu: {self.lost}", file=sys.stderr, flush=True)
                self.arrived.put(self.lost)
                return
            self.arrived.put(body[:nframes])

    def finish(self, timeout_s=5.0):
        """After the rank's last call: waits (bounded) for the hub to close the connection, so
        no gloo receive is pending when the process exits (gloo aborts the process then)."""
        self.receiver.join(timeout_s)

    def close(self):
        pass


def _body(pg, control, n, peer, tag):
    """The frames and metadata of a transfer whose control message is `control`."""
    import torch
    inline = control[HEAD.size:HEAD.size + min(n, CONTROL - HEAD.size)].numpy().tobytes()
    if len(inline) == n:
        return inline
    rest = torch.empty(n - len(inline), dtype=torch.uint8)
    pg.recv([rest], peer, tag).wait()
    return inline + rest.numpy().tobytes()


def _send_transfer(pg, kind, frames, meta, regions, peer, tag, timeout_s=None):
    """One transfer: the control message (header, then frames and metadata as far as they fit),
    the rest of them if they did not, then each region's bytes."""
    import torch
    data = HEAD.pack(kind, len(frames), len(meta)) + frames + meta
    sends = [torch.frombuffer(bytearray(data[:CONTROL]), dtype=torch.uint8)]
    if len(data) > CONTROL:
        sends.append(torch.frombuffer(bytearray(data[CONTROL:]), dtype=torch.uint8))
    sends += regions
    works = [pg.send([t], peer, tag) for t in sends]
    for w in works:
        if timeout_s is None:
            w.wait()
        else:
            w.wait(datetime.timedelta(seconds=timeout_s))


class RemoteConnection(_client.Connection):
    """A rank on another host than the hub: process mode's rank side over a gloo Channel. Every
    array is copied into the arena (nothing is shared across hosts); the bytes a call reads go
    to the hub with it, the bytes it writes come back when the hub reports it complete."""

    def __init__(self, channel, rank_id, timeout_s):
        super().__init__(channel, rank_id, timeout_s)
        channel.start(self)
        self.share_bytes = 1 << 62   # no torch storage is shared with a hub on another host
        self.uploads = []            # [(segment, offset, bytes)] copied in since the last send
        self.reported = 0            # the last token whose outputs the hub has been told
        self.calling = None
        self.landed = set()          # (token, segment, offset) received into the rank's array

    def call(self, hid, name, args, kwargs):
        with self.lock:
            self.calling = name
            try:
                return super().call(hid, name, args, kwargs)
            except wire.Closed as e:  # a send failed: the hub's host is gone
                self.closed = _error(f"rank {self.rank_id}: the cocemu hub has gone ({e}): the "
                                     f"run ended", "peer_failed")
                raise self.closed from None

    def _array(self, a, regions, is_output):
        fresh = (a.ctypes.data, a.nbytes) not in self.copies
        whole = is_output and self.calling in WHOLE_OUTPUTS
        if fresh and whole and a.nbytes and a.flags.c_contiguous and not self._overlaps(a):
            # overwritten whole by the call: a place in the arena, not a copy of the array
            seg, off, n = self.arena.alloc(a.nbytes)
            self.copies[(a.ctypes.data, a.nbytes)] = [seg, off, n, 1]
            regions.append((a, seg, off, n, is_output))
            return wire.Shm(seg, off, a.shape, a.dtype.str)
        encoded = super()._array(a, regions, is_output)
        if fresh and a.nbytes and not whole:
            _, seg, off, _, _ = regions[-1]
            self.uploads.append((seg, off, a.nbytes))
        return encoded

    def _overlaps(self, a):
        start, end = a.ctypes.data, a.ctypes.data + a.nbytes
        return any(s < end and start < s + size for s, size in self.copies)

    def end(self, value):
        super().end(value)
        self.sock.finish()

    def fail(self, exc):
        super().fail(exc)
        self.sock.finish()

    def landing(self, token, seg, off, n):
        """Where the output region (seg, off) of call `token` is received: straight into the
        rank's own array when no later call works on its copy (it skips the copy out of the
        arena), else None (into the arena). Called by the receiving thread while the rank waits
        for this answer."""
        import torch
        for a, s, o, _, is_output in self.pending.get(token, ()):
            if s == seg and o == off and is_output and a.nbytes == n:
                copy = self.copies.get((a.ctypes.data, a.nbytes))
                if copy is None or copy[3] != 1:
                    return None
                self.landed.add((token, seg, off))
                return torch.from_numpy(a.reshape(-1).view(np.uint8))
        return None

    def _copy_back(self, token):
        regions = self.pending.get(token)
        if regions and self.landed:
            self.pending[token] = [(a, s, o, n, out and (token, s, o) not in self.landed)
                                   for a, s, o, n, out in regions]
            self.landed -= {(token, s, o) for _, s, o, _, _ in regions}
        super()._copy_back(token)

    def take_outputs(self):
        """{token: [(segment, offset, bytes)]}: what the calls sent since the last transfer
        write, which the hub returns when it reports them complete."""
        out = {}
        for token in range(self.reported + 1, self.token + 1):
            regions = self.pending.get(token)
            if regions:
                out[token] = [(seg, off, a.nbytes) for a, seg, off, _, is_output in regions
                              if is_output and a.nbytes]
        self.reported = self.token
        return out


def connect(rank, config, hub_run, hub_host, timeout_s):
    """Connects rank `rank` of this host to the hub on `hub_host` (run `hub_run`) through gloo;
    returns its RemoteConnection after the hub's hello."""
    own = address_toward(hub_host)
    store = run_store(rendezvous_store(timeout_s), hub_run)
    store.set(f"where/{rank}", f"remote {own}")
    pg = process_group(store, RANK, own, rank, timeout_s,
                       f"rank {rank} (on {own}) and the cocemu hub on {hub_host}")
    conn = RemoteConnection(Channel(pg, hub_host, rank, timeout_s), rank, timeout_s)
    conn.hello(f"{os.getpid()} on {own}", config)
    return conn


def announce_local(rank, hub_run, timeout_s):
    """Rank `rank` shares the hub's host: the hub does not wait for a gloo connection from it."""
    run_store(rendezvous_store(timeout_s), hub_run).set(f"where/{rank}", "local")


# --- the hub's side ------------------------------------------------------------------------------

class Bridge:
    """In the hub process, rank `rank` on another host: a local rank process to the hub (its
    frames over the hub's Unix socket, its arena mirrored in memfds whose fds the hub maps)."""

    def __init__(self, hub_address, rank, peer, store, timeout_s):
        self.hub_address, self.rank, self.peer = hub_address, rank, peer
        self.store, self.timeout_s = store, timeout_s
        self.mirror = {}      # segment -> (fd, mmap)
        self.outputs = {}     # token -> [(segment, offset, bytes)]
        self.sock = None
        self.pg = None
        self.down_thread = None
        self.up_thread = threading.Thread(target=self.up, daemon=True,
                                          name=f"cocemu-bridge-{rank}")
        self.up_thread.start()

    def up(self):
        import mmap
        import torch
        try:
            self.pg = process_group(self.store, HUB, address_toward(self.peer), self.rank,
                                    self.timeout_s, f"the cocemu hub and rank {self.rank} on "
                                    f"{self.peer}")
        except Exception:  # the hub's accept names the rank that did not connect
            return
        control = torch.empty(CONTROL, dtype=torch.uint8)
        while True:
            try:
                self.pg.recv([control], RANK, UP).wait()
                kind, nframes, nmeta = HEAD.unpack(control[:HEAD.size].numpy().tobytes())
                body = _body(self.pg, control, nframes + nmeta, RANK, UP)
                frames, meta = body[:nframes], pickle.loads(body[nframes:])
                fds = {}
                for at, segs in meta["fds"]:
                    fds[at] = []
                    for seg, size in segs:
                        fd = os.memfd_create(f"cocemu-remote-{self.rank}-{seg}", os.MFD_CLOEXEC)
                        os.ftruncate(fd, size)
                        self.mirror[seg] = (fd, mmap.mmap(fd, size))
                        fds[at].append(fd)
                works = [self.pg.recv([_bytes_of(self.mirror[seg][1], off, n)], RANK, UP)
                         for seg, off, n in meta["in"]]
                for w in works:
                    w.wait()
                self.outputs.update(meta["out"])
            except RuntimeError:  # the rank's process ended, or its host is gone
                self._close()
                return
            try:
                if self.sock is None:
                    self.sock = socket.socket(socket.AF_UNIX,
                                              socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
                    self.sock.connect(self.hub_address)
                    self.down_thread = threading.Thread(target=self.down, daemon=True,
                                                        name=f"cocemu-bridge-{self.rank}-down")
                    self.down_thread.start()
                start = 0
                for at in sorted(fds):
                    if at > start:
                        self.sock.sendall(frames[start:at])
                    (n,) = wire.HEADER.unpack_from(frames, at)
                    end = at + wire.HEADER.size + n
                    socket.send_fds(self.sock, [frames[at:end]], fds[at])
                    start = end
                if start < len(frames):
                    self.sock.sendall(frames[start:])
            except OSError:  # the hub has ended the rank
                return

    def down(self):
        sock = self.sock
        while True:
            try:
                head = wire._exact(sock, wire.HEADER.size)
                (n,) = wire.HEADER.unpack(head)
                data = wire._exact(sock, n)
            except (wire.Closed, OSError):
                try:
                    _send_transfer(self.pg, CLOSED, b"", b"", [], RANK, DOWN)
                except RuntimeError:
                    pass
                return
            message = pickle.loads(data)
            regions = []
            if message[0] in ("ok", "err"):
                for token in message[2]:
                    regions += [(token, *r) for r in self.outputs.pop(token, ())]
            tensors = [_bytes_of(self.mirror[seg][1], off, n) for _, seg, off, n in regions]
            try:
                _send_transfer(self.pg, FRAMES, head + data, pickle.dumps(regions), tensors,
                               RANK, DOWN)
            except RuntimeError:  # the rank is gone: its up side tells the hub
                return

    def _close(self):
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def finish(self, timeout_s):
        """Waits (bounded) until the hub's last answers have gone to the rank."""
        if self.down_thread is not None:
            self.down_thread.join(timeout_s)


class Bridges:
    """The hub's side for a run on several hosts: a Bridge for every rank that says it is on
    another host (its `where/<rank>` key in the run's store)."""

    def __init__(self, hub_address, world_size, run, timeout_s):
        self.bridges = []
        self.thread = threading.Thread(target=self.watch, daemon=True, name="cocemu-hosts",
                                       args=(hub_address, world_size, run, timeout_s))
        self.thread.start()

    def watch(self, hub_address, world_size, run, timeout_s):
        try:
            store = run_store(rendezvous_store(timeout_s), run)
            for r in range(1, world_size):
                where = store.get(f"where/{r}").decode()
                if where.startswith("remote "):
                    self.bridges.append(Bridge(hub_address, r, where.split()[1], store,
                                               timeout_s))
        except Exception:  # a rank that never says where it is: the hub's accept names it
            return

    def finish(self, timeout_s=5.0):
        deadline = time.monotonic() + timeout_s
        for b in list(self.bridges):
            b.finish(max(0.0, deadline - time.monotonic()))


def _error(message, code):
    import cocemu
    e = cocemu.Error(message)
    e.code, e.rank = code, None
    return e
