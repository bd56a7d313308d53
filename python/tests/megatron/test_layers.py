"""Megatron-LM core_v0.16.1 tests/unit_tests/tensor_parallel/test_layers.py, the same check on
megatron.core.tensor_parallel.layers.linear_with_frozen_weight: an 8 x 8 identity input times an
all-ones weight split by rows over the tensor-parallel ranks, gathered, summed and
differentiated."""
import pytest
import torch

pytest.importorskip("megatron.core")

from megatron.core.tensor_parallel.layers import linear_with_frozen_weight  # noqa: E402
from megatron.core.tensor_parallel.mappings import (  # noqa: E402
    gather_from_tensor_model_parallel_region)
from mcore_harness import Utils  # noqa: E402


@pytest.mark.needs_device
@pytest.mark.parametrize("tensor_parallel,allreduce_dgrad", [(1, False), (8, True)])
def test_LinearWithFrozenWeight(tensor_parallel, allreduce_dgrad):
    Utils.initialize_model_parallel(tensor_parallel, 1)
    rows = 8 // tensor_parallel  # this rank's share of the weight's output rows

    x = torch.eye(8).cuda()
    x.requires_grad = True
    weight = torch.ones((rows, 8)).cuda()
    bias = torch.zeros(rows).cuda()

    y_part = linear_with_frozen_weight(
        x, weight, bias,
        False,           # gradient_accumulation_fusion
        allreduce_dgrad,
        False,           # sequence_parallel
        None,            # grad_output_buffer
        None)            # wgrad_deferral_limit
    y = gather_from_tensor_model_parallel_region(y_part)  # a no-op with one tensor-parallel rank
    y.sum().backward()

    assert torch.allclose(y, torch.ones(8).cuda())
    assert torch.allclose(x.grad, 8 * torch.ones(8).cuda())
    Utils.destroy_model_parallel()
