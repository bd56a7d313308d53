"""cocemu.torch: plain torch.distributed on rank threads (R-PY-6): every op and dtype the issue
lists, async Work, new_group, and the bad-input errors (rank, group and call named; bounded)."""
import re

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
        if not dist.is_initialized():  # code written for torchrun: skipped, ct.run initialised
            dist.init_process_group("nccl")
        return dist.get_rank(), dist.get_world_size(), dist.get_backend()
    r = ct.run(fn, world_size=4)
    assert r.returns == [(i, 4, "cocemu") for i in range(4)]


def test_a_second_init_process_group_is_torchs_error_with_a_note():
    with pytest.raises(ValueError) as e:
        ct.run(lambda: dist.init_process_group("nccl"), world_size=2, timeout_s=5)
    assert "twice" in str(e.value)
    assert any("is_initialized()" in n for n in e.value.__notes__)


def test_torch_distributed_unchanged_outside_runs():
    assert not dist.is_initialized()
    with pytest.raises((RuntimeError, ValueError)):
        dist.get_rank()  # torch's own: no default group
    ct.run(lambda: dist.barrier(), world_size=2)
    assert not dist.is_initialized()  # the rank threads' worlds are their own
    assert not isinstance(dist.group.WORLD, ct.ProcessGroup)


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

def _error(fn, world_size=4, timeout_s=3, **kw):
    with pytest.raises(Exception) as e:
        ct.run(fn, world_size=world_size, timeout_s=timeout_s, **kw)
    return str(e.value)


def test_collective_on_a_group_the_rank_is_not_in():
    """torch's own behaviour: a non-member gets GroupMember.NON_GROUP_MEMBER, and a collective
    on it warns and does nothing."""
    import warnings

    def fn():
        g = dist.new_group([0, 1])
        x = torch.ones(3)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dist.all_reduce(x, group=g)
        return g == dist.GroupMember.NON_GROUP_MEMBER, x, [str(w.message) for w in caught]
    for r, (non_member, x, caught) in enumerate(ct.run(fn, world_size=4).returns):
        assert non_member == (r >= 2)
        assert torch.equal(x, torch.full((3,), 2.0 if r < 2 else 1.0))
        assert (r >= 2) == any(f"all_reduce on global rank {r} which does not belong" in w
                               for w in caught)


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
    msg = _error(lambda: dist.all_reduce(torch.ones(2, dtype=torch.int16)))
    assert "int16" in msg and "allowed" in msg
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


# --- the c10d surface real code uses (R-PY-15) -------------------------------------------------

def test_coalesced_collectives():
    def fn():
        r, n = dist.get_rank(), dist.get_world_size()
        a, b = torch.full((3,), float(r + 1)), torch.full((2, 2), r + 1, dtype=torch.int64)
        with dist._coalescing_manager():
            dist.all_reduce(a)
            dist.all_reduce(b)
        c, d = torch.full((2,), float(r)), torch.full((5,), float(2 * r))
        dist.all_reduce_coalesced([c, d])
        outs = [torch.empty(2 * n), torch.empty(3 * n)]
        with dist._coalescing_manager(async_ops=True) as cm:
            dist.all_gather_into_tensor(outs[0], torch.full((2,), float(r)))
            dist.all_gather_into_tensor(outs[1], torch.full((3,), float(10 + r)))
        cm.wait()
        rs = [torch.empty(1), torch.empty(2)]
        with dist._coalescing_manager(device=torch.device("cpu")):
            dist.reduce_scatter_tensor(rs[0], torch.arange(n, dtype=torch.float32))
            dist.reduce_scatter_tensor(rs[1], torch.arange(2 * n, dtype=torch.float32))
        return a, b, c, d, outs, rs
    n = 4
    for r, (a, b, c, d, outs, rs) in enumerate(ct.run(fn, world_size=n).returns):
        assert torch.equal(a, torch.full((3,), 10.0))
        assert torch.equal(b, torch.full((2, 2), 10, dtype=torch.int64))
        assert torch.equal(c, torch.full((2,), 6.0)) and torch.equal(d, torch.full((5,), 12.0))
        assert torch.equal(outs[0], torch.arange(n, dtype=torch.float32).repeat_interleave(2))
        assert torch.equal(outs[1], 10 + torch.arange(n, dtype=torch.float32).repeat_interleave(3))
        assert torch.equal(rs[0], torch.tensor([4.0 * r]))
        assert torch.equal(rs[1], torch.tensor([4.0 * 2 * r, 4.0 * (2 * r + 1)]))


