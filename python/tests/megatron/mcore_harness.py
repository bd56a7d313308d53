"""The harness of the Megatron-core tests in this folder: the counterpart of `Utils` in
Megatron-LM's tests/unit_tests/test_utilities.py (tag core_v0.16.1), pointed at a backend chosen by
the environment instead of NCCL. (A module of its own, not conftest.py, so that the test files can
import it by a name no other folder's conftest shares.)

Each rank is a process started by torchrun; the process group is made once per process from
torchrun's env:// rendezvous (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and kept until the end of
the session; `initialize_model_parallel` / `destroy_model_parallel` make and drop Megatron's groups
around every test, as upstream's do.

    COCEMU_MEGATRON_BACKEND  "cocemu" (default: `import cocemu.torch`, its device shim maps
                             `.cuda()` and torch.cuda.* to the rank's device) or "gloo" (torch's
                             own CPU backend, for comparison: tests that need a device are skipped)
    COCEMU_MEGATRON_TIMEOUT_S  the process group's timeout (default 300)
"""
import os
from datetime import timedelta

import torch
import torch.distributed as dist

BACKENDS = ("cocemu", "gloo")


def selected_backend():
    """The backend named by COCEMU_MEGATRON_BACKEND; a clear error for any other value."""
    backend = os.environ.get("COCEMU_MEGATRON_BACKEND", "cocemu")
    if backend not in BACKENDS:
        raise ValueError(f"COCEMU_MEGATRON_BACKEND={backend!r} is not a backend these tests run "
                         f"on; allowed: {', '.join(BACKENDS)}")
    return backend


BACKEND = selected_backend()
if BACKEND == "cocemu":
    # Before Megatron is imported: megatron.core.tensor_parallel.random binds torch.cuda's
    # `_lazy_call`, `_lazy_init` and `device` when it is imported.
    import cocemu.torch  # noqa: F401  (registers the "cocemu" backend and the device shim)

import megatron.core.parallel_state as ps  # noqa: E402


def _int_env(name, default):
    value = os.environ.get(name, default)
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer") from None


def has_device():
    """True when `.cuda()` and torch.cuda's RNG work here: on cocemu (its shim) or a real GPU."""
    return BACKEND == "cocemu" or torch.cuda.is_available()


class Utils:
    """Upstream's Utils: the rank and world size of this process and the init/destroy steps."""

    world_size = _int_env("WORLD_SIZE", "1")
    rank = _int_env("LOCAL_RANK", "0")
    inited = False

    @staticmethod
    def initialize_distributed():
        if not dist.is_initialized():
            if has_device() and torch.cuda.device_count() > 0:
                torch.cuda.set_device(Utils.rank % torch.cuda.device_count())
            timeout = timedelta(seconds=_int_env("COCEMU_MEGATRON_TIMEOUT_S", "300"))
            dist.init_process_group(BACKEND, timeout=timeout)  # torchrun's env:// rendezvous
            expected = (Utils.world_size, _int_env("RANK", "0"))
            if (dist.get_world_size(), dist.get_rank()) != expected:
                raise RuntimeError(
                    f"init_process_group({BACKEND!r}) gave rank {dist.get_rank()} of "
                    f"{dist.get_world_size()}; the environment says RANK={expected[1]}, "
                    f"WORLD_SIZE={expected[0]}")
            dist.barrier()
        Utils.inited = True

    @staticmethod
    def destroy_model_parallel():
        if not Utils.inited:
            return
        dist.barrier()
        ps.destroy_model_parallel()
        Utils.inited = False

    @staticmethod
    def initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
                                  virtual_pipeline_model_parallel_size=None, **kwargs):
        ps.destroy_model_parallel()
        Utils.initialize_distributed()
        ps.initialize_model_parallel(tensor_model_parallel_size, pipeline_model_parallel_size,
                                     virtual_pipeline_model_parallel_size, **kwargs)
        Utils.inited = True
