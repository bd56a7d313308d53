"""Ranks as processes (R-PY-17..19): ct.run(processes=True) and torchrun with
init_process_group("cocemu") give the bits and modeled nanoseconds of rank threads; module state
is per rank; a rank that raises, exits or is killed is named to the run; nothing outlives it."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

import cocemu  # noqa: E402
import cocemu.torch as ct  # noqa: E402

WORLD = 4
PYTHON = sys.executable


def program():
    """Streams, async collectives, p2p, a subgroup, an object collective, device random numbers
    and one DDP step: every kind of call a rank process sends to the hub."""
    r, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(7)
    torch.cuda.manual_seed(11 + r)
    noise = torch.randn(64, 64, device="cuda")
    w = torch.randn(64, 64, device="cuda")
    y = noise @ w
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        z = (y * 2).sum(dim=0)
        work = dist.all_reduce(z, async_op=True)
    work.wait()
    torch.cuda.current_stream().wait_stream(side)
    gathered = torch.empty(n * 8, device="cuda")
    dist.all_gather_into_tensor(gathered, y[0, :8].contiguous())
    shard = torch.empty(16, device="cuda")
    dist.reduce_scatter_tensor(shard, y[:, : 16 * n].sum(dim=0).contiguous())
    dist.broadcast(w[0], src=n - 1)
    send, recv = y[1].clone(), torch.empty(64, device="cuda")
    ops = [dist.P2POp(dist.isend, send, (r + 1) % n), dist.P2POp(dist.irecv, recv, (r - 1) % n)]
    for op in dist.batch_isend_irecv(ops):
        op.wait()
    half = dist.new_group(list(range(n // 2)))
    if r < n // 2:
        dist.all_reduce(recv, group=half)
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": r, "norm": float(z.norm())})
    model = nn.Linear(8, 4).cuda()
    ddp = nn.parallel.DistributedDataParallel(model)
    ddp(y[:, :8]).square().mean().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    return [t.cpu() for t in (z, gathered, shard, w[0], recv, *grads)] + [objs]


def bitwise(a, b):
    return all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
               for x, y in zip(a, b)) and len(a) == len(b)


def test_processes_give_the_bits_and_nanoseconds_of_threads():
    threads = ct.run(program, world_size=WORLD)
    procs = ct.run(program, world_size=WORLD, processes=True)
    assert procs.makespan_ns == threads.makespan_ns > 0
    for rank in range(WORLD):
        assert bitwise(procs.returns[rank], threads.returns[rank]), rank
    assert procs.ops_recorded == threads.ops_recorded
    assert procs.peak_memory_bytes == threads.peak_memory_bytes
    assert len(procs.ops(0)) == len(threads.ops(0))
    # the ring really moved rows: ranks 2 and 3 (outside the subgroup) hold different ones
    assert not torch.equal(procs.returns[2][4], procs.returns[3][4])


def test_schedule_seeds_do_not_change_a_process_run():
    base = ct.run(program, world_size=WORLD, processes=True)
    seeded = ct.run(program, world_size=WORLD, processes=True, schedule_seed=12345)
    assert seeded.makespan_ns == base.makespan_ns
    assert all(bitwise(a, b) for a, b in zip(seeded.returns, base.returns))


STATE = {"rank": None}  # module state, as Megatron's parallel_state keeps its groups


def set_and_read_module_state():
    STATE["rank"] = dist.get_rank()
    dist.barrier()  # every rank has written before any reads
    return STATE["rank"], os.getpid()


def test_module_state_is_per_rank_in_processes():
    r = ct.run(set_and_read_module_state, world_size=WORLD, processes=True)
    assert [x[0] for x in r.returns] == list(range(WORLD))
    assert len({x[1] for x in r.returns}) == WORLD and os.getpid() not in {x[1] for x in r.returns}
    # on threads the module is shared: the last writer wins for everyone
    t = ct.run(set_and_read_module_state, world_size=WORLD)
    assert len({x[0] for x in t.returns}) == 1


def rank_two_raises():
    if dist.get_rank() == 2:
        raise KeyError("rank two gives up")
    dist.all_reduce(torch.ones(4))


def rank_one_exits():
    dist.all_reduce(torch.ones(4))
    if dist.get_rank() == 1:
        os._exit(3)
    dist.all_reduce(torch.ones(4))


def rank_three_is_killed():
    if dist.get_rank() == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(4))


def shm_entries():
    """/dev/shm's entries. cocemu's segments are memfds (no name at all), so any new entry is a
    leak; Python's multiprocessing semaphores (sem.mp-*) of other programs running beside the
    test on a shared machine are left out."""
    if not os.path.isdir("/dev/shm"):
        return set()
    return {e for e in os.listdir("/dev/shm") if not e.startswith("sem.mp-")}


@pytest.mark.parametrize("fn, kind, rank, words", [
    (rank_two_raises, KeyError, 2, "rank two gives up"),
    (rank_one_exits, cocemu.Error, 1, "exited with code 3 after its all_reduce"),
    (rank_three_is_killed, cocemu.Error, 3, "killed by signal SIGKILL"),
])
def test_a_failing_rank_is_named_and_nothing_outlives_the_run(fn, kind, rank, words):
    import multiprocessing
    before = shm_entries()
    t0 = time.monotonic()
    with pytest.raises(kind) as e:
        ct.run(fn, world_size=WORLD, processes=True, timeout_s=30)
    assert time.monotonic() - t0 < 20  # named within the timeout, not at it
    assert e.value.rank == rank and words in str(e.value)
    if kind is cocemu.Error:
        assert f"rank {rank} (pid " in str(e.value)
    assert [p for p in multiprocessing.active_children() if p.name.startswith("cocemu-rank")] \
        == []
    assert shm_entries() <= before


def test_bad_arguments_are_refused():
    with pytest.raises(cocemu.Error, match="processes = 'yes' must be True or False"):
        ct.run(program, processes="yes")
    with pytest.raises(cocemu.Error, match="fn must be importable"):
        ct.run(lambda: 1, world_size=2, processes=True)
    with pytest.raises(cocemu.Error, match="profile must be a profile name or YAML path"):
        ct.run(program, world_size=2, processes=True, profile=cocemu.load_profile("ascend-910b"))


def run_script(tmp_path, body, nproc, env=None, timeout=240):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    cmd = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(nproc), str(script)]
    e = dict(os.environ, OPENBLAS_NUM_THREADS="1", COCEMU_OUTPUT=str(tmp_path / "out"),
             **(env or {}))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e,
                          cwd=tmp_path)


TORCHRUN_BODY = """
    import torch, torch.distributed as dist
    import cocemu.torch
    import test_torch_processes as t
    dist.init_process_group("cocemu")
    out = t.program()
    torch.save(out, f"rank{dist.get_rank()}.pt")
    dist.destroy_process_group()
