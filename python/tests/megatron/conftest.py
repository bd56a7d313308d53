"""Megatron-core's own tensor-parallel unit tests, the same checks written again against the
installed megatron-core (0.16.1, pinned in python/requirements.txt), run one process per rank under
torchrun on backend "cocemu" (or torch's "gloo", for comparison):

    cd python/tests/megatron && PYTHONPATH=<build>/python OPENBLAS_NUM_THREADS=1 \
        <venv>/bin/python -m torch.distributed.run --standalone --nproc-per-node 8 \
        -m pytest -q -p no:cacheprovider .
    (COCEMU_MEGATRON_BACKEND=gloo for torch's backend)

Megatron's tests are not in its PyPI package, so each file here mirrors one upstream file of
Megatron-LM at tag core_v0.16.1, one test per upstream test with the same name and the same
assertions (the harness's `Utils` is mcore_harness.py, after tests/unit_tests/test_utilities.py):

    test_mappings.py       tests/unit_tests/tensor_parallel/test_mappings.py:
                           test_CopyToModelParallelRegion, test_ReduceFromModelParallelRegion,
                           test_ScatterToModelParallelRegion, test_GatherFromModelParallelRegion,
                           test_ScatterToSequenceParallelRegion,
                           test_GatherFromSequenceParallelRegion,
                           test_ReduceScatterToSequenceParallelRegion
    test_layers.py         tests/unit_tests/tensor_parallel/test_layers.py:
                           test_LinearWithFrozenWeight[1-False], [8-True]
    test_random.py         tests/unit_tests/tensor_parallel/test_random.py:
                           test_cuda_rng_states_tracker, test_double_fork_cuda_rng_states_tracker
                           [True], [False], test_convert_cuda_rng_state,
                           test_model_parallel_cuda_manual_seed, test_checkpoint,
                           test_checkpoint_without_output
    test_cross_entropy.py  tests/unit_tests/tensor_parallel/test_cross_entropy.py:
                           test_vocab_parallel_cross_entropy
    test_data.py           tests/unit_tests/tensor_parallel/test_data.py: test_broadcast_data
    test_utils.py          tests/unit_tests/tensor_parallel/test_tensor_parallel_utils.py:
                           test_split_tensor_along_last_dim, test_split_tensor_into_1d_equal_chunks,
                           test_gather_split_1d_tensor, test_vocab
    test_initialization.py tests/unit_tests/tensor_parallel/test_initialization.py: Test::
                           test_embedding_init, test_row_init, test_col_init (test_te_col_init and
                           test_te_row_init need Transformer Engine: not written)
    test_schedules.py      tests/unit_tests/pipeline_parallel/test_schedules.py:
                           test_get_forward_backward_func,
                           test_forward_backward_func_without_pipeline_parallel,
                           test_forward_backward_func_with_pipeline_parallel

The upstream tests assume 8 ranks (tensor x pipeline = 4 x 2, 2 x 4, 8 x 1): with any other
WORLD_SIZE every test is skipped, saying so. Tests marked `needs_device` call `.cuda()`,
`device="cuda"` or torch.cuda's random state: cocemu's device shim serves them; on gloo without a
GPU they are skipped with that reason.
"""
import os

import pytest

WORLD_SIZE = 8  # the upstream tests' layouts need 8 ranks

try:
    import megatron.core  # noqa: F401
    _MISSING = None
except ImportError as e:  # pragma: no cover - depends on the environment
    _MISSING = f"megatron-core is not installed ({e}); pip install megatron-core==0.16.1"

if _MISSING is None:
    import mcore_harness
    from mcore_harness import Utils


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "needs_device: calls .cuda() or torch.cuda's RNG (cocemu's device shim or a GPU)")


def pytest_collection_modifyitems(config, items):
    if _MISSING is not None:
        reason = _MISSING
    elif "WORLD_SIZE" not in os.environ:
        reason = (f"not under torchrun (WORLD_SIZE unset): run with torchrun --nproc-per-node "
                  f"{WORLD_SIZE} -m pytest")
    elif Utils.world_size != WORLD_SIZE:
        reason = (f"WORLD_SIZE={Utils.world_size}: Megatron's tensor-parallel tests need "
                  f"{WORLD_SIZE} ranks (torchrun --nproc-per-node {WORLD_SIZE})")
    else:
        reason = None
    for item in items:
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
        elif "needs_device" in item.keywords and not mcore_harness.has_device():
            item.add_marker(pytest.mark.skip(
                reason=f"needs a device (.cuda(), torch.cuda RNG): backend "
                       f"{mcore_harness.BACKEND!r} on a CPU has none; cocemu's shim provides it"))


@pytest.fixture(autouse=True)
def model_parallel_teardown():
    """Drops Megatron's groups after every test (a barrier first), also after a failing one, so the
    ranks stay in step for the next test."""
    yield
    if _MISSING is None:
        Utils.destroy_model_parallel()


@pytest.fixture(scope="session", autouse=True)
def process_group():
    """The rank's process group, from the first test to the last: made before any test as a training
    script does (so the tests that use torch.cuda's RNG without Megatron's groups find the rank's
    device whichever file runs first), destroyed after a last barrier."""
    if _MISSING is None and Utils.world_size == WORLD_SIZE and "WORLD_SIZE" in os.environ:
        Utils.initialize_distributed()
    yield
    if _MISSING is None:
        import torch.distributed as dist
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
