"""cocemu.torch: plain torch.distributed on rank threads (R-PY-6): every op and dtype the issue
lists, async Work, new_group, and the bad-input errors (rank, group and call named; bounded)."""
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import cocemu  # noqa: E402
import cocemu.torch as ct  # noqa: E402

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int8, torch.int32,
          torch.int64, torch.uint8, torch.bool]


def test_rank_and_world_size_per_thread():
    def fn():
        assert dist.is_initialized()
        dist.init_process_group("nccl")  # unchanged code initialising: accepted, a no-op
        return dist.get_rank(), dist.get_world_size(), dist.get_backend()
    r = ct.run(fn, world_size=4)
    assert r.returns == [(i, 4, "cocemu") for i in range(4)]


def test_torch_distributed_unchanged_outside_runs():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError):
        dist.get_rank()  # torch's own: no default group


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_reduce_every_dtype(dtype):
    def fn():
        x = torch.full((3, 5), dist.get_rank() % 2 + 1).to(dtype)
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        y = torch.full((7,), 1).to(dtype)
        dist.all_reduce(y)  # sum: bool is or
        return x, y
    for x, y in ct.run(fn, world_size=4).returns:
        assert torch.equal(x, torch.full((3, 5), 2).to(dtype))
        assert torch.equal(y, torch.full((7,), 4).to(dtype) if dtype != torch.bool
                           else torch.ones(7, dtype=torch.bool))


@pytest.mark.parametrize("op,expected", [("SUM", 10.0), ("AVG", 2.5), ("MAX", 4.0),
                                         ("MIN", 1.0), ("PRODUCT", 24.0)])
def test_all_reduce_ops(op, expected):
    def fn():
        x = torch.full((4,), float(dist.get_rank() + 1))
        dist.all_reduce(x, op=getattr(dist.ReduceOp, op))
        return x
    for x in ct.run(fn, world_size=4).returns:
        assert torch.equal(x, torch.full((4,), expected))


def test_gathers_and_scatters():
    def fn():
        r, n = dist.get_rank(), dist.get_world_size()
        x = torch.arange(6, dtype=torch.float32).reshape(2, 3) + 10 * r
        out = {}
        lst = [torch.empty(2, 3) for _ in range(n)]
        dist.all_gather(lst, x)
        out["all_gather"] = torch.stack(lst)
        big = torch.empty(2 * n, 3)
        dist.all_gather_into_tensor(big, x)
        out["all_gather_into_tensor"] = big
        big2 = torch.empty(2 * n, 3)
        dist._all_gather_base(big2, x)
        out["_all_gather_base"] = big2
        full = torch.arange(2 * n * 3, dtype=torch.float32).reshape(2 * n, 3) * (r + 1)
        rs = torch.empty(2, 3)
        dist.reduce_scatter_tensor(rs, full)
        out["reduce_scatter_tensor"] = rs
        rs2 = torch.empty(2, 3)
        dist._reduce_scatter_base(rs2, full)
        out["_reduce_scatter_base"] = rs2
        rs3 = torch.empty(2, 3)
        dist.reduce_scatter(rs3, list(full.chunk(n)))
        out["reduce_scatter"] = rs3
        a2a = torch.empty(n, 2)
        dist.all_to_all_single(a2a, torch.arange(2 * n, dtype=torch.float32).reshape(n, 2) + 100 * r)
        out["all_to_all_single"] = a2a
        b = torch.full((3,), float(r))
        dist.broadcast(b, src=2)
        out["broadcast"] = b
        red = torch.full((3,), float(r + 1))
        dist.reduce(red, dst=1)
        out["reduce"] = red
        g = [torch.empty(2) for _ in range(n)] if r == 0 else None
        dist.gather(torch.full((2,), float(r)), g, dst=0)
        out["gather"] = torch.stack(g) if g else None
        s = torch.empty(2)
        dist.scatter(s, [torch.full((2,), float(i * 7)) for i in range(n)] if r == 3 else None,
                     src=3)
        out["scatter"] = s
        dist.barrier()
        return out
    n = 4
    res = ct.run(fn, world_size=n).returns
    base = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    gathered = torch.stack([base + 10 * i for i in range(n)])
    full = torch.arange(2 * n * 3, dtype=torch.float32).reshape(2 * n, 3) * sum(range(1, n + 1))
    for r, out in enumerate(res):
        assert torch.equal(out["all_gather"], gathered)
        assert torch.equal(out["all_gather_into_tensor"], gathered.reshape(2 * n, 3))
        assert torch.equal(out["_all_gather_base"], gathered.reshape(2 * n, 3))
        for k in ("reduce_scatter_tensor", "_reduce_scatter_base", "reduce_scatter"):
            assert torch.equal(out[k], full[2 * r:2 * r + 2]), k
        want = torch.stack([torch.arange(2 * r, 2 * r + 2, dtype=torch.float32) + 100 * i
                            for i in range(n)])
        assert torch.equal(out["all_to_all_single"], want)
        assert torch.equal(out["broadcast"], torch.full((3,), 2.0))
        if r == 1:
            assert torch.equal(out["reduce"], torch.full((3,), 10.0))
        if r == 0:
            assert torch.equal(out["gather"], torch.arange(n, dtype=torch.float32)[:, None]
                               .expand(n, 2))
        assert torch.equal(out["scatter"], torch.full((2,), float(r * 7)))


