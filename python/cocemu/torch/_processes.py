"""Ranks as processes (R-PY-17..19): `ct.run(fn, processes=True)` and `torchrun` with
`init_process_group("cocemu")`.

Each rank is a process of its own — its own modules, torch generator, current device and
Megatron globals, as on a cluster — and its cocemu calls go to a hub (cocemu.processes.hub), which
makes them on an ordinary cocemu.run's rank threads: the same runtime, the same bits and modeled
nanoseconds as ranks on threads. ct.run runs the hub in the calling process and starts the ranks
from a fork server that has torch and cocemu.torch imported. Under torchrun, rank 0's
init_process_group starts the hub as a process (`python -m cocemu.processes`) and publishes its
address in torch's store; every rank connects to it.

Settings under torchrun come from the environment (COCEMU_PROFILE, COCEMU_NUMERICS,
COCEMU_DETERMINISTIC, COCEMU_SCHEDULE_SEED, COCEMU_TIMEOUT_MS, COCEMU_CHECKED, COCEMU_RECORD,
COCEMU_OUTPUT: the folder the hub writes the run's trace and summary to).
"""
import atexit
import os
import pickle
import signal
import socket
import subprocess
import sys
import time

import torch

import cocemu
from cocemu.processes import client as _client
from cocemu.processes import hub as _hub
from cocemu.processes import hosts as _hosts

from . import _device, _dist, _memory, _mode, _state, _torch2
from ._state import error


def _connect(address, rank, world_size, config, timeout_s):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            sock.connect(address)
            break
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() > deadline:
                raise error(f"rank {rank}: the cocemu hub at {address[1:]!r} did not answer "
                            f"within {timeout_s:g} s", "timeout") from None
            time.sleep(0.01)
    conn = _client.Connection(sock, rank, timeout_s)
    conn.share_bytes = config["share_bytes"]
    conn.hello(os.getpid(), config)
    return conn


def _attach(conn, numerics, checked, timeout_s, profile):
    """This process becomes rank `conn.rank_id`: its cocemu.torch state, answered by the hub."""
    st = _state.RankState(conn.rank, numerics, checked, timeout_s, shared=None, api=conn.api,
                          profile=cocemu.load_profile(profile))
    st.process = conn
    _state.set_process(st)
    _device.install()
    _dist.install()
    torch.set_num_threads(1)  # as a rank thread: the same kernels, the same bits
    return st


def share_storage(st, t):
    """Moves a large tensor's storage into shared memory (torch's share_memory_, once per
    storage) and tells the hub, which then works on it in place. Left to the copy path: small
    tensors, and a storage with a copied array of an unfinished call in it (moving the storage
    would strand that call's copy-back)."""
    conn = st.process
    nbytes = t.numel() * t.element_size()
    if nbytes < conn.share_bytes or t.device.type != "cpu":
        return
    storage = t.untyped_storage()
    start, size = storage.data_ptr(), storage.nbytes()
    if conn.segment_of(start, size) is not None:
        return
    if conn.busy(start, start + size) or any(p[0] < start + size and start < p[1]
                                             for p in st.pending):
        return
    try:
        if not storage.is_shared():
            st.recording += 1  # the move is the transport's, not the program's: not modeled
            try:
                t.share_memory_()  # torch moves the storage in place (its data pointer changes)
            finally:
                st.recording -= 1
            storage = t.untyped_storage()
        fd, size = storage._share_fd_cpu_()[:2]
    except RuntimeError:  # shared some other way (a file name): copied instead
        return
    from torch.multiprocessing.reductions import StorageWeakRef
    ref = StorageWeakRef(storage)
    conn.share(storage.data_ptr(), size, fd, lambda: not ref.expired())


# --- ct.run(processes=True) ----------------------------------------------------------------------

