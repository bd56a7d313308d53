"""Megatron-LM core_v0.16.1 tests/unit_tests/tensor_parallel/test_mappings.py, the same checks on
megatron.core.tensor_parallel.mappings: tensor parallel 4 x pipeline 2 on 8 ranks, so ranks 0-3
and 4-7 are the two tensor-parallel groups (the sum of the ranks of each: 6 and 22)."""
import pytest
import torch

pytest.importorskip("megatron.core")

from megatron.core.tensor_parallel import mappings  # noqa: E402
from megatron.core.utils import get_tensor_model_parallel_group_if_none  # noqa: E402
from mcore_harness import Utils  # noqa: E402

pytestmark = pytest.mark.needs_device


def _tp_ctx(group, **fields):
    """The autograd ctx a mapping's backward reads: its group and any saved fields."""
    return type("Ctx", (), dict(group=group, **fields))()


def _group_sum():
    return 22.0 if Utils.rank >= 4 else 6.0


def _ranks_of_my_group(n):
    """The four ranks of this rank's tensor-parallel group, each repeated n times, in order."""
    base = 4 if Utils.rank >= 4 else 0
    return torch.cat([torch.full((n,), float(base + i)) for i in range(4)]).cuda()


def test_CopyToModelParallelRegion():
    Utils.initialize_model_parallel(4, 2)
    x = torch.ones(1).cuda() * Utils.rank
    group = get_tensor_model_parallel_group_if_none(tp_group=None)

    grad, _ = mappings._CopyToModelParallelRegion.backward(_tp_ctx(group), x)  # all-reduce
    assert torch.equal(grad, torch.ones(1).cuda() * _group_sum())
    assert torch.equal(x, mappings.copy_to_tensor_model_parallel_region(x))  # identity forward
    assert torch.equal(x, mappings._CopyToModelParallelRegion.symbolic(None, x, group))
    Utils.destroy_model_parallel()


def test_ReduceFromModelParallelRegion():
    Utils.initialize_model_parallel(4, 2)
    x = torch.ones(1).cuda() * Utils.rank
    group = get_tensor_model_parallel_group_if_none(tp_group=None)
    expected = torch.ones(1).cuda() * _group_sum()

    assert torch.equal(mappings._ReduceFromModelParallelRegion.symbolic(None, x, group), expected)
    x = torch.ones(1).cuda() * Utils.rank
    assert torch.equal(mappings.reduce_from_tensor_model_parallel_region(x), expected)
    grad, _ = mappings._ReduceFromModelParallelRegion.backward(_tp_ctx(group), x)  # identity
    assert torch.equal(grad, x)
    Utils.destroy_model_parallel()


def test_ScatterToModelParallelRegion():
    Utils.initialize_model_parallel(4, 2)
    x = torch.rand((8, 4)).cuda()
    group = get_tensor_model_parallel_group_if_none(tp_group=None)
    column = Utils.rank % 4  # each rank keeps its column of the last dimension

    assert torch.equal(mappings.scatter_to_tensor_model_parallel_region(x),
                       x[:, column].reshape((8, 1)))
    assert torch.equal(mappings._ScatterToModelParallelRegion.symbolic(None, x, group),
                       x[:, column].reshape((8, 1)))

    x = torch.ones(8).cuda() * Utils.rank
    grad, _ = mappings._ScatterToModelParallelRegion.backward(_tp_ctx(group), x)  # all-gather
    assert torch.equal(grad, _ranks_of_my_group(8))
    Utils.destroy_model_parallel()


def test_GatherFromModelParallelRegion():
    Utils.initialize_model_parallel(4, 2)
    x = torch.rand((8, 4)).cuda()
    group = get_tensor_model_parallel_group_if_none(tp_group=None)
    column = Utils.rank % 4

    grad, _ = mappings._GatherFromModelParallelRegion.backward(_tp_ctx(group), x)  # split
    assert torch.equal(grad, x[:, column].reshape((8, 1)))

    x = torch.ones(8).cuda() * Utils.rank
    expected = _ranks_of_my_group(8)
    assert torch.equal(mappings.gather_from_tensor_model_parallel_region(x), expected)
    assert torch.equal(mappings._GatherFromModelParallelRegion.symbolic(None, x, group), expected)
    Utils.destroy_model_parallel()


def test_ScatterToSequenceParallelRegion():
    Utils.initialize_model_parallel(4, 2)
    x = torch.rand((8, 4)).cuda()
    group = get_tensor_model_parallel_group_if_none(tp_group=None)
    first = (Utils.rank % 4) * 2  # each rank keeps two rows of the first dimension

    assert torch.equal(mappings._ScatterToSequenceParallelRegion.symbolic(None, x, group),
                       x[first:first + 2, :])
    assert torch.equal(mappings.scatter_to_sequence_parallel_region(x), x[first:first + 2, :])

    x = torch.ones(4).cuda() * Utils.rank
    # upstream calls the model-parallel scatter's backward here (an all-gather of the last dim)
    grad, _ = mappings._ScatterToModelParallelRegion.backward(_tp_ctx(group), x)
    assert torch.equal(grad, _ranks_of_my_group(4))
    Utils.destroy_model_parallel()


def test_GatherFromSequenceParallelRegion():
    Utils.initialize_model_parallel(4, 2)
    x = torch.ones(4).cuda() * Utils.rank
    group = get_tensor_model_parallel_group_if_none(tp_group=None)
    expected = _ranks_of_my_group(4)

    assert torch.equal(mappings.gather_from_sequence_parallel_region(x), expected)
    assert torch.equal(mappings._GatherFromSequenceParallelRegion.symbolic(None, x, group),
                       expected)

    rows = torch.vstack([torch.ones(4) * i for i in range(4)]).cuda()
    ctx = _tp_ctx(group, tensor_parallel_output_grad=True, output_split_sizes=None,
                  use_global_buffer=False)
    grads = mappings._GatherFromSequenceParallelRegion.backward(ctx, rows)  # reduce-scatter
    # each rank gets its row summed over the 4 ranks: 4 * (rank within the group)
    assert torch.equal(grads[0], torch.ones((1, 4)).cuda() * 4 * (Utils.rank % 4))
    Utils.destroy_model_parallel()


def test_ReduceScatterToSequenceParallelRegion():
    Utils.initialize_model_parallel(4, 2)
    rows = torch.vstack([torch.ones(4) * i for i in range(4)]).cuda()
    group = get_tensor_model_parallel_group_if_none(tp_group=None)
    expected = torch.ones(4).cuda() * 4 * (Utils.rank % 4)

    out = mappings.reduce_scatter_to_sequence_parallel_region(rows)
    assert torch.equal(out[0], expected)
    assert torch.equal(mappings._ReduceScatterToSequenceParallelRegion.symbolic(None, rows, group),
                       expected.reshape((1, 4)))

    x = torch.ones(4).cuda() * Utils.rank
    ctx = _tp_ctx(group, input_split_sizes=None, use_global_buffer=False)
    grads = mappings._ReduceScatterToSequenceParallelRegion.backward(ctx, x)  # all-gather
    assert torch.equal(grads[0], _ranks_of_my_group(4))
    Utils.destroy_model_parallel()
