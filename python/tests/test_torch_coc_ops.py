"""MindSpeed's coc_ops (mindspeed.ops.lcal_functional) over cocemu's fused kernels, tested the
way MindSpeed's own test_lcal_coc.py tests them: against the unfused matmul + all_reduce /
_all_gather_base / _reduce_scatter_base reference, relative error per element within 5e-3."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import cocemu  # noqa: E402
import cocemu.torch as ct  # noqa: E402

TEST_RATIO, MIN_NORMAL = 5e-3, 6e-5
WORLD = 4


def worst_relative_error(actual, reference):
    a = actual.to(torch.float32).numpy()
    p = reference.to(torch.float32).numpy()
    limit = np.abs(a * TEST_RATIO)
    limit[limit < MIN_NORMAL] = MIN_NORMAL
    return float(np.max(np.abs(a - p) / limit)) * TEST_RATIO


def inputs(m, k, n, dtype, trans_b):
    torch.manual_seed(dist.get_rank())
    dev = torch.npu.current_device()
    input1 = torch.randn(m, k, dtype=dtype, device=dev)
    input2 = torch.randn(k, n, dtype=dtype, device=dev)
    if trans_b:
        input2 = input2.t().contiguous()  # [n, k]: read as transposed
    bias = torch.randn(1, n, dtype=dtype, device=dev)
    return input1, input2, bias


def weight(input2, k):
    return input2.t() if input2.shape[0] != k else input2


def matmul(a, b):
    """The unfused reference GEMM: f32 accumulation, rounded once to the operands' dtype (torch
    1.13 has no float16 GEMM on CPU)."""
    return torch.matmul(a.float(), b.float()).to(a.dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("trans_b", [False, True])
def test_coc_ops_match_the_unfused_reference(dtype, trans_b):
    m, k, n = 64, 96, 80

    def fn():
        ct.install_mindspeed_shims()
        from mindspeed.ops.lcal_functional import coc_ops
        ws = dist.get_world_size()
        input1, input2, bias = inputs(m, k, n, dtype, trans_b)
        w = weight(input2, k)
        errors = {}
        dev = torch.npu.current_device()

        out = torch.empty(m, n, dtype=dtype, device=dev)
        coc_ops.matmul_all_reduce(input1, input2, out, bias)
        ref = matmul(input1, w)
        dist.all_reduce(ref)
        errors["matmul_all_reduce"] = worst_relative_error(out, ref + bias)

        part = input1[: m // ws].contiguous()
        out = torch.empty(m, n, dtype=dtype, device=dev)
        coc_ops.all_gather_matmul(part, input2, out, bias)
        full = torch.empty(m, k, dtype=dtype, device=dev)
        dist._all_gather_base(full, part)
        errors["all_gather_matmul"] = worst_relative_error(out, matmul(full, w) + bias)

        out = torch.empty(m, n, dtype=dtype, device=dev)
        comm = torch.empty(m, k, dtype=dtype, device=dev)
        coc_ops.all_gather_matmul_v2(part, input2, out, comm, bias)
        errors["all_gather_matmul_v2"] = worst_relative_error(out, matmul(full, w) + bias)
        errors["all_gather_matmul_v2 comm_output"] = float((comm != full).sum())

        out = torch.empty(m // ws, n, dtype=dtype, device=dev)
        coc_ops.matmul_reduce_scatter(input1, input2, out, bias)
        ref = torch.empty(m // ws, n, dtype=dtype, device=dev)
        dist._reduce_scatter_base(ref, matmul(input1, w))
        errors["matmul_reduce_scatter"] = worst_relative_error(out, ref + bias)
        return errors

    for errors in ct.run(fn, world_size=WORLD).returns:
        for name, e in errors.items():
            assert e <= TEST_RATIO, (name, e)


def test_coc_ops_bad_input_is_a_clear_error():
    def fn():
        from mindspeed.ops.lcal_functional import coc_ops
        x = torch.ones(8, 16, dtype=torch.float16)
        coc_ops.matmul_all_reduce(x, torch.ones(5, 7, dtype=torch.float16),
                                  torch.empty(8, 7, dtype=torch.float16))
    ct.install_mindspeed_shims()
    with pytest.raises(cocemu.Error, match=r"rank \d: coc_ops.matmul_all_reduce: input2 \(5, 7\)"):
        ct.run(fn, world_size=2)

    def f32():
        from mindspeed.ops.lcal_functional import coc_ops
        x = torch.ones(8, 16)
        coc_ops.matmul_all_reduce(x, torch.ones(16, 4), torch.empty(8, 4))
    with pytest.raises(cocemu.Error, match="float16 or bfloat16"):
        ct.run(f32, world_size=2)


def test_coc_ops_priced_as_the_fused_kernel():
    m, k, n = 4096, 4096, 8192

    def fn():
        from mindspeed.ops.lcal_functional import coc_ops
        dev = torch.npu.current_device()
        x = torch.empty(m, k, dtype=torch.bfloat16, device=dev)
        w = torch.empty(n, k, dtype=torch.bfloat16, device=dev)
        out = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
        coc_ops.matmul_all_reduce(x, w, out)
    ct.install_mindspeed_shims()
    r = ct.run(fn, world_size=8, numerics=False)
    fused = [o for o in r.ops(0) if o.lane_name != "host" and o.work_ns > 0]
    assert len(fused) == 1
    expected = cocemu.fused_kernel_ns(r.profile, "matmul_all_reduce", m, k, n, 8, "bf16")
    assert fused[0].work_ns == pytest.approx(expected, rel=1e-9)