def test_all_to_all_with_tensor_lists_uneven():
    def fn():
        r, n = dist.get_rank(), dist.get_world_size()
        ins = [torch.full((i + 1,), float(10 * r + i)) for i in range(n)]  # i + 1 to rank i
        outs = [torch.empty(r + 1) for _ in range(n)]
        dist.all_to_all(outs, ins)
        return outs
    n = 3
    for r, outs in enumerate(ct.run(fn, world_size=n).returns):
        for s in range(n):
            assert torch.equal(outs[s], torch.full((r + 1,), float(10 * s + r)))


def test_recv_from_any_source_returns_the_sender():
    def fn():
        r, n = dist.get_rank(), dist.get_world_size()
        if r == 0:
            got = {}
            for _ in range(n - 1):
                t = torch.empty(2)
                src = dist.recv(t)  # src=None: any source
                got[src] = t
            w = dist.irecv(torch.empty(2), tag=5)
            w.wait()
            return got, w._source_rank()
        dist.send(torch.full((2,), float(r * 3)), 0)
        if r == 2:
            dist.send(torch.full((2,), 7.0), 0, tag=5)
        return None
    got, last = ct.run(fn, world_size=4).returns[0]
    assert sorted(got) == [1, 2, 3] and last == 2
    for src, t in got.items():
        assert torch.equal(t, torch.full((2,), float(src * 3)))


def test_recv_from_any_source_no_sender_times_out():
    def fn():
        if dist.get_rank() == 0:
            dist.recv(torch.empty(2))
    msg = _error(fn, world_size=2, timeout_s=1)
    assert "any source" in msg and "rank 0" in msg


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_dtypes(dtype):
    def fn():
        r = dist.get_rank()
        x = torch.full((3,), complex(r + 1, -r), dtype=dtype)
        dist.all_reduce(x)
        b = torch.full((2,), complex(r, 1), dtype=dtype)
        dist.broadcast(b, src=1)
        lst = [torch.empty(2, dtype=dtype) for _ in range(4)]
        dist.all_gather(lst, torch.full((2,), complex(0, r), dtype=dtype))
        p = torch.empty(2, dtype=dtype)
        if r % 2 == 0:
            dist.send(torch.full((2,), complex(r, r), dtype=dtype), r + 1)
        else:
            dist.recv(p, r - 1)
        return x, b, lst, p
    for r, (x, b, lst, p) in enumerate(ct.run(fn, world_size=4).returns):
        assert torch.equal(x, torch.full((3,), complex(10, -6), dtype=dtype))
        assert torch.equal(b, torch.full((2,), complex(1, 1), dtype=dtype))
        assert all(torch.equal(t, torch.full((2,), complex(0, i), dtype=dtype))
                   for i, t in enumerate(lst))
        if r % 2:
            assert torch.equal(p, torch.full((2,), complex(r - 1, r - 1), dtype=dtype))


def test_monitored_barrier_names_the_missing_ranks():
    import datetime

    def ok():
        dist.group.WORLD.monitored_barrier(datetime.timedelta(seconds=5))
        return True
    assert ct.run(ok, world_size=3).returns == [True] * 3

    def fn(wait_all_ranks):
        def body():
            if dist.get_rank() not in (2, 3):
                dist.group.WORLD.monitored_barrier(datetime.timedelta(seconds=0.5),
                                                   wait_all_ranks=wait_all_ranks)
        return body
    msg = _error(fn(False), world_size=4)
    assert "timed out in monitoredBarrier after 500 ms" in msg
    assert "Rank 2 failed to pass monitoredBarrier" in msg or "group ranks 2, 3 did not" in msg
    assert "world ranks not arrived: [2, 3]" in msg

    def only_rank_0():
        if dist.get_rank() == 0:
            dist.group.WORLD.monitored_barrier(datetime.timedelta(seconds=0.5),
                                               wait_all_ranks=True)
    with pytest.raises(cocemu.Error, match="Rank 0 timed out in monitoredBarrier after 500 ms.*"
                                           "Ranks 1, 2, 3 failed to pass monitoredBarrier"):
        ct.run(only_rank_0, world_size=4, timeout_s=5)


