"""A rank is a device (R-PY-13): torch.cuda / torch.npu answer as a device of the emulated node on
rank threads, device arguments give the rank's tensors, record_stream, nvtx ranges as segments,
timing events, and the per-rank modeled allocator checked against the profile's HBM."""
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import cocemu  # noqa: E402
import cocemu.torch as ct  # noqa: E402

PROFILE = cocemu.load_profile("ascend-910b")  # 8 devices a node, 64e9 bytes of HBM


@pytest.mark.parametrize("world_size", [1, 3, 8, 12])
def test_cuda_and_npu_answer_as_the_ranks_device(world_size):
    def fn():
        return (torch.cuda.is_available(), torch.npu.is_available(), torch.cuda.device_count(),
                torch.npu.device_count(), torch.cuda.current_device(),
                torch.npu.current_device(), f"cuda:{torch.cuda.current_device()}")
    node = min(8, world_size)
    expected = [(True, True, node, node, r % 8, r % 8, f"cuda:{r % 8}")
                for r in range(world_size)]
    assert ct.run(fn, world_size=world_size).returns == expected


def test_set_device_accepts_only_the_local_rank():
    def fn(device):
        def body():
            torch.cuda.set_device(dist.get_rank())
            torch.npu.set_device(f"npu:{dist.get_rank()}")
            torch.cuda.set_device(torch.device("cuda", dist.get_rank()))
            with torch.cuda.device(dist.get_rank()):
                pass
            if dist.get_rank() == 1:
                torch.cuda.set_device(device)
        return body
    ct.run(fn(1), world_size=2)
    with pytest.raises(cocemu.Error, match=r"rank 1: torch.cuda.set_device\(0\).*device 1 of its "
                                           r"node.*only 1"):
        ct.run(fn(0), world_size=2)
    with pytest.raises(cocemu.Error, match=r"rank 1: .*index 5 out of range.*2 devices \(0..1\)"):
        ct.run(fn("cuda:5"), world_size=2)
    with pytest.raises(cocemu.Error, match=r"cannot read the device 'cuda:x'"):
        ct.run(fn("cuda:x"), world_size=2)


@pytest.mark.parametrize("numerics", [True, False])
def test_device_arguments_give_the_ranks_tensors(numerics):
    def fn():
        r = dist.get_rank()
        made = [torch.zeros(2, device="cuda"), torch.ones(2, device=f"cuda:{r}"),
                torch.ones(2, device="npu"), torch.ones(2, device=f"npu:{r}"),
                torch.ones(2, device=torch.device("cuda", r)), torch.ones(2, device=r),
                torch.ones(2).cuda(), torch.ones(2).cuda(r), torch.ones(2).npu(),
                torch.ones(2).to("cuda"), torch.ones(2).to(device="npu:0"),
                torch.ones(2).to(torch.device("cuda"), torch.float16),
                torch.empty(3).new_zeros(2, device="cuda"),
                torch.full((2,), 1.0, device=torch.cuda.current_device())]
        lin = torch.nn.Linear(2, 2).cuda()
        lin2 = torch.nn.Linear(2, 2).to("cuda", torch.float64)
        lin3 = torch.nn.Linear(2, 2).npu()
        made += [lin.weight, lin2.bias, lin3.weight]
        return {t.device.type for t in made}, lin2.bias.dtype, made[11].dtype
    backing = "cpu" if numerics else "meta"
    for out in ct.run(fn, world_size=2, numerics=numerics).returns:
        assert out == ({backing}, torch.float64, torch.float16)


def test_host_device_transfers_copy_as_on_a_gpu():
    def fn():
        host = torch.zeros(3)
        dev = host.cuda()
        dev += 1                       # the host tensor is not the device tensor
        same = dev.cuda() is dev and dev.to("cuda") is dev
        back = dev.cpu()
        back += 1
        moved = host.to("cuda")
        moved += 5
        like = host.to(dev)             # to(other): other's device
        like += 7
        with pytest.raises(cocemu.Error, match=r"Tensor.cuda\('cpu'\): not a cuda/npu device"):
            host.cuda("cpu")
        return host.tolist(), dev.tolist(), back.tolist(), same, dev.get_device(), \
            host.get_device(), dev.to(host) is not dev
    assert ct.run(fn, world_size=2).returns == [
        ([0.0] * 3, [1.0] * 3, [2.0] * 3, True, r, -1, True) for r in range(2)]


def test_bad_device_index_in_a_factory_is_an_error_naming_it():
    def fn():
        torch.zeros(2, device="cuda:4")
    with pytest.raises(cocemu.Error, match=r"rank \d: torch.zeros: device index 4 out of range: "
                                           r"the rank's node has 2 devices"):
        ct.run(fn, world_size=2)


def test_off_rank_threads_torch_cuda_answers_as_before():
    ct.install_device_shim()
    assert torch.cuda.is_available() is False
    assert torch.cuda.device_count() == 0
    with pytest.raises(Exception):
        torch.zeros(2, device="cuda")


def test_custom_function_backward_sees_the_device():
    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * torch.full_like(g, 2.0) + torch.zeros(g.shape, device="cuda")

    def fn():
        x = torch.ones(3, device="cuda", requires_grad=True)
        Double.apply(x).sum().backward()
        return x.grad.tolist()
    assert ct.run(fn, world_size=2).returns == [[2.0] * 3] * 2


