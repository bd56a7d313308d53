"""Megatron-LM core_v0.16.1 tests/unit_tests/pipeline_parallel/test_schedules.py, the same checks on
megatron.core.pipeline_parallel.schedules for the schedule without interleaving and its selection:
test_get_forward_backward_func, test_forward_backward_func_without_pipeline_parallel,
test_forward_backward_func_with_pipeline_parallel (tensor parallel 2 x pipeline 4:
forward_backward_pipelining_without_interleaving, activations of 512 x 8 x 256 float32 sent between
the stages) and test_forward_backward_pipelining_without_interleaving_with_custom_pgs (the same
schedule on groups made by HyperCommGrid; its embedding groups are made by every rank, see
_embedding_groups). Upstream patches `custom_backward` with pytest-mock's
`mocker`; pytest's own `monkeypatch` does it here (the runs are forward only: it is never
called)."""
import os

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("megatron.core")

import megatron.core.pipeline_parallel.schedules as schedule  # noqa: E402
from megatron.core import ModelParallelConfig  # noqa: E402
from megatron.core.distributed.finalize_model_grads import finalize_model_grads  # noqa: E402
from megatron.core.hyper_comm_grid import HyperCommGrid  # noqa: E402
from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator  # noqa: E402
from megatron.core.pipeline_parallel.utils import is_pp_first_stage, is_pp_last_stage  # noqa: E402
from megatron.core.process_groups_config import ProcessGroupCollection  # noqa: E402
from mcore_harness import Utils  # noqa: E402

rank = Utils.rank

SEQUENCE_LENGTH, MICRO_BATCH_SIZE, HIDDEN_SIZE = 512, 8, 256


def _unit_test_model(config):
    """Upstream's stand-in model: a Linear with the attributes the schedules read."""
    model = torch.nn.Linear(4, 1)
    model.model_type = "unit-test"
    model.set_input_tensor = lambda input_tensor: None
    model.config = config
    return model


def _stage_step(data_iterator, model):
    """A forward step whose output is an activation of the pipeline's shape; its loss is the
    rank."""
    me = int(os.environ["LOCAL_RANK"])

    def loss_func(output_tensor):
        return me, {"loss_reduced": me}

    return torch.rand(SEQUENCE_LENGTH, MICRO_BATCH_SIZE, HIDDEN_SIZE).cuda(), loss_func


def _pipeline_config():
    config = ModelParallelConfig(pipeline_model_parallel_size=4, sequence_parallel=False,
                                 pipeline_dtype=torch.float)
    config.hidden_size = HIDDEN_SIZE
    return config


def test_get_forward_backward_func():
    Utils.initialize_model_parallel(tensor_model_parallel_size=2, pipeline_model_parallel_size=1)
    assert schedule.get_forward_backward_func() == schedule.forward_backward_no_pipelining
    Utils.destroy_model_parallel()
    Utils.initialize_model_parallel(tensor_model_parallel_size=2, pipeline_model_parallel_size=4)
    assert (schedule.get_forward_backward_func()
            == schedule.forward_backward_pipelining_without_interleaving)
    Utils.destroy_model_parallel()
    for pp, vpp in ((4, 2), (2, 4)):
        Utils.initialize_model_parallel(tensor_model_parallel_size=2,
                                        pipeline_model_parallel_size=pp,
                                        virtual_pipeline_model_parallel_size=vpp)
        assert (schedule.get_forward_backward_func()
                == schedule.forward_backward_pipelining_with_interleaving)
        Utils.destroy_model_parallel()


@pytest.mark.needs_device
def test_forward_backward_func_without_pipeline_parallel(monkeypatch):
    from megatron.core.pipeline_parallel import get_forward_backward_func

    Utils.initialize_model_parallel(tensor_model_parallel_size=2, pipeline_model_parallel_size=1)

    def step(data_iterator, model):
        me = int(os.environ["LOCAL_RANK"])

        def loss_func(output_tensor):
            return me, {"loss_reduced": me}

        return model(torch.ones(1, 4)), loss_func

    model = _unit_test_model(ModelParallelConfig(pipeline_model_parallel_size=1))
    forward_backward = get_forward_backward_func()
    assert schedule.get_forward_backward_func() == schedule.forward_backward_no_pipelining
    monkeypatch.setattr(schedule, "custom_backward", lambda *args, **kwargs: 2)

    losses = forward_backward(forward_step_func=step, data_iterator=range(0, 100), model=[model],
                              num_microbatches=4, seq_length=None, micro_batch_size=None,
                              forward_only=True)
    expected = [{"loss_reduced": rank}] * 4
    for got, want in zip(losses, expected):
        assert got["loss_reduced"] == want["loss_reduced"]
    Utils.destroy_model_parallel()