"""


def test_torchrun_runs_the_program_with_the_same_bits_and_makespan(tmp_path):
    p = run_script(tmp_path, TORCHRUN_BODY, WORLD,
                   env={"PYTHONPATH": os.pathsep.join(sys.path)})
    assert p.returncode == 0, p.stderr[-3000:]
    threads = ct.run(program, world_size=WORLD)
    for rank in range(WORLD):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        assert bitwise(got, threads.returns[rank]), rank
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert f"makespan_ns {threads.makespan_ns}" in summary
    assert (tmp_path / "out" / "trace.json").stat().st_size > 0


def test_torchrun_ends_when_a_rank_exits_and_leaves_no_hub(tmp_path):
    before = shm_entries()
    p = run_script(tmp_path, """
        import os, torch, torch.distributed as dist
        import cocemu.torch
        dist.init_process_group("cocemu")
        print("pid", os.getpid(), flush=True)
        dist.all_reduce(torch.ones(4))
        if dist.get_rank() == 1:
            os._exit(5)
        dist.all_reduce(torch.ones(4))
    """, 3)
    assert p.returncode != 0
    assert "exitcode  : 5" in p.stderr
    time.sleep(0.5)
    hubs = subprocess.run(["pgrep", "-f", "cocemu.processes --world-size"], capture_output=True,
                          text=True).stdout.split()
    assert [h for h in hubs if _is_child_of_none_alive(h)] == []
    assert shm_entries() <= before


def _is_child_of_none_alive(pid):
    """A hub left running after its torchrun ended would be reparented (its parent gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1]) == 1
    except OSError:
        return False


CTRL_C_BODY = """
    import sys, time, torch, torch.distributed as dist
    sys.path.insert(0, {here!r})
    import cocemu.torch as ct
    import test_torch_processes as t
    if __name__ == "__main__":
        try:
            ct.run(t.spin, world_size=4, processes=True, timeout_s=600)
        except KeyboardInterrupt:
            print("interrupted at", time.monotonic(), file=sys.stderr, flush=True)
            raise
"""


def spin():
    import pathlib
    pathlib.Path(os.environ["COCEMU_TEST_MARK"], str(os.getpid())).touch()
    while True:
        dist.all_reduce(torch.ones(4))