def _child(fn, rank, world_size, address, config, store_port):
    """A rank process started by run(): runs fn and hands its result to the hub."""
    numerics, checked, record, timeout_s, profile = (config[k] for k in (
        "numerics", "checked", "record", "timeout_s", "profile"))
    local = rank % max(int(cocemu.load_profile(profile).devices_per_node), 1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(local),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store_port))
    conn = _connect(address, rank, world_size, config, timeout_s)
    try:
        st = _attach(conn, numerics, checked, timeout_s, profile)
        import datetime
        store = torch.distributed.TCPStore("127.0.0.1", store_port, world_size + 1, False,
                                           datetime.timedelta(seconds=timeout_s))
        _torch2.init_default_group(rank, world_size, store,
                                   datetime.timedelta(seconds=timeout_s))
        st.world = _torch2.default_group()
        st.mode = _mode.Recorder(st, record)
        with st.mode:
            from . import _call
            out = _call(fn)
        st.rank.synchronize()
        _dist.end_rank(st)
        conn.end((out, st.mode.ops, _memory.peak(st)))
    except BaseException as e:
        conn.fail(e)
        sys.exit(1)


_context = None


def _fork_server():
    """Rank processes fork from a server that has torch and cocemu.torch imported (once)."""
    global _context
    if _context is None:
        import multiprocessing
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(["torch", "cocemu.torch"])
    return _context


def run(fn, world_size, profile, deterministic, numerics, schedule_seed, timeout_s, checked,
        record):
    """ct.run(..., processes=True)."""
    if not isinstance(profile, str):
        raise error(f"cocemu.torch.run(processes=True): profile must be a profile name or YAML "
                    f"path (each rank process loads it), got {type(profile).__name__}")
    try:
        pickle.dumps(fn)
    except Exception as e:
        raise error(f"cocemu.torch.run(processes=True): fn must be importable by the rank "
                    f"processes (a module-level function, as torch.multiprocessing.spawn "
                    f"requires), got {fn!r}: {e}") from None
    import datetime
    store = torch.distributed.TCPStore("127.0.0.1", 0, world_size + 1, True,
                                       datetime.timedelta(seconds=timeout_s),
                                       wait_for_workers=False)
    hub = _hub.Hub(world_size, timeout_s)
    config = dict(numerics=numerics, checked=checked, record=record, timeout_s=timeout_s,
                  profile=profile, deterministic=deterministic, share_bytes=share_bytes())
    ctx = _fork_server()
    procs = {}
    try:
        for r in range(world_size):
            p = ctx.Process(target=_child, args=(fn, r, world_size, hub.address, config,
                                                  store.port), daemon=True,
                            name=f"cocemu-rank-{r}")
            p.start()
            procs[r] = p
        hub.processes = procs

        def alive():
            for r, p in procs.items():
                if p.exitcode is not None:
                    raise error(f"cocemu.torch.run: rank {r} (pid {p.pid}) "
                                f"{_hub.describe_exit(p.exitcode)} before connecting")
        hub.accept(alive)
        result = cocemu.run(world_size, hub.serve, profile=profile, deterministic=deterministic,
                            schedule_seed=schedule_seed, dry_run=not numerics,
                            timeout_s=timeout_s)
    except KeyboardInterrupt:
        # Ctrl-C in a terminal reaches every rank process; a signal to the launcher alone is
        # passed on, and the ranks get a moment, not a second, to stop.
        _stop(procs, grace_s=0.2, interrupt=True)
        raise
    finally:
        _stop(procs)
    return result


def _stop(procs, grace_s=1.0, interrupt=False):
    """Every rank process ends: each gets `grace_s` to exit (after a SIGINT with `interrupt`),
    then SIGKILL."""
    if interrupt:
        for p in procs.values():
            if p.exitcode is None:
                try:
                    os.kill(p.pid, signal.SIGINT)
                except ProcessLookupError:
                    pass
    deadline = time.monotonic() + grace_s
    for p in procs.values():
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs.values():
        if p.exitcode is None:
            p.kill()
    for p in procs.values():
        p.join(1.0)


# --- torchrun ------------------------------------------------------------------------------------

def share_bytes():
    """The size from which a tensor's storage is shared with the hub rather than copied:
    COCEMU_SHARE_BYTES (an integer >= 0), else 256 KiB."""
    v = os.environ.get("COCEMU_SHARE_BYTES")
    if not v:
        return _client.SHARE_BYTES
    try:
        n = int(v)
    except ValueError:
        n = -1
    if n < 0:
        raise error(f"COCEMU_SHARE_BYTES = {v!r}: expected a number of bytes >= 0")
    return n


