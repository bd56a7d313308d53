"""Threads and the GIL (R-PY-3): ranks calling back into Python from every rank thread and
stream, blocking waits that release the GIL, schedule seeds that change nothing."""
import gc
import subprocess
import sys
import threading
import time
import weakref

import numpy as np
import pytest

import cocemu


def callback_program(rank):
    """Python on the host thread and in ops on two streams of every rank, then collectives."""
    seen = []
    x = rank.zeros((64,), "f32")
    y = rank.zeros((64,), "f32")
    rank.compute_stream.launch("fill x", lambda: x.fill(rank.id + 1), work_ns=1000)
    side = rank.new_stream("side")
    side.launch("fill y", lambda: y.fill(2 * (rank.id + 1)), work_ns=1500)
    rank.compute_stream.wait_stream(side)
    cocemu.all_reduce(rank.world, x)
    cocemu.all_reduce(rank.world, y, op="max")
    rank.compute_stream.launch("note", lambda: seen.append(float(x[0])), work_ns=10)
    rank.synchronize()
    return (seen[0], float(y[0]), threading.get_ident())


@pytest.mark.parametrize("n", [8, 64])
def test_every_rank_calls_back_into_python(n):
    r = cocemu.run(n, callback_program)
    total = n * (n + 1) / 2
    assert [v[:2] for v in r.returns] == [(total, 2.0 * n)] * n
    assert len({v[2] for v in r.returns}) == n  # each rank function ran on its own thread
    assert r.makespan_ns > 0


def test_schedule_seeds_change_nothing():
    """20 seeds: identical results and byte-identical modeled traces (as from C++)."""
    def program(rank):
        x = rank.zeros((257,), "f32")
        rank.compute_stream.launch("init", lambda: x.fill(rank.id), work_ns=700)
        w = cocemu.all_reduce(rank.world, x, async_op=True)
        out = rank.zeros((8 * 257,), "f32")
        w.wait()
        cocemu.all_gather(rank.world, out, x)
        sub = cocemu.split(rank.world, rank.id % 2, rank.id)
        cocemu.broadcast(sub, x, 0)
        rank.synchronize()
        return out.tobytes() + x.tobytes()

    reference = cocemu.run(8, program, schedule_seed=0)
    trace = reference.chrome_trace()
    for seed in range(1, 21):
        r = cocemu.run(8, program, schedule_seed=seed)
        assert r.returns == reference.returns, f"seed {seed}"
        assert r.chrome_trace() == trace, f"seed {seed}"


def test_blocking_waits_release_the_gil():
    """Rank 1 runs Python (holding the GIL in turns) before it joins the barrier rank 0 waits in:
    if the barrier kept the GIL, rank 1 could never get there and the run would time out."""
    def body(rank):
        if rank.id == 1:
            total = 0
            for i in range(200000):  # pure Python: needs the GIL
                total += i
        cocemu.barrier(rank.world)
        rank.synchronize()
        return rank.id
    assert cocemu.run(2, body, timeout_s=20).returns == [0, 1]


def test_stream_callables_run_while_host_waits():
    """The host synchronizes (GIL released) while its stream runs Python that needs the GIL."""
    def body(rank):
        log = []
        for i in range(20):
            rank.compute_stream.launch(f"op{i}", lambda i=i: log.append(i), work_ns=100)
        rank.compute_stream.synchronize()
        ev = rank.compute_stream.record()
        ev.synchronize()
        assert ev.query()
        return log
    r = cocemu.run(4, body, timeout_s=20)
    assert r.returns == [list(range(20))] * 4


def test_python_objects_held_by_cpp_are_released():
    class Payload:
        pass

    refs = []

    def body(rank):
        p = Payload()
        refs.append(weakref.ref(p))
        a = np.zeros(16, np.float32)  # the user's array, kept alive by the collective
        refs.append(weakref.ref(a))
        rank.compute_stream.launch("keep", lambda p=p: None, work_ns=1)
        cocemu.all_reduce(rank.world, a)
        rank.synchronize()

    cocemu.run(8, body)
    gc.collect()
    assert refs and all(r() is None for r in refs)


def test_numpy_first_used_on_a_rank_thread():
    """A fresh interpreter whose first NumPy use is on rank threads (pybind11 would otherwise
    initialise NumPy's API there, racing the other ranks for the GIL)."""
    code = ("import cocemu\n"
            "r = cocemu.run(8, lambda rank: float(rank.zeros((4,), 'f32').sum()))\n"
            "print(r.returns)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str([0.0] * 8)


def test_current_rank_inside_and_outside():
    def body(rank):
        assert cocemu.current_rank() is rank
        return cocemu.current_rank().id
    assert cocemu.run(4, body).returns == [0, 1, 2, 3]
    with pytest.raises(cocemu.Error, match="not called from a rank"):
        cocemu.current_rank()


def test_a_loop_of_async_collectives_stays_within_the_launch_queue():
    # Each stream holds at most 1024 launched ops (a launch on a full stream blocks the host,
    # without the GIL, which the other ranks need to launch their side of the collectives).
    n_ops = 4000

    def body(rank):
        x = np.full(256, rank.id + 1, np.float32)
        most = 0
        for _ in range(n_ops):
            cocemu.all_reduce(rank.world, x, op="max", async_op=True)
            most = max(most, rank.comm_stream.queued, rank.compute_stream.queued)
        rank.synchronize()
        return most, float(x[0])

    r = cocemu.run(4, body, timeout_s=60)
    for most, value in r.returns:
        assert 0 < most <= 1024
        assert value == 4.0