def test_record_stream_takes_a_cocemu_stream():
    def fn(bad):
        def body():
            side = torch.cuda.Stream()
            x = torch.ones(4, device="cuda")
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                y = x * 2
            y.record_stream(side)
            x.record_stream(torch.cuda.current_stream())
            if bad:
                x.record_stream("side")
            return y.tolist()
        return body
    assert ct.run(fn(False), world_size=1).returns == [[2.0] * 4]
    with pytest.raises(cocemu.Error, match="expected a cocemu.torch Stream.*got str"):
        ct.run(fn(True), world_size=1)


def test_nvtx_ranges_are_segments():
    def fn():
        x = torch.ones(64, 64)
        assert torch.cuda.nvtx.range_push("fwd") == 0
        y = x @ x
        with torch.cuda.nvtx.range("attn {}", 3):
            z = y + 1
        w = z * 2
        assert torch.cuda.nvtx.range_pop() == 0
        assert torch.cuda.nvtx.range_pop() == -1  # none open: NVTX's answer
        torch.cuda.nvtx.mark("here")
        return (w - 1).sum().item()
    r = ct.run(fn, world_size=1)
    by_name = {o.name.split()[0]: o.segment for o in r.ops(0) if o.lane_name != "host"}
    assert by_name["mm"] == "fwd" and by_name["add"] == "attn 3" and by_name["mul"] == "fwd"
    assert by_name["sub"] != "fwd"


def test_event_elapsed_time_after_the_run_is_the_modeled_time():
    def fn():
        a = torch.ones(1024, 1024, device="cuda")
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        b = a @ a
        end.record()
        with pytest.raises(cocemu.Error, match="once cocemu.torch.run has returned"):
            start.elapsed_time(end)
        untimed = torch.cuda.Event()
        untimed.record()
        return start, end, untimed, b.shape
    r = ct.run(fn, world_size=1)
    start, end, untimed, _ = r.returns[0]
    mm = next(o for o in r.ops(0) if o.name.startswith("mm"))
    assert start.elapsed_time(end) == pytest.approx(r.elapsed_time(start, end))
    assert start.elapsed_time(end) >= (mm.end_ns - mm.start_ns) / 1e6 > 0
    with pytest.raises(cocemu.Error, match="enable_timing=True"):
        start.elapsed_time(untimed)


def test_memory_allocated_counts_the_ranks_live_device_tensors():
    def fn():
        base = torch.cuda.memory_allocated()
        a = torch.empty(1000, device="cuda")                       # 4000 bytes
        host = torch.empty(5000)                                   # host memory: not counted
        b = torch.empty(250, dtype=torch.float64, device="npu")    # 2000 bytes
        v = a.view(10, 100)                                        # a view: nothing new
        after = torch.cuda.memory_allocated() - base
        del a
        still = torch.cuda.memory_allocated() - base               # the view keeps a's storage
        del v
        freed = torch.cuda.memory_allocated() - base
        peak = torch.cuda.max_memory_allocated() - base
        torch.cuda.reset_peak_memory_stats()
        reset = torch.cuda.max_memory_allocated() - base
        free, total = torch.cuda.mem_get_info()
        return after, still, freed, peak, reset, total, total - free - base, host.numel(), \
            b.numel()
    r = ct.run(fn, world_size=2)
    for out in r.returns:
        assert out == (6000, 6000, 2000, 6000, 2000, PROFILE.memory_capacity, 2000, 5000, 250)
    assert r.peak_memory_bytes == [6000, 6000]


def test_dry_run_over_the_hbm_is_an_error_naming_the_tensor_and_totals():
    def fn():
        w = torch.empty(8192, 28672, dtype=torch.bfloat16, device="cuda")  # 0.47e9 bytes
        acts = [torch.empty(16384, 28672, dtype=torch.bfloat16, device="cuda")
                for _ in range(80)]  # 0.94e9 bytes each
        return w.shape, len(acts)
    with pytest.raises(cocemu.Error) as e:
        ct.run(fn, world_size=2, numerics=False)
    msg = str(e.value)
    act, w = 16384 * 28672 * 2, 8192 * 28672 * 2
    n = (64_000_000_000 - w) // act + 1  # the activation that does not fit
    assert f"aten.empty allocates a [16384, 28672] bfloat16 tensor ({act} bytes" in msg
    assert f"brings the rank's live device tensors to {w + n * act} bytes" in msg
    assert "(64000000000 bytes) of HBM of profile ascend-910b" in msg
    assert "largest other live tensors: [16384, 28672] bfloat16 from aten.empty" in msg
    assert e.value.code == "resource_exhausted"


def test_dry_run_peak_at_production_shapes():
    def fn():
        x = torch.empty(4096, 8192, dtype=torch.bfloat16, device="cuda")
        w = torch.empty(28672, 8192, dtype=torch.bfloat16, device="cuda")
        y = x @ w.t()
        del y
        return torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()
    r = ct.run(fn, world_size=2, numerics=False)
    big = 4096 * 8192 * 2 + 28672 * 8192 * 2
    assert r.returns == [(big + 4096 * 28672 * 2, big)] * 2
    assert r.peak_memory_bytes == [big + 4096 * 28672 * 2] * 2
