"""The Python API against the C++ semantics: tensors without copies, streams, events, Work,
groups, every collective and point-to-point op, symmetric memory, RunResult."""
import json

import numpy as np
import pytest

import cocemu


def run(n, fn, **kw):
    return cocemu.run(n, fn, **kw).returns


# Tensors -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,np_dtype", [("f32", np.float32), ("f64", np.float64),
                                            ("f16", np.float16), ("i8", np.int8),
                                            ("i32", np.int32), ("bf16", np.uint16),
                                            ("i64", np.int64), ("u8", np.uint8),
                                            ("bool", np.bool_)])
def test_zeros_gives_numpy_of_each_dtype(dtype, np_dtype):
    def body(rank):
        x = rank.zeros((2, 3), dtype)
        return x.dtype, x.shape, x.flags["C_CONTIGUOUS"], x.flags["WRITEABLE"]
    assert run(1, body) == [(np.dtype(np_dtype), (2, 3), True, True)]


@pytest.mark.parametrize("np_dtype", [np.float32, np.float64, np.float16, np.int8, np.int32])
def test_all_reduce_in_place_on_the_callers_own_array(np_dtype):
    """The user's array is reduced in its own memory: no copy in, none out."""
    def body(rank):
        a = np.full((3, 5), rank.id + 1, dtype=np_dtype)
        address = a.ctypes.data
        cocemu.all_reduce(rank.world, a)
        rank.synchronize()
        return a.ctypes.data == address, a.tolist()
    expected = np.full((3, 5), 10, dtype=np_dtype).tolist()
    assert run(4, body) == [(True, expected)] * 4


def test_int64_uint8_and_bool_as_torch_and_nccl_reduce_them():
    def body(rank):
        big = np.array([(1 << 40) * (rank.id + 1), -(1 << 40)], np.int64)
        small = np.array([100 + 50 * rank.id], np.uint8)
        flags = np.array([rank.id == 1, True])
        both = flags.copy()
        for a in (big, small, flags):
            cocemu.all_reduce(rank.world, a)
        cocemu.all_reduce(rank.world, both, op="prod")
        rank.synchronize()
        return big.tolist(), small.tolist(), flags.tolist(), both.tolist()
    assert run(3, body) == [([6 << 40, -3 << 40], [(100 + 150 + 200) % 256], [True, True],
                             [False, True])] * 3


def test_views_of_cocemu_memory_share_it():
    def body(rank):
        x = rank.zeros((8, 4), "f32")
        rows = x[2:6]  # a view: the collective writes into x's storage
        rows[:] = rank.id + 1
        cocemu.all_reduce(rank.world, rows)
        rank.synchronize()
        return x[:, 0].tolist()
    assert run(2, body) == [[0, 0, 3, 3, 3, 3, 0, 0]] * 2


def test_bf16_is_uint16_with_explicit_conversions():
    values = np.array([1.0, -2.5, 3.140625, 1e-3], np.float32)
    bits = cocemu.to_bf16(values)
    assert bits.dtype == np.uint16
    assert cocemu.from_bf16(bits).tolist() == [1.0, -2.5, 3.140625, 0.00099945068359375]  # 1e-3: 0x3a83126f -> 0x3a83
    # round to nearest even: 1 + 2^-8 is halfway between bf16 1.0 and 1 + 2^-7
    assert cocemu.from_bf16(cocemu.to_bf16(np.float32(1 + 2 ** -8)))[()] == 1.0

    def body(rank):
        x = rank.zeros((4,), "bf16")
        x[:] = cocemu.to_bf16(np.full(4, rank.id + 0.5, np.float32))
        cocemu.all_reduce(rank.world, x)
        rank.synchronize()
        return cocemu.from_bf16(x).tolist()
    assert run(4, body) == [[8.0] * 4] * 4


def test_tensor_class_and_dry_runs():
    t = cocemu.Tensor.shape_only((4096, 8192), "bf16")
    assert (t.shape, t.dtype, t.nbytes, t.has_data) == ((4096, 8192), "bf16", 4096 * 8192 * 2, False)
    with pytest.raises(cocemu.Error, match="no storage"):
        t.numpy()
    z = cocemu.Tensor.zeros((2, 2), "f64").numpy()
    assert z.dtype == np.float64 and z.sum() == 0

    def body(rank):  # production size, shapes only
        x = rank.zeros((1 << 14, 1 << 14), "bf16")
        assert isinstance(x, cocemu.Tensor) and not x.has_data
        cocemu.all_reduce(rank.world, x)
        rank.compute_stream.launch("never runs", lambda: 1 / 0, work_ns=10)
        rank.synchronize()
    r = cocemu.run(8, body, dry_run=True)
    assert not r.numerics and r.makespan_ns > 1_000_000  # 512 MiB all_reduce