def test_p2p_and_batch_isend_irecv_ring():
    def fn():
        r, n = dist.get_rank(), dist.get_world_size()
        x = torch.full((5,), float(r))
        got = torch.empty(5)
        if r % 2 == 0:
            dist.send(x, (r + 1) % n)
            dist.recv(got, (r - 1) % n)
        else:
            dist.recv(got, (r - 1) % n)
            dist.send(x, (r + 1) % n)
        ring = torch.empty(5)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, (r + 1) % n),
                                       dist.P2POp(dist.irecv, ring, (r - 1) % n)])
        for q in reqs:
            q.wait()
        a = torch.empty(5)  # unbatched p2p as NCCL runs it: order by rank parity
        if r % 2 == 0:
            w2 = dist.isend(x * 2, (r - 1) % n)
            w1 = dist.irecv(a, (r + 1) % n)
        else:
            w1 = dist.irecv(a, (r + 1) % n)
            w2 = dist.isend(x * 2, (r - 1) % n)
        w1.wait()
        w2.wait()
        return got, ring, a
    n = 4
    for r, (got, ring, a) in enumerate(ct.run(fn, world_size=n).returns):
        assert torch.equal(got, torch.full((5,), float((r - 1) % n)))
        assert torch.equal(ring, torch.full((5,), float((r - 1) % n)))
        assert torch.equal(a, torch.full((5,), 2.0 * ((r + 1) % n)))


def test_async_work_and_new_group():
    def fn():
        r = dist.get_rank()
        evens = dist.new_group([0, 2, 4, 6])
        odds = dist.new_group([1, 3, 5, 7])
        mine = evens if r % 2 == 0 else odds
        assert dist.get_world_size(mine) == 4 and dist.get_rank(mine) == r // 2
        x = torch.full((8,), float(r))
        work = dist.all_reduce(x, group=mine, async_op=True)
        assert isinstance(work, torch._C._distributed_c10d.Work)
        work.wait()
        assert work.is_completed() in (True, False)
        dist.barrier(group=mine)
        return x, dist.get_process_group_ranks(mine), dist.get_global_rank(mine, 1)
    res = ct.run(fn, world_size=8).returns
    for r, (x, ranks, g1) in enumerate(res):
        assert torch.equal(x, torch.full((8,), 12.0 if r % 2 == 0 else 16.0))
        assert ranks == ([0, 2, 4, 6] if r % 2 == 0 else [1, 3, 5, 7])
        assert g1 == ranks[1]


def test_async_overlaps_in_the_modeled_timeline():
    """all_reduce(async_op=True) runs on the comm stream while a matmul computes."""
    def fn(overlap):
        def body():
            a = torch.ones(512, 512)
            x = torch.ones(1 << 20)
            w = dist.all_reduce(x, async_op=True)
            if not overlap:
                w.wait()
            for _ in range(4):
                a = a @ a / 512
            w.wait()
            return a
        return body
    serial = ct.run(fn(False), world_size=4).makespan_ns
    overlapped = ct.run(fn(True), world_size=4).makespan_ns
    assert overlapped < serial


# --- bad input ---------------------------------------------------------------------------------

def _error(fn, world_size=4, **kw):
    with pytest.raises(Exception) as e:
        ct.run(fn, world_size=world_size, timeout_s=3, **kw)
    return str(e.value)


