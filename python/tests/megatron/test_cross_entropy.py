"""Megatron-LM core_v0.16.1 tests/unit_tests/tensor_parallel/test_cross_entropy.py, the same check
on megatron.core.tensor_parallel.cross_entropy.vocab_parallel_cross_entropy: tensor parallel 4 x
pipeline 2, each rank holding logits 0..7 for its 8-entry slice of a 32-entry vocabulary."""
import pytest
import torch

pytest.importorskip("megatron.core")

from megatron.core.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy  # noqa: E402
from mcore_harness import Utils  # noqa: E402


@pytest.mark.needs_device
def test_vocab_parallel_cross_entropy():
    Utils.initialize_model_parallel(4, 2)
    # upstream's torch.range(0, 7): float32 0..7, repeated into 16 x 32 on every rank
    logits = torch.arange(0, 8, dtype=torch.float32).repeat(16, 4).cuda()
    target = torch.arange(0, 32, 2).cuda()
    loss = vocab_parallel_cross_entropy(logits, target)
    expected = torch.tensor([10.2309, 8.2309, 6.2309, 4.2309] * 4).cuda()
    assert torch.equal(torch.round(expected), torch.round(loss))
    Utils.destroy_model_parallel()