# Streams, events, Work ---------------------------------------------------------------------

def test_launch_costs_and_op_refs():
    p = cocemu.load_profile("ascend-910b")
    refs = {}

    def body(rank):
        s = rank.compute_stream
        refs["work"] = s.launch("given", work_ns=1234)
        refs["gemm"] = s.launch("flops", flops=2 * 4096 ** 3, dtype="bf16")
        refs["mem"] = s.launch("bytes", bytes=1 << 30)
        refs["seg"] = s.launch("in seg", work_ns=5, segment="mine")
        rank.synchronize()
    r = cocemu.run(1, body)
    op = r.op(refs["work"])
    assert (op.name, op.kind, op.lane_name, op.end_ns - op.start_ns) == ("given", "compute", "compute", 1234)
    flops_ns = 2 * 4096 ** 3 / (p.peak_flops("bf16") * 1.0)
    gemm = r.op(refs["gemm"])
    assert gemm.flops == 2 * 4096 ** 3
    assert gemm.work_ns >= flops_ns  # at the large-GEMM efficiency, at most the peak
    assert r.op(refs["mem"]).work_ns == pytest.approx(cocemu.memory_ns(p, 1 << 30))
    assert r.op(refs["seg"]).segment == "mine"
    assert [s.name for s in r.segments()] == ["mine"]


def test_events_order_streams_and_give_modeled_times():
    def body(rank):
        a, b = rank.compute_stream, rank.new_stream("b")
        start = a.record()
        a.launch("first", work_ns=5000)
        e = a.record()
        b.wait(e)
        b.launch("second", work_ns=3000)
        end = b.record()
        rank.synchronize()
        assert e.query() and end.query()
        return start, e, end
    r = cocemu.run(1, body)
    start, e, end = r.returns[0]
    assert start.op is None  # the stream was empty when it was recorded
    second = [o for o in r.ops(0) if o.name == "second"][0]
    first = [o for o in r.ops(0) if o.name == "first"][0]
    assert second.start_ns >= first.end_ns  # b waited for a's event
    assert second.end_ns - second.start_ns == 3000
    assert r.event_time_ns(e) == first.end_ns and r.event_time_ns(end) == second.end_ns
    assert r.elapsed_ns(e, end) == second.end_ns - first.end_ns


def test_async_work_semantics():
    def body(rank):
        x = rank.zeros((1 << 16,), "f32")
        x[:] = 1
        w = cocemu.all_reduce(rank.world, x, async_op=True)
        assert isinstance(w, cocemu.Work)
        assert w.wait() is True          # stream-side: returns at once
        w.synchronize()                  # host-side
        assert w.is_completed()
        assert cocemu.all_reduce(rank.world, x) is None  # sync: None, as torch
        rank.synchronize()
        return float(x[0])
    assert run(4, body) == [16.0] * 4


def test_current_stream_context_manager():
    def body(rank):
        s = rank.new_stream("mine")
        with rank.stream(s):
            assert rank.current_stream == s
            x = rank.zeros((16,), "f32")
            cocemu.all_reduce(rank.world, x)  # the comm stream waits on "mine"
        assert rank.current_stream == rank.compute_stream
        with rank.segment("region"):
            rank.compute_stream.launch("k", work_ns=10)
        rank.synchronize()
    r = cocemu.run(2, body)
    assert "mine" in r.lanes(0)
    assert [o.segment for o in r.ops(0) if o.name == "k"] == ["region"]


# Groups and collectives --------------------------------------------------------------------