def test_new_subgroups():
    def fn():
        r = dist.get_rank()
        cur, subs = dist.new_subgroups(group_size=2)
        x = torch.full((1,), float(r))
        dist.all_reduce(x, group=cur)
        cur2, _ = dist.new_subgroups_by_enumeration([[0, 3], [1, 2]])
        y = torch.full((1,), float(r))
        dist.all_reduce(y, group=cur2)
        node, _ = dist.new_subgroups()  # default: a group per node (torch.cuda.device_count())
        return (float(x), float(y), dist.get_process_group_ranks(cur2)), len(subs), \
            (dist.get_world_size(node), torch.cuda.device_count())
    want = {0: (1, 3, [0, 3]), 1: (1, 3, [1, 2]), 2: (5, 3, [1, 2]), 3: (5, 3, [0, 3])}
    for r, (got, nsub, node) in enumerate(ct.run(fn, world_size=4).returns):
        assert got == want[r] and nsub == 2 and node == (4, 4)


def test_object_collectives():
    def fn():
        r, n = dist.get_rank(), dist.get_world_size()
        objs = [None] * n
        dist.all_gather_object(objs, {"rank": r, "name": "x" * r})
        lst = [r, "from", r] if r == 1 else [None, None, None]
        dist.broadcast_object_list(lst, src=1)
        got = [None] * n if r == 0 else None
        dist.gather_object(("r", r), got, dst=0)
        out = [None]
        dist.scatter_object_list(out, [{"to": i} for i in range(n)] if r == 2 else None, src=2)
        return objs, lst, got, out[0]
    n = 3
    for r, (objs, lst, got, out) in enumerate(ct.run(fn, world_size=n).returns):
        assert objs == [{"rank": i, "name": "x" * i} for i in range(n)]
        assert lst == [1, "from", 1]
        assert got == ([("r", i) for i in range(n)] if r == 0 else None)
        assert out == {"to": r}


@pytest.mark.parametrize("call", ["barrier", "all_reduce", "broadcast", "recv", "batch"])
def test_every_timeout_raises(call):
    """A rank that never joins: the others raise within the timeout, naming the call."""
    def fn():
        if dist.get_rank() == 1:
            return
        x = torch.ones(2)
        if call == "barrier":
            dist.barrier()
        elif call == "all_reduce":
            dist.all_reduce(x)
        elif call == "broadcast":
            dist.broadcast(x, src=0)
        elif call == "recv":
            dist.recv(x, src=1)
        else:
            for w in dist.batch_isend_irecv([dist.P2POp(dist.irecv, x, 1)]):
                w.wait()
    msg = _error(fn, world_size=2, timeout_s=1)
    assert "rank 0" in msg and ("recv" if call == "batch" else call) in msg


# --- issue 41's torch items ---------------------------------------------------------------------

def test_dry_run_cpu_tensor_is_an_error():
    def fn():
        dist.all_reduce(torch.full((4,), dist.get_rank() + 1))
    msg = _error(fn, world_size=2, numerics=False)
    assert "all_reduce" in msg and "(4,)" in msg and "numerics=False" in msg
    assert "create it on the device" in msg


def test_group_kept_past_its_run():
    r = ct.run(lambda: dist.new_group([0, 1]), world_size=2)
    with pytest.raises(cocemu.Error, match="cocemu.torch.run that made this group has ended"):
        dist.all_reduce(torch.ones(2), group=r.returns[0])


