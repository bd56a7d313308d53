"""Megatron-LM core_v0.16.1 tests/unit_tests/tensor_parallel/test_data.py, the same check on
megatron.core.tensor_parallel.data.broadcast_data: tensor parallel 2 x pipeline 4, the keys' tensors
broadcast from each tensor-parallel group's first rank."""
import pytest
import torch

pytest.importorskip("megatron.core")

from megatron.core.tensor_parallel.data import broadcast_data  # noqa: E402
from mcore_harness import Utils  # noqa: E402


@pytest.mark.needs_device
def test_broadcast_data():
    Utils.initialize_model_parallel(2, 4)
    data = {k: torch.ones((8, 8)).cuda() * float(k) for k in range(8)}
    out = broadcast_data([0, 1], data, torch.float32)
    assert torch.equal(out[0], data[0])
    assert torch.equal(out[1], data[1])
    Utils.destroy_model_parallel()
