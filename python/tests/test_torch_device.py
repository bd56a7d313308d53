"""cocemu.torch's device shim (R-PY-7) and modeled compute (R-PY-8): torch.npu / torch_npu /
torch.cuda streams and events on rank threads, ProcessGroupNCCL stream semantics, aten ops priced
with gemm_ns / memory_ns, numerics=False on meta tensors, unmodeled() and segment()."""
import sys

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import cocemu  # noqa: E402
import cocemu.torch as ct  # noqa: E402

PROFILE = cocemu.load_profile("ascend-910b")


def test_current_device_is_the_local_rank_and_tensors_live_on_cpu_or_meta():
    def fn():
        t = torch.empty(4096, 4096, device=torch.npu.current_device())
        return t.device.type, ct.device().type, torch.cuda.current_device()
    assert ct.run(fn, world_size=2).returns == [("cpu", "cpu", 0), ("cpu", "cpu", 1)]
    assert ct.run(fn, world_size=2, numerics=False).returns == [("meta", "meta", 0),
                                                                ("meta", "meta", 1)]


def test_torch_npu_imports_and_unmodeled_fused_op_is_a_clear_error():
    def fn():
        import torch_npu
        assert torch_npu.npu.current_device() == dist.get_rank()
        torch_npu.npu_rms_norm(torch.ones(2), torch.ones(2))
    with pytest.raises(cocemu.Error, match="npu_rms_norm.*not modeled"):
        ct.run(fn, world_size=2)


def test_mm_priced_with_gemm_ns_and_elementwise_with_memory_ns():
    def fn():
        a = torch.empty(1024, 2048, dtype=torch.bfloat16, device=torch.npu.current_device())
        b = torch.empty(4096, 2048, dtype=torch.bfloat16, device=torch.npu.current_device())
        with ct.segment("work"):
            y = a @ b.t()  # mm with a column-major right operand
            z = y * 2      # elementwise: reads and writes 1024 x 4096 bf16
            v = z.view(-1).reshape(4096, 1024)  # views: free
        return v.shape
    r = ct.run(fn, world_size=1, numerics=False)
    ops = [o for o in r.ops(0) if o.segment == "work" and o.lane_name != "host"]
    names = [o.name for o in ops]
    assert names == ["mm 1024x4096x2048", "mul"], names
    assert ops[0].work_ns == pytest.approx(
        cocemu.gemm_ns(PROFILE, 1024, 4096, 2048, "bf16", False, True))
    assert ops[1].work_ns == pytest.approx(cocemu.memory_ns(PROFILE, 2 * 1024 * 4096 * 2))
    assert r.ops_recorded[0] == 2


def test_unmodeled_records_nothing_and_dry_run_times_equal_real_run():
    def fn():
        with ct.unmodeled():
            w = torch.ones(256, 256, device=torch.npu.current_device())
        x = w @ w
        return x.shape
    real, dry = ct.run(fn, world_size=2), ct.run(fn, world_size=2, numerics=False)
    assert real.ops_recorded == [1, 1] and dry.ops_recorded == [1, 1]
    assert real.makespan_ns == dry.makespan_ns


def test_streams_and_events():
    def fn():
        s = torch.npu.Stream()
        main = torch.npu.current_stream()
        assert main == torch.npu.default_stream()
        a = torch.ones(512, 512)
        ev = torch.npu.Event()
        ev.record()
        s.wait_event(ev)
        with torch.npu.stream(s):
            assert torch.npu.current_stream() == s
            b = a @ a  # on the side stream
        assert torch.npu.current_stream() == main
        c = a @ a      # on the main stream, concurrently
        main.wait_stream(s)
        done = torch.cuda.Event()
        done.record()
        done.synchronize()
        assert done.query()
        torch.cuda.synchronize()
        return float((b - c).abs().sum())
    r = ct.run(fn, world_size=1)
    assert r.returns == [0.0]
    mm = [o for o in r.ops(0) if o.name.startswith("mm")]
    assert len({o.lane_name for o in mm}) == 2
    assert mm[0].start_ns < mm[1].end_ns and mm[1].start_ns < mm[0].end_ns  # they overlap


def test_comm_stream_waits_for_current_stream_and_wait_makes_it_wait():
    """ProcessGroupNCCL: the collective starts after the producer on the current stream; the
    consumer enqueued after Work.wait() starts after the collective."""
    def fn():
        x = torch.ones(1 << 16)
        y = x * 3                       # producer
        w = dist.all_reduce(y, async_op=True)
        w.wait()
        return y + 1                    # consumer
    r = ct.run(fn, world_size=2)
    assert torch.equal(r.returns[0], torch.full((1 << 16,), 7.0))
    ops = r.ops(0)
    mul = next(o for o in ops if o.name == "mul")
    ar = next(o for o in ops if o.kind == "comm")
    add = next(o for o in ops if o.name == "add")
    assert mul.end_ns <= ar.start_ns and ar.end_ns <= add.start_ns