def _env_flag(name, default):
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    if v.lower() in ("1", "true", "yes", "on"):
        return True
    if v.lower() in ("0", "false", "no", "off"):
        return False
    raise error(f"{name} = {v!r}: expected 1/0, true/false, yes/no or on/off")


def settings_from_env():
    from . import _timeout_s
    seed = os.environ.get("COCEMU_SCHEDULE_SEED") or None
    if seed is not None:
        try:
            seed = int(seed)
        except ValueError:
            raise error(f"COCEMU_SCHEDULE_SEED = {seed!r} is not an integer") from None
    return dict(profile=os.environ.get("COCEMU_PROFILE") or "ascend-910b",
                numerics=_env_flag("COCEMU_NUMERICS", True),
                deterministic=_env_flag("COCEMU_DETERMINISTIC", True),
                checked=_env_flag("COCEMU_CHECKED", True), record=_env_flag("COCEMU_RECORD", True),
                timeout_s=_timeout_s(None), schedule_seed=seed,
                output=os.environ.get("COCEMU_OUTPUT") or None)


def _several_hosts():
    """True under a launcher of several agents (torchrun --nnodes > 1): ranks of other hosts may
    join, through gloo (cocemu.processes.hosts)."""
    v = os.environ.get("GROUP_WORLD_SIZE") or "1"
    try:
        return int(v) > 1
    except ValueError:
        raise error(f"GROUP_WORLD_SIZE = {v!r} is not an integer (torchrun sets it)") from None


def attach_torchrun(options):
    """init_process_group("cocemu") in a process of its own (torchrun, or any launcher that
    gives torch a store): connects this rank to the run's hub, which rank 0 starts."""
    rank, world_size, store = options.group_rank, options.group_size, options.store
    s = settings_from_env()
    config = {k: s[k] for k in ("numerics", "checked", "record", "timeout_s", "profile",
                                "deterministic")}
    config["share_bytes"] = share_bytes()
    key = "cocemu/hub"
    hosts = _several_hosts()
    if rank == 0:
        cmd = [sys.executable, "-m", "cocemu.processes", "--world-size", str(world_size),
               "--timeout-s", repr(s["timeout_s"]), "--profile", s["profile"],
               "--deterministic", str(int(s["deterministic"])),
               "--dry-run", str(int(not s["numerics"]))]
        if s["schedule_seed"] is not None:
            cmd += ["--schedule-seed", str(s["schedule_seed"])]
        if s["output"]:
            cmd += ["--output", s["output"]]
        if hosts:
            cmd += ["--hosts", "1"]
        hub = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=dict(os.environ,
                               PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))
        line = hub.stdout.readline().decode().strip()
        if not line.startswith("cocemu-hub "):
            raise error(f"rank 0: the cocemu hub (python -m cocemu.processes) did not start "
                        f"(exit code {hub.poll()})")
        address = "\0" + line.split(" ", 1)[1]
        if hosts:
            store.set(key + "-host", f"{_hosts.identity()} "
                      f"{_hosts.address_toward(os.environ['MASTER_ADDR'])}")
        store.set(key, address[1:])
    else:
        address = "\0" + store.get(key).decode()
    conn = None
    if hosts and rank != 0:
        where, hub_host = store.get(key + "-host").decode().split()
        if where != _hosts.identity():  # the hub's socket and shared memory do not reach here
            conn = _hosts.connect(rank, config, address[1:], hub_host, s["timeout_s"])
        else:
            _hosts.announce_local(rank, address[1:], s["timeout_s"])
    if conn is None:
        conn = _connect(address, rank, world_size, config, s["timeout_s"])
    st = _attach(conn, s["numerics"], s["checked"], s["timeout_s"], s["profile"])
    st.mode = _mode.Recorder(st, s["record"])
    st.mode.__enter__()  # for the rest of the process: torch ops are priced on its streams
    _finish_at_exit(st)
    return st


def _finish_at_exit(st):
    """The process's end ends the rank in the hub: with its exception if one is unhandled."""
    previous = sys.excepthook

    def hook(kind, value, tb):
        if st.process is not None:
            st.process.fail(value)
        previous(kind, value, tb)
    sys.excepthook = hook

    def end():
        conn = st.process
        if conn is None or conn.closed is not None:
            return
        try:
            st.rank.synchronize()
            conn.end(None)
        except Exception:
            pass
    atexit.register(end)