def test_collective_on_a_group_the_rank_is_not_in():
    def fn():
        g = dist.new_group([0, 1])
        dist.all_reduce(torch.ones(3), group=g)
    msg = _error(fn)
    assert "all_reduce" in msg and "not a member" in msg and "[0, 1]" in msg
    assert "rank 2" in msg or "rank 3" in msg


def test_mismatched_shapes_across_ranks():
    def fn():
        dist.all_reduce(torch.ones(3 + dist.get_rank() % 2))
    msg = _error(fn)
    assert "all_reduce" in msg and "rank" in msg


def test_mismatched_dtypes_across_ranks():
    def fn():
        dist.all_reduce(torch.ones(4, dtype=torch.float32 if dist.get_rank() else torch.float64))
    msg = _error(fn)
    assert "all_reduce" in msg and "rank" in msg


def test_recv_no_one_sends_is_bounded():
    def fn():
        if dist.get_rank() == 0:
            dist.recv(torch.empty(3), src=1)
    msg = _error(fn, world_size=2)
    assert "rank 0" in msg and "recv" in msg


@pytest.mark.parametrize("n", [0, -1, 257, 2.0, True])
def test_world_size_out_of_range(n):
    with pytest.raises(cocemu.Error, match="world_size"):
        ct.run(lambda: None, world_size=n)


def test_unsupported_dtype_and_non_contiguous():
    msg = _error(lambda: dist.all_reduce(torch.ones(2, dtype=torch.complex64)))
    assert "complex64" in msg and "allowed" in msg
    msg = _error(lambda: dist.all_reduce(torch.ones(4, 4).t()))
    assert "contiguous" in msg


def test_reading_output_before_wait_is_reported():
    def fn():
        out = torch.empty(4 * dist.get_world_size())
        w = dist.all_gather_into_tensor(out, torch.ones(4), async_op=True)
        s = out.sum()  # before wait: on a device this races with the collective
        w.wait()
        return s
    msg = _error(fn)
    assert "all_gather_into_tensor" in msg and "before its Work.wait()" in msg
    assert "world" in msg

    def ok():
        out = torch.empty(4 * dist.get_world_size())
        w = dist.all_gather_into_tensor(out, torch.ones(4), async_op=True)
        w.wait()
        return out.sum()
    assert [float(x) for x in ct.run(ok, world_size=4).returns] == [16.0] * 4


def test_an_exception_on_one_rank_ends_the_run():
    def fn():
        if dist.get_rank() == 1:
            raise ValueError("boom")
        dist.all_reduce(torch.ones(3))
    with pytest.raises(ValueError, match="boom"):
        ct.run(fn, world_size=4, timeout_s=5)


def test_unbatched_p2p_cycle_is_reported_not_hung():
    def fn():
        r, n = dist.get_rank(), dist.get_world_size()
        w = dist.isend(torch.ones(5), (r - 1) % n)  # every rank sends first: NCCL hangs here
        dist.irecv(torch.empty(5), (r + 1) % n).wait()
        w.wait()
    msg = _error(fn)
    assert "deadlock" in msg and "send" in msg and "rank 0" in msg


def test_writing_an_async_collectives_input_before_wait_is_reported():
    def fn():
        x = torch.ones(4)
        out = torch.empty(4 * dist.get_world_size())
        w = dist.all_gather_into_tensor(out, x, async_op=True)
        x.add_(1)  # the collective may not have read x yet
        w.wait()
    msg = _error(fn)
    assert "aten.add_ writes the input of all_gather_into_tensor" in msg

    def reading_input_is_fine():
        x = torch.ones(4)
        out = torch.empty(4 * dist.get_world_size())
        w = dist.all_gather_into_tensor(out, x, async_op=True)
        y = x * 2  # reads only
        w.wait()
        return float(y.sum() + out.sum())
    assert ct.run(reading_input_is_fine, world_size=2).returns == [16.0, 16.0]


def test_all_to_all_single_uneven_splits():
    def fn():
        r, n = dist.get_rank(), dist.get_world_size()
        # rank r sends i + 1 rows to rank i; receives r + 1 rows from each rank
        inp = torch.cat([torch.full((i + 1, 2), float(10 * r + i)) for i in range(n)])
        out = torch.empty((r + 1) * n, 2)
        dist.all_to_all_single(out, inp, [r + 1] * n, [i + 1 for i in range(n)])
        return out
    for r, out in enumerate(ct.run(fn, world_size=3).returns):
        want = torch.cat([torch.full((r + 1, 2), float(10 * s + r)) for s in range(3)])
        assert torch.equal(out, want)