def test_ring_p2p_overlapped_with_matmul():
    """Ring attention's loop: isend/irecv the next block around the ring while a matmul runs on
    the compute stream; the right blocks arrive and the transfer hides behind the compute."""
    def fn(compute, rows, overlap=True):
        def body():
            r, n = dist.get_rank(), dist.get_world_size()
            dev = torch.npu.current_device()
            block = torch.full((rows, 1024), float(r), device=dev)
            q = torch.ones(compute, compute, device=dev)
            seen = [block[0, 0]]
            for _ in range(n - 1):
                nxt = torch.empty_like(block)
                reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, block, (r + 1) % n),
                                               dist.P2POp(dist.irecv, nxt, (r - 1) % n)])
                if not overlap:
                    for req in reqs:
                        req.wait()
                q = q @ q / compute  # compute while the block travels
                for req in reqs:
                    req.wait()
                block = nxt
                seen.append(block[0, 0])
            return [float(v) for v in seen] if block.device.type == "cpu" else None
        return body
    n = 4
    for r, seen in enumerate(ct.run(fn(64, 8), world_size=n).returns):
        assert seen == [float((r - i) % n) for i in range(n)]
    # Shapes only: a 16 MiB block against a 4096^3 matmul (hidden) and a 256^3 one (exposed).
    heavy = ct.run(fn(4096, 4096), world_size=n, numerics=False)
    ops = heavy.ops(0)
    comm = [o for o in ops if o.kind == "comm"]
    mms = [o for o in ops if o.name.startswith("mm")]
    assert len(comm) == n - 1 and len(mms) == n - 1
    for c, m in zip(comm, mms):  # each transfer ends while its step's matmul computes
        assert m.start_ns < c.end_ns <= m.end_ns
    serial = ct.run(fn(4096, 4096, overlap=False), world_size=n, numerics=False)
    hidden = sum(c.end_ns - c.start_ns for c in comm)
    # (overlapped compute and transfers slow each other down: the profile's contention)
    assert heavy.makespan_ns <= serial.makespan_ns - 0.5 * hidden
    light = ct.run(fn(256, 4096), world_size=n, numerics=False)
    lc = [o for o in light.ops(0) if o.kind == "comm"]
    lm = [o for o in light.ops(0) if o.name.startswith("mm")]
    assert all(c.end_ns > m.end_ns for c, m in zip(lc, lm))  # the transfer is exposed


def test_segment_verdicts_against_a_serial_baseline():
    def fn(overlap):
        def body():
            x = torch.empty(4096, 4096, dtype=torch.bfloat16, device=torch.npu.current_device())
            g = torch.empty(8192, 4096, dtype=torch.bfloat16, device=torch.npu.current_device())
            with ct.segment("fwd mlp.up"):
                w = dist.all_reduce(g, async_op=True)
                if not overlap:
                    w.wait()
                y = x @ x
                w.wait()
            return y.shape
        return body
    serial = ct.run(fn(False), world_size=8, numerics=False)
    split = ct.run(fn(True), world_size=8, numerics=False)
    assert split.makespan_ns < serial.makespan_ns
    verdicts = split.verdicts(serial)
    assert set(verdicts) == {"fwd mlp.up"}
    assert "fwd mlp.up" in split.summary(baseline=serial)
    assert verdicts["fwd mlp.up"].text


def test_cuda_names_unchanged_off_rank_threads():
    ct.install_device_shim()
    assert torch.cuda.is_available() is False
    with pytest.raises(Exception):
        torch.cuda.current_device()  # torch's own: no CUDA here
    assert "torch_npu" in sys.modules


def test_elapsed_time_is_modeled_after_the_run():
    def fn():
        a, b = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
        x = torch.empty(2048, 2048, dtype=torch.bfloat16, device=torch.npu.current_device())
        x.zero_()
        a.record()
        x @ x
        b.record()
        with pytest.raises(cocemu.Error, match="once cocemu.torch.run has returned"):
            a.elapsed_time(b)
        return a, b
    r = ct.run(fn, world_size=1, numerics=False)
    a, b = r.returns[0]
    zero = next(o for o in r.ops(0) if o.name == "zero_")
    mm = next(o for o in r.ops(0) if o.name.startswith("mm"))
    assert mm.work_ns == pytest.approx(cocemu.gemm_ns(PROFILE, 2048, 2048, 2048, "bf16"))
    assert r.elapsed_time(a, b) == pytest.approx((mm.end_ns - zero.end_ns) / 1e6, rel=1e-9)


def test_run_result_traces(tmp_path):
    def fn():
        x = torch.ones(64, 64)
        dist.all_reduce(x)
        return x @ x
    r = ct.run(fn, world_size=2)
    r.write_chrome_trace(str(tmp_path / "t.json"))
    r.write_svg(str(tmp_path / "t.svg"), "torch")
    trace = (tmp_path / "t.json").read_text()
    assert "mm 64x64x64" in trace and "all_reduce" in trace
    assert "torch" in (tmp_path / "t.svg").read_text()
    assert r.n_ranks == 2 and r.makespan_ns > 0 and "modeled" in r.summary()
