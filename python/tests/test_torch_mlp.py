"""bench/torch_speed.py's chunked tensor-parallel MLP (autograd Functions in plain torch, the
script CoC in the forward, Megatron's backward) on cocemu.torch: forward and backward give the
same bits for every chunk count, and a dry run (meta tensors) records the real run's timeline."""
import importlib.util
import os

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import cocemu.torch as ct  # noqa: E402

spec = importlib.util.spec_from_file_location(
    "torch_speed", os.path.join(os.path.dirname(__file__), "..", "..", "bench", "torch_speed.py"))
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def mlp(P, numerics, tokens=64, hidden=32, ffn=64):
    def fn():
        ws, dev = dist.get_world_size(), torch.npu.current_device()
        with ct.unmodeled():  # small integers (and GELU-free): every sum is exact
            r = dist.get_rank()
            x = (torch.arange(tokens // ws * hidden, device=dev) % 5 - 2 + r % 2)
            x = x.reshape(tokens // ws, hidden).float().requires_grad_()
            w1 = (torch.arange(ffn // ws * hidden, device=dev) % 3 - 1).reshape(ffn // ws, hidden)
            w2 = (torch.arange(hidden * ffn // ws, device=dev) % 3 - 1).reshape(hidden, ffn // ws)
            w1, w2 = w1.float().requires_grad_(), w2.float().requires_grad_()
        y = bench.RowSP.apply(torch.relu(bench.ColumnSP.apply(x, w1, P)), w2, P)
        y.backward(torch.ones_like(y))
        return (y.detach(), x.grad, w1.grad, w2.grad) if numerics else None
    return ct.run(fn, world_size=4, numerics=numerics)


def test_forward_and_backward_same_bits_for_every_chunk_count():
    ref = mlp(1, True).returns
    assert ref[0][1].abs().sum() > 0
    for P in (2, 4):
        out = mlp(P, True).returns
        for r in range(4):
            for a, b in zip(ref[r], out[r]):
                assert torch.equal(a, b), (P, r)


def test_dry_run_records_the_real_runs_timeline():
    real, dry = mlp(4, True), mlp(4, False)
    assert real.ops_recorded == dry.ops_recorded
    assert [(o.name, o.start_ns, o.end_ns) for o in real.ops(1)] == \
           [(o.name, o.start_ns, o.end_ns) for o in dry.ops(1)]