def test_ctrl_c_stops_every_rank_process_within_a_second(tmp_path):
    marks = tmp_path / "pids"
    marks.mkdir()
    script = tmp_path / "launch.py"
    script.write_text(textwrap.dedent(CTRL_C_BODY.format(here=os.path.dirname(__file__))))
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", COCEMU_TEST_MARK=str(marks))
    p = subprocess.Popen([PYTHON, str(script)], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(list(marks.iterdir())) < 4:
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.05)
    time.sleep(0.3)
    ranks = [int(m.name) for m in marks.iterdir()]
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    # The ranks stop at once; the launcher's and its fork server's interpreters then end (torch's
    # teardown, seconds on a loaded machine), which is not the run's to bound.
    while any(_running(pid) for pid in ranks):
        assert time.monotonic() - t0 < 3.0, [pid for pid in ranks if _running(pid)]
        time.sleep(0.02)
    _, err = p.communicate(timeout=60)
    assert "KeyboardInterrupt" in err
    interrupted = float(err.split("interrupted at ")[1].split()[0])
    assert interrupted - t0 < 2.0, err
    assert not any(_running(pid) for pid in ranks)


def _running(pid):
    """Whether process `pid` runs (a zombie waiting to be reaped has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_wait_unmodeled_waits_for_the_data_and_records_nothing():
    def body(rank, wait):
        x = rank.zeros((256,), "f32")
        x[:] = rank.id + 1
        w = cocemu.all_reduce(rank.world, x, async_op=True)
        if wait:
            cocemu.wait_unmodeled(w)  # the hub's and the torch layer's wait for a Work's data
            seen = float(x[0])
        w.wait()
        rank.synchronize()
        return seen if wait else float(x[0])
    a = cocemu.run(4, lambda rank: body(rank, True))
    b = cocemu.run(4, lambda rank: body(rank, False))
    assert a.returns == b.returns == [10.0] * 4
    assert a.makespan_ns == b.makespan_ns and len(a.ops(0)) == len(b.ops(0))


SHARED = {}


def use_another_ranks_global_group():
    g = dist.new_group([0, 1])
    if dist.get_rank() == 1:
        SHARED["tp"] = g  # a module global: on threads every rank reads the last writer's
    dist.barrier()
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(2), group=SHARED["tp"])


def test_on_threads_a_shared_global_group_is_an_error_naming_the_process_mode():
    with pytest.raises(ValueError, match="not initialized in the world group map") as e:
        ct.run(use_another_ranks_global_group, world_size=2)
    notes = "\n".join(e.value.__notes__)
    assert "module-level state" in notes and "processes=True" in notes


def large_tensors():
    """Tensors above the zero-copy size: their storages are shared with the hub, not copied;
    new ones each step (freed storages are dropped by the hub), views of a shared storage, and a
    bf16 reduce-scatter."""
    r, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(r)
    out = []
    for step in range(3):
        x = torch.randn(1 << 17, device="cuda")  # 512 KiB
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        g = torch.empty(n, 1 << 16, device="cuda")
        dist.all_gather_into_tensor(g, x[: 1 << 16])
        h = torch.empty(1 << 16, dtype=torch.bfloat16, device="cuda")
        dist.reduce_scatter_tensor(h, g.to(torch.bfloat16).reshape(-1))
        out.append((x[::4096].clone(), g[:, ::4096].clone(), h[::4096].clone()))
    return out


def test_large_tensors_shared_in_place_give_the_bits_of_threads():
    from cocemu.processes import client
    assert (1 << 17) * 4 >= client.SHARE_BYTES
    threads = ct.run(large_tensors, world_size=WORLD)
    procs = ct.run(large_tensors, world_size=WORLD, processes=True)
    assert procs.makespan_ns == threads.makespan_ns
    for a, b in zip(procs.returns, threads.returns):
        for xa, xb in zip(a, b):
            assert all(torch.equal(u, v) for u, v in zip(xa, xb))


def pipelined_error():
    from cocemu.torch import _state
    st = _state.current()
    x = torch.ones(4).numpy()
    w = st.api.all_reduce(st.rank.world, x, op="bogus", async_op=True)  # sent without waiting
    try:
        st.api.wait_unmodeled(w)
    except cocemu.Error as e:
        return str(e), "\n".join(getattr(e, "__notes__", []))
    return None


def test_an_error_of_a_call_sent_without_waiting_comes_with_the_next_call():
    r = ct.run(pipelined_error, world_size=2, processes=True)
    for message, notes in r.returns:
        assert "bogus" in message
        assert "earlier call all_reduce" in notes


def writes_per_collective():
    """Socket writes of a rank process for blocking and async collectives."""
    from cocemu.processes import wire
    counts = {"writes": 0}
    send = wire.send

    def counting(*args, **kwargs):
        counts["writes"] += 1
        return send(*args, **kwargs)
    x = torch.ones(1024)
    dist.all_reduce(x)
    wire.send = counting
    try:
        for _ in range(5):
            dist.all_reduce(x)                           # launch, stream wait, data wait
            dist.broadcast(x, 0)
        blocking = counts["writes"]
        counts["writes"] = 0
        works = [dist.all_reduce(x, async_op=True) for _ in range(3)]  # sent at once
        launched = counts["writes"]
        for w in works:
            w.wait()
    finally:
        wire.send = send
    return blocking, launched, x[0].item()


def test_a_blocking_collective_is_one_write_and_an_async_one_is_sent_at_once():
    """A collective torch waits for at once crosses the socket in one write (its launch and
    stream wait go with the wait for its data); an async collective is sent at its launch, so
    the other ranks can match it while this one computes."""
    r = ct.run(writes_per_collective, world_size=2, processes=True)
    for blocking, launched, value in r.returns:
        assert blocking == 10
        assert launched == 3
        assert value == 2 ** 9  # 1 + 5 blocking and 3 chained async all_reduces of 2 ranks


def chained_async_in_place():
    x = torch.arange(8, dtype=torch.float32) + dist.get_rank()
    works = [dist.all_reduce(x, async_op=True) for _ in range(3)]
    works.append(dist.broadcast(x, 1, async_op=True))
    for w in works:
        w.wait()
    return x.tolist()


def test_async_collectives_chained_in_place_on_a_small_tensor_match_threads():
    """A small tensor crosses as a copy; collectives launched on it before the first completes
    work on that copy in stream order, as on the tensor itself."""
    threads = ct.run(chained_async_in_place, world_size=WORLD)
    procs = ct.run(chained_async_in_place, world_size=WORLD, processes=True)
    assert procs.returns == threads.returns
    assert threads.returns[0][1] == (4 + 6) * 4 ** 2  # sum of ranks 1..: (1*4+6), doubled twice


def overlapping_views():
    x = torch.ones(8)
    w = dist.all_reduce(x, async_op=True)
    try:
        dist.all_reduce(x[:4], async_op=True).wait()
    finally:
        w.wait()


def test_a_view_overlapping_an_unfinished_calls_copy_is_an_error():
    with pytest.raises(cocemu.Error, match="overlaps, without being it"):
        ct.run(overlapping_views, world_size=2, processes=True, timeout_s=20)


def reallocating():
    """Each step makes new device tensors and reduces them, blocking and async: a step's
    tensors die when the next step replaces them."""
    r = dist.get_rank()
    for _ in range(5):
        x = torch.full((256 * 1024,), float(r), device="cuda")  # 1 MiB
        dist.all_reduce(x)
        dist.all_reduce(x, async_op=True).wait()
        y = x * 2
    assert float(y[0]) == 2 * sum(range(dist.get_world_size())) * dist.get_world_size()
    return torch.cuda.max_memory_allocated()


def test_dead_tensors_leave_the_modeled_memory_in_both_modes():
    # The peak is the new x beside the last step's x and y (3 MiB), whatever the collectives
    # held while they ran: on threads as in processes.
    threads = ct.run(reallocating, world_size=2)
    procs = ct.run(reallocating, world_size=2, processes=True)
    assert threads.returns == procs.returns == [3 << 20] * 2
    assert threads.peak_memory_bytes == procs.peak_memory_bytes == [3 << 20] * 2


def test_the_wire_reader_splits_frames_and_gives_each_its_file_descriptors():
    """Frames that arrive together are read together and handed out one by one; descriptors go
    with the frame whose header carried them, even behind a frame still buffered; a frame larger
    than a read, and one cut by the socket's timeout, arrive whole; a closed peer is Closed."""
    import socket
    from cocemu.processes import hub, wire
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    r, w = os.pipe()
    try:
        reader = wire.Reader(b)
        big = bytes(range(256)) * (3 * wire.Reader.CHUNK // 256)
        wire.send(a, ("first", 1))                    # no fds, still buffered when …
        wire.send(a, ("second", [2]), fds=(r, w))     # … this one's fds arrive
        wire.send(a, ("calls", [("big", big), ("x", None)]))
        first, second, third = reader.recv(), reader.recv(), reader.recv()
        assert first == (("first", 1), [])
        assert second[0] == ("second", [2]) and len(second[1]) == 2
        for fd in second[1]:
            os.fstat(fd)  # open, and ours
            os.close(fd)
        assert third == (("calls", [("big", big), ("x", None)]), [])
        import pickle
        body = pickle.dumps(("late", 3))
        data = wire.HEADER.pack(len(body)) + body
        a.sendall(data[:5])
        b.settimeout(0.05)
        with pytest.raises(socket.timeout):
            reader.recv()
        a.sendall(data[5:8])
        hub._tick(b, 10.0)  # the hub's sockets: the kernel's timeout, one system call a read
        with pytest.raises(BlockingIOError):
            reader.recv()
        a.sendall(data[8:])
        assert reader.recv() == (("late", 3), [])
        a.close()
        with pytest.raises(wire.Closed):
            reader.recv()
    finally:
        os.close(r)
        os.close(w)
        b.close()