@pytest.mark.needs_device
def test_forward_backward_func_with_pipeline_parallel():
    from megatron.core.pipeline_parallel import get_forward_backward_func

    Utils.initialize_model_parallel(tensor_model_parallel_size=2, pipeline_model_parallel_size=4)
    model = _unit_test_model(_pipeline_config())
    forward_backward = get_forward_backward_func()
    assert (schedule.get_forward_backward_func()
            == schedule.forward_backward_pipelining_without_interleaving)

    losses = forward_backward(forward_step_func=_stage_step, data_iterator=None, model=[model],
                              num_microbatches=MICRO_BATCH_SIZE, seq_length=SEQUENCE_LENGTH,
                              micro_batch_size=MICRO_BATCH_SIZE, forward_only=True)
    # upstream zips against 4 expected entries: the last stage's losses (the others have none)
    expected = [{"loss_reduced": rank}] * 4
    for got, want in zip(losses, expected):
        assert got["loss_reduced"] == want["loss_reduced"]
    Utils.destroy_model_parallel()


def _embedding_groups(pp_group):
    """The groups of the pipeline's first stage (position embedding) and of its first and last
    stages (word embedding) for `pp_group`, as upstream's helper makes them from `pp_group`'s
    ranks. Upstream calls `dist.new_group` with this rank's pipeline only, so ranks of different
    pipelines pass different rank lists to the same new_group call; torch.distributed requires
    every rank to make every group, in the same order (cocemu checks it), so here every rank makes
    the groups of every pipeline and keeps its own."""
    mine = sorted(dist.get_process_group_ranks(pp_group))
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    pipelines = sorted({tuple(ranks) for ranks in everyone})
    pos_embd = embd = None
    for ranks in pipelines:
        first_stage = dist.new_group(ranks=[ranks[0]])
        ends = dist.new_group(ranks=[ranks[0]] + ([ranks[-1]] if ranks[-1] != ranks[0] else []))
        if list(ranks) == mine:
            pos_embd, embd = first_stage, ends
    return pos_embd, embd


@pytest.mark.needs_device
def test_forward_backward_pipelining_without_interleaving_with_custom_pgs(monkeypatch):
    Utils.initialize_model_parallel(tensor_model_parallel_size=2, pipeline_model_parallel_size=4)
    config = _pipeline_config()
    config.finalize_model_grads_func = finalize_model_grads
    model = _unit_test_model(config)
    monkeypatch.setattr(schedule, "custom_backward", lambda *args, **kwargs: 2)
    args = dict(forward_step_func=_stage_step, data_iterator=None, model=[model],
                num_microbatches=MICRO_BATCH_SIZE, seq_length=SEQUENCE_LENGTH,
                micro_batch_size=MICRO_BATCH_SIZE, forward_only=True)

    # the groups parallel_state made
    losses_default = schedule.forward_backward_pipelining_without_interleaving(**args)

    # the same layout's groups passed in explicitly
    grid = HyperCommGrid([2, 1, 4, 1], ["tp", "cp", "pp", "dp"])
    pp_group = grid.create_pg("pp")
    p2p = P2PCommunicator(pp_group=pp_group, config=config)
    pos_embd, embd = _embedding_groups(pp_group)
    groups = ProcessGroupCollection()
    groups.tp = grid.create_pg("tp")
    groups.pp = pp_group
    groups.embd = embd if (is_pp_last_stage(pp_group) or is_pp_first_stage(pp_group)) else None
    groups.pos_embd = pos_embd if is_pp_first_stage(pp_group) else None
    groups.dp_cp = grid.create_pg(["dp", "cp"])
    groups.cp = grid.create_pg("cp")
    losses_explicit = schedule.forward_backward_pipelining_without_interleaving(
        p2p_communicator=p2p, pg_collection=groups, **args)

    assert len(losses_default) == len(losses_explicit), "Output lengths should be identical"
    for i, (a, b) in enumerate(zip(losses_default, losses_explicit)):
        assert a == b, (f"Loss at index {i} should be identical between default and explicit "
                        f"PG calls")
    Utils.destroy_model_parallel()
