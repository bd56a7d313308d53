"""Megatron-LM core_v0.16.1 tests/unit_tests/tensor_parallel/test_tensor_parallel_utils.py, the same
checks on megatron.core.tensor_parallel.utils (tensor parallel 2 x pipeline 4 where a group is
needed)."""
import pytest
import torch

pytest.importorskip("megatron.core")

import megatron.core.tensor_parallel.utils as util  # noqa: E402
from mcore_harness import Utils  # noqa: E402

rank = Utils.rank


def test_split_tensor_along_last_dim():
    x = torch.rand((3, 4))
    # upstream compares x[0:2, 0:2] and x[2:, 2:] with the halves without asserting it (shapes
    # (2, 2) against (3, 2): never equal); asserted here is what the split must give, the halves
    first, second = util.split_tensor_along_last_dim(x, 2)
    assert torch.equal(first, x[:, 0:2])
    assert torch.equal(second, x[:, 2:4])


def test_split_tensor_into_1d_equal_chunks():
    Utils.initialize_model_parallel(tensor_model_parallel_size=2, pipeline_model_parallel_size=4)
    x = torch.rand((3, 4))
    chunk = util.split_tensor_into_1d_equal_chunks(x)
    half = x.numel() // 2
    start, end = (0, half) if rank % 2 == 0 else (half, x.numel())
    assert torch.equal(chunk, x.flatten()[start:end])
    Utils.destroy_model_parallel()


@pytest.mark.needs_device
def test_gather_split_1d_tensor():
    Utils.initialize_model_parallel(tensor_model_parallel_size=2, pipeline_model_parallel_size=4)
    x = torch.ones((2, 4)).cuda() * rank
    gathered = util.gather_split_1d_tensor(x)
    if rank % 2 == 0:
        expected = torch.concat((x.flatten(), x.flatten() + 1))
    else:
        expected = torch.concat((x.flatten() - 1, x.flatten()))
    assert torch.equal(gathered, expected)
    Utils.destroy_model_parallel()


def test_vocab():
    vocab = 1600
    per_rank = 1600 / Utils.world_size
    expected = (rank * per_rank, (rank + 1) * per_rank)
    assert expected == util.VocabUtility.vocab_range_from_per_partition_vocab_size(
        vocab // Utils.world_size, rank, Utils.world_size)
    assert expected == util.VocabUtility.vocab_range_from_global_vocab_size(
        vocab, rank, Utils.world_size)