@pytest.mark.parametrize("kw,name", [({"timeout_s": "abc"}, "timeout_s = 'abc'"),
                                     ({"timeout_s": -1}, "timeout_s = -1"),
                                     ({"numerics": "False"}, "numerics = 'False'"),
                                     ({"checked": 1}, "checked = 1")])
def test_bad_run_settings_are_named(kw, name):
    with pytest.raises(cocemu.Error) as e:
        ct.run(lambda: None, world_size=2, **kw)
    assert name in str(e.value)


@pytest.mark.parametrize("code,said", [
    ("dist.broadcast(torch.zeros(4), 1.5)", "src=1.5 (float) is not a rank"),
    ("dist.reduce(torch.zeros(4), '0')", "dst='0' (str) is not a rank"),
    ("dist.scatter(torch.zeros(4), None, src=2**64)", "src=18446744073709551616 is not a rank"),
    ("dist.broadcast(torch.zeros(4), None)", "src=None and group_src=None"),
    ("dist.all_reduce(torch.zeros(4), op='sum')", "op='sum' (str) is not a"),
    ("dist.all_reduce(torch.zeros(4), op=42)", "op=42 (int) is not a"),
    ("dist.send(torch.zeros(4), dist.get_rank())", "is this rank; a rank cannot send to itself"),
    ("dist.new_group([0, 0])", "ranks=[0, 0] names rank 0 twice"),
    ("dist.new_group('01')", "ranks='01' (str) is not a list"),
    ("dist.gather(torch.zeros(4))", "this rank is the root (dst=None: rank 0 of the group)"),
    ("torch.npu.Stream(priority='high')", "priority='high' (str) is not an int"),
    ("torch.npu.current_stream().wait_event(3)", "event=3 (int) is not a"),
])
def test_bad_torch_arguments_are_named(code, said):
    """torch.distributed's and the device shim's arguments are checked before torch's C++
    options read them: the call, the rank, the value and what is allowed."""
    msg = _error(lambda: exec(code), world_size=2)
    assert said in msg
    assert re.search(r"rank [01]\b", msg), msg  # whichever rank fails first


def test_bad_timeout_env_is_named(monkeypatch):
    monkeypatch.setenv("COCEMU_TIMEOUT_MS", "abc")
    with pytest.raises(cocemu.Error, match="COCEMU_TIMEOUT_MS = 'abc'"):
        ct.run(lambda: None, world_size=2)


def test_every_work_waits_completes_and_gives_a_future():
    def fn():
        r, n = dist.get_rank(), dist.get_world_size()
        out = []
        x = torch.full((2,), float(r))
        works = [dist.all_reduce(x, async_op=True)]
        got = torch.empty(2)
        works += dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((2,), float(r)),
                                                    (r + 1) % n),
                                         dist.P2POp(dist.irecv, got, (r - 1) % n)])
        lst = [torch.empty(2) for _ in range(n)]
        works.append(dist.all_gather(lst, torch.full((2,), float(r)), async_op=True))
        for w in works:
            fut = w.get_future()
            w.wait()
            out.append((w.is_completed(), w.is_success(), w.exception(), fut.done()))
        return out, x, got, lst
    for r, (out, x, got, lst) in enumerate(ct.run(fn, world_size=4).returns):
        assert out == [(True, True, None, True)] * 4
        assert torch.equal(x, torch.full((2,), 6.0))
        assert torch.equal(got, torch.full((2,), float((r - 1) % 4)))
        assert all(torch.equal(t, torch.full((2,), float(i))) for i, t in enumerate(lst))


def test_sparse_all_reduce_sums_the_entries():
    """gloo's sparse sum. record=False: the recording mode does not price sparse tensors yet."""
    def fn():
        r = dist.get_rank()
        t = torch.sparse_coo_tensor(torch.tensor([[r, 3], [0, 1]]),
                                    torch.tensor([1.0 + r, 10.0]), (4, 2))
        dist.all_reduce(t)
        return t
    want = torch.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0], [0.0, 30.0]])
    for t in ct.run(fn, world_size=3, record=False).returns:
        assert t.is_sparse and torch.equal(t.to_dense(), want)
