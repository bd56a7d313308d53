"""A Megatron-style tensor-parallel unit test, one process per rank as Megatron runs its own
tests (docs/pytorch.md):
    PYTHONPATH=build/python .venv/bin/python -m torch.distributed.run --standalone \
        --nproc-per-node 4 -m pytest -q -p no:cacheprovider examples/python/test_torchrun_tp.py"""
import pytest
import torch
import torch.distributed as dist

import cocemu.torch  # noqa: F401  (registers the "cocemu" backend)

_TP_GROUP = None  # the rank's group in a module global, as Megatron's parallel_state keeps it


@pytest.fixture(scope="module", autouse=True)
def tensor_parallel():
    global _TP_GROUP
    if not dist.is_initialized():
        dist.init_process_group("cocemu")  # torchrun's env:// rendezvous
    _TP_GROUP = dist.new_group(list(range(dist.get_world_size())))
    yield
    dist.barrier()


def row_parallel_linear(x_shard, w_shard):  # the code under test
    y = x_shard @ w_shard.t()
    dist.all_reduce(y, group=_TP_GROUP)
    return y


def test_each_rank_keeps_its_own_group():
    assert dist.get_rank(_TP_GROUP) == dist.get_rank()
    assert torch.cuda.current_device() == dist.get_rank()  # one device per rank of a node


def test_row_parallel_linear_matches_the_full_matmul():
    r, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)  # the same full tensors on every rank
    x = torch.randn(8, 16 * n, device="cuda")
    w = torch.randn(4, 16 * n, device="cuda")
    part = slice(16 * r, 16 * (r + 1))
    y = row_parallel_linear(x[:, part].contiguous(), w[:, part].contiguous())
    torch.testing.assert_close(y, x @ w.t(), rtol=1e-5, atol=1e-4)