def test_groups_new_group_split_mesh():
    def body(rank):
        evens = cocemu.new_group(rank, [0, 2, 4, 6], name="evens")
        half = cocemu.split(rank.world, rank.id // 4, -rank.id)
        mesh = cocemu.make_mesh(rank, tp=2, dp=2, pp=2)
        x = np.array([rank.id], np.int32)
        if evens.is_member:
            cocemu.all_reduce(evens, x)
        y = np.array([rank.id], np.int32)
        cocemu.all_reduce(half, y)
        z = np.array([rank.id], np.int32)
        cocemu.all_reduce(mesh.tp, z)
        rank.synchronize()
        return (evens.is_member, evens.rank, half.rank, half.ranks, mesh.tp.ranks, mesh.pp_rank,
                int(x[0]), int(y[0]), int(z[0]))
    out = run(8, body)
    assert out[0] == (True, 0, 3, [3, 2, 1, 0], [0, 1], 0, 12, 6, 1)
    assert out[1][:3] == (False, -1, 2)
    assert out[5] == (False, -1, 2, [7, 6, 5, 4], [4, 5], 1, 5, 22, 9)


def test_every_collective_matches_numpy():
    n, k = 4, 6

    def body(rank):
        # Ops are stream-ordered: the host reads the results after synchronize, as with CUDA.
        me = rank.id
        g = rank.world
        res = {}
        res["all_reduce max"] = t = np.arange(n * k, dtype=np.float64) + me
        cocemu.all_reduce(g, t, op=cocemu.ReduceOp.MAX)
        res["all_reduce avg"] = out = np.zeros(n * k)
        cocemu.all_reduce(g, np.full(n * k, me + 1.0), out, op="avg")
        res["reduce_scatter"] = rs = np.zeros(k)
        cocemu.reduce_scatter(g, rs, np.arange(n * k, dtype=np.float64) * (me + 1))
        res["all_gather"] = ag = np.zeros(n * k)
        cocemu.all_gather(g, ag, np.full(k, float(me)))
        res["broadcast"] = b = np.full(k, float(me))
        cocemu.broadcast(g, b, 2)
        res["reduce"] = r = np.full(k, float(me + 1))
        cocemu.reduce(g, r, 1, op="prod")
        res["gather"] = go = np.zeros(n * k) if me == 3 else None
        cocemu.gather(g, go, np.full(k, float(me)), 3)
        res["scatter"] = so = np.zeros(k)
        cocemu.scatter(g, so, np.arange(n * k, dtype=np.float64) if me == 0 else None, 0)
        res["all_to_all"] = a2a = np.zeros(n * k)
        cocemu.all_to_all(g, a2a, np.arange(n * k, dtype=np.float64) + 100 * me)
        res["all_to_all splits"] = rows = np.zeros((n * (me + 1), 2))  # me+1 rows from each peer
        cocemu.all_to_all(g, rows, np.full((sum(range(1, n + 1)), 2), float(me)),
                          output_splits=[me + 1] * n, input_splits=list(range(1, n + 1)))
        cocemu.barrier(g)
        rank.synchronize()
        return res

    out = run(n, body)
    for me, res in enumerate(out):
        assert res["all_reduce max"].tolist() == (np.arange(n * k) + n - 1).tolist()
        assert res["all_reduce avg"].tolist() == [2.5] * (n * k)
        full = sum(np.arange(n * k) * (r + 1) for r in range(n))
        assert res["reduce_scatter"].tolist() == full[me * k:(me + 1) * k].tolist()
        assert res["all_gather"].tolist() == np.repeat(np.arange(n, dtype=float), k).tolist()
        assert res["broadcast"].tolist() == [2.0] * k
        assert res["reduce"].tolist() == ([24.0] * k if me == 1 else [me + 1.0] * k)
        assert (res["gather"] is None) == (me != 3)
        if me == 3:
            assert res["gather"].tolist() == np.repeat(np.arange(n, dtype=float), k).tolist()
        assert res["scatter"].tolist() == list(range(me * k, (me + 1) * k))
        expect = np.concatenate([np.arange(me * k, (me + 1) * k) + 100 * p for p in range(n)])
        assert res["all_to_all"].tolist() == expect.tolist()
        assert res["all_to_all splits"].tolist() == np.repeat(np.arange(n, dtype=float), me + 1)[:, None].repeat(2, 1).tolist()


def test_point_to_point_ops():
    def body(rank):
        g, me, n = rank.world, rank.id, rank.world_size
        nxt, prv = (me + 1) % n, (me - 1) % n
        a = np.zeros(4, np.int32)
        ops = [cocemu.P2POp(cocemu.isend, np.full(4, me, np.int32), nxt),
               cocemu.P2POp(cocemu.irecv, a, prv)]
        cocemu.batch_isend_irecv(g, ops).wait()
        b = np.zeros(2, np.int32)
        if me % 2 == 0:
            cocemu.send(g, np.full(2, 10 + me, np.int32), nxt, tag=7)
            cocemu.recv(g, b, prv, tag=7)
        else:
            cocemu.recv(g, b, prv, tag=7)
            cocemu.send(g, np.full(2, 10 + me, np.int32), nxt, tag=7)
        c = np.zeros(3)
        if me == 0:
            cocemu.isend(g, np.ones(3), 1).wait()
        elif me == 1:
            cocemu.irecv(g, c, 0).synchronize()
        rank.synchronize()
        return a.tolist(), b.tolist(), c.tolist()
    out = run(4, body)
    assert [o[0] for o in out] == [[3] * 4, [0] * 4, [1] * 4, [2] * 4]
    assert [o[1] for o in out] == [[13] * 2, [10] * 2, [11] * 2, [12] * 2]
    assert out[1][2] == [1.0] * 3


def test_collective_ns_prices_like_the_run():
    def body(rank):
        x = rank.zeros((1 << 20,), "bf16")
        cocemu.all_reduce(rank.world, x)
        rank.synchronize()
    r = cocemu.run(8, body, dry_run=True)
    op = [o for o in r.ops(0) if o.kind == "comm"][0]
    assert op.work_ns == cocemu.collective_ns("ascend-910b", "all_reduce", 8, 1 << 20, "bf16")
    assert cocemu.collective_ns("ascend-910b", "all_gather", list(range(8)), 1024, "f32") > 0


# Symmetric memory ---------------------------------------------------------------------------

def test_symmetric_memory_put_signal_wait():
    def body(rank):
        n, me = rank.world_size, rank.id
        buf = cocemu.SymmetricBuffer.allocate(rank, list(range(n)), 64, n_flags=1)
        out = np.zeros(4, np.float32)

        def kernel():
            # write my value into the next rank's copy, raise its flag, wait for mine
            buf.put((me + 1) % n, 0, np.full(4, me, np.float32))
            buf.signal((me + 1) % n, 0)
            buf.wait(0, 1, "left neighbour's put")
            buf.get(me, 0, out)
        rank.compute_stream.launch("ring step", kernel, work_ns=1000)
        rank.synchronize()
        return out.tolist(), buf.local()[:16].view(np.float32).tolist(), buf.flag(me, 0)
    out = run(4, body)
    for me, (got, local, flag) in enumerate(out):
        assert got == [float((me - 1) % 4)] * 4 == local
        assert flag == 1


# Results ----------------------------------------------------------------------------------

def test_run_result_outputs(tmp_path):
    def body(rank):
        with rank.segment("fwd"):
            rank.compute_stream.launch("gemm", work_ns=4000, flops=10)
            x = rank.zeros((4096,), "f32")
            cocemu.all_reduce(rank.world, x)
        rank.synchronize()
    r = cocemu.run(4, body)
    assert r.n_ranks == 4 and r.profile.name == "ascend-910b" and r.wall_ns > 0
    doc = json.loads(r.to_json())
    assert doc["makespan_ns"] == r.makespan_ns and doc["n_ranks"] == 4
    assert {o["name"] for o in doc["ops"]} >= {"gemm", "all_reduce 16KiB"}
    assert doc["segments"][0]["name"] == "fwd"
    text = r.summary()
    assert "fwd" in text and "modeled" in text
    seg = r.segments(0)[0]
    assert seg.compute_work_ns == 4000 and seg.comm_work_ns > 0
    verdict = cocemu.judge(seg, seg)
    assert not verdict.success and verdict.text
    r.write_chrome_trace(str(tmp_path / "t.json"))
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    r.write_svg(str(tmp_path / "t.svg"), "title")
    assert "title" in (tmp_path / "t.svg").read_text()
    assert r.svg("t", span_ns=2 * r.makespan_ns) != r.svg("t")  # a longer axis
    assert r.svg("t", collapse_identical_ranks=False) != r.svg("t")
    assert r.chrome_trace() == r.chrome_trace()  # modeled only: deterministic
    assert "wall" in r.chrome_trace(include_wall=True)


def test_module_metadata():
    assert cocemu.__version__.count(".") == 2
    assert {"run", "all_reduce", "Rank", "Error", "P2POp"} <= set(cocemu.__all__)
    assert issubclass(cocemu.Error, RuntimeError)


def test_cost_model_functions():
    p = cocemu.load_profile("h100-sxm")
    assert p.name == "h100-sxm"
    assert cocemu.gemm_ns(p, 4096, 4096, 4096, "bf16") > cocemu.gemm_ns(p, 1024, 1024, 1024, "bf16")
    assert 0 < cocemu.gemm_efficiency(p, 4096, 4096, 4096) <= 1
    # A streaming kernel: bytes at the in-training HBM rate, plus the per-kernel overhead.
    streamed = (1 << 30) / (p.memory_bandwidth * p.memory_in_training_efficiency) * 1e9
    assert cocemu.memory_ns(p, 1 << 30) == pytest.approx(streamed + p.kernel_overhead_ns)
    assert p.kernel_overhead_ns > 0
    assert cocemu.launch_ns(p) == p.launch_overhead_ns
    assert cocemu.attention_ns(p, 32, 4096, 4096, 128, visible=0.5) > 0
    assert cocemu.overlapped_ns(p, 100.0, 0.0) == 100.0
    slower = p.scaled("host.launch_overhead_ns", 2.0)
    assert cocemu.launch_ns(slower) == 2 * p.launch_overhead_ns
    assert cocemu.fused_kernel_ns("ascend-910b", "matmul_all_reduce", 4096, 4096, 1024, 8) > 0
    assert cocemu.config_dir().endswith("configs") or cocemu.config_dir().endswith("cocemu")
