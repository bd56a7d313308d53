"""Per-rank random state (R-PY-14): a rank seeding s draws what one process seeding s draws,
whatever the thread schedule; host draws use the rank's CPU generator, device draws the rank's
device generator; the torch, torch.random and torch.cuda/torch.npu RNG API act on them."""
import random
import time

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import cocemu  # noqa: E402
import cocemu.torch as ct  # noqa: E402


def draws(pause):
    """A mix of random ops on host tensors; `pause()` lets the other ranks run in between."""
    out = [torch.rand(3)]
    pause()
    out.append(torch.randn(2, 3))
    out.append(torch.randint(0, 100, (5,)).double())
    pause()
    out.append(torch.randperm(7).double())
    x = torch.ones(4, 5)
    out.append(F.dropout(x, 0.5))
    pause()
    out.append(torch.bernoulli(torch.full((6,), 0.3)))
    out.append(torch.empty(4).normal_(1.0, 2.0))
    out.append(torch.empty(4).uniform_(-1, 1))
    pause()
    lin = torch.nn.Linear(3, 2)  # kaiming_uniform_ and uniform_ initialisation
    out += [lin.weight.detach().clone(), lin.bias.detach().clone()]
    out.append(torch.multinomial(torch.tensor([0.1, 0.5, 0.4]), 4, replacement=True).double())
    return out


def test_each_rank_draws_what_one_process_seeding_its_seed_draws():
    n = 8

    def fn():
        r = dist.get_rank()
        rng = random.Random(r)

        def pause():
            time.sleep(rng.random() * 0.003)
            dist.barrier()
        torch.manual_seed(1234 + r)
        pause()
        return draws(pause)
    got = ct.run(fn, world_size=n).returns
    for r in range(n):
        torch.manual_seed(1234 + r)
        expected = draws(lambda: None)
        assert len(got[r]) == len(expected)
        for a, b in zip(got[r], expected):
            assert torch.equal(a, b), (r, a, b)
    assert not torch.equal(got[0][0], got[1][0])


def test_same_seed_on_every_rank_gives_the_same_dropout_masks():
    def fn():
        torch.manual_seed(7)
        time.sleep(0.002 * dist.get_rank())
        x = torch.ones(64, 64, device="cuda")
        host = F.dropout(torch.ones(64, 64), 0.5)
        dev = F.dropout(x, 0.5)
        return host, dev
    out = ct.run(fn, world_size=4).returns
    for host, dev in out[1:]:
        assert torch.equal(host, out[0][0]) and torch.equal(dev, out[0][1])
    assert not torch.equal(out[0][0], torch.ones(64, 64) * 2)  # a real mask


def test_device_draws_use_the_device_generator_and_host_draws_the_cpu_one():
    def fn():
        torch.manual_seed(0)
        torch.cuda.manual_seed(99)        # the device generator only
        host = torch.rand(4)
        dev = torch.rand(4, device="cuda")
        moved = torch.ones(4).cuda()
        mask = torch.bernoulli(moved * 0.5)  # an op on a device tensor: the device generator
        return host, dev, mask, torch.cuda.initial_seed(), torch.initial_seed()
    host, dev, mask, cuda_seed, cpu_seed = ct.run(fn, world_size=2).returns[1]
    g = torch.Generator().manual_seed(0)
    assert torch.equal(host, torch.rand(4, generator=g))
    g = torch.Generator().manual_seed(99)
    assert torch.equal(dev, torch.rand(4, generator=g))
    assert torch.equal(mask, torch.bernoulli(torch.full((4,), 0.5), generator=g))
    assert (cuda_seed, cpu_seed) == (99, 0)


def test_rng_state_round_trips_and_fork_rng():
    def fn():
        torch.manual_seed(dist.get_rank())
        cpu, dev = torch.get_rng_state(), torch.cuda.get_rng_state()
        a = torch.rand(3), torch.rand(3, device="cuda")
        torch.set_rng_state(cpu)
        torch.cuda.set_rng_state(dev)
        b = torch.rand(3), torch.rand(3, device="cuda")
        with torch.random.fork_rng(devices=[torch.cuda.current_device()]):
            torch.rand(5), torch.rand(5, device="cuda")
        c = torch.rand(3), torch.rand(3, device="cuda")
        torch.set_rng_state(cpu)
        torch.cuda.set_rng_state_all([dev] * torch.cuda.device_count())
        d = torch.rand(3), torch.rand(3, device="cuda"), torch.rand(3)
        return a, b, c, d
    for r, (a, b, c, d) in enumerate(ct.run(fn, world_size=4).returns):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        assert torch.equal(d[0], a[0]) and torch.equal(d[1], a[1])
        g = torch.Generator().manual_seed(r)
        first, second = torch.rand(3, generator=g), torch.rand(3, generator=g)
        assert torch.equal(a[0], first) and torch.equal(c[0], second)  # fork_rng restored
        assert torch.equal(d[2], second)


def test_default_generators_are_the_ranks_device_generators():
    def fn():
        idx = torch.cuda.current_device()
        gens = torch.cuda.default_generators
        assert len(gens) == torch.cuda.device_count()
        gens[idx].manual_seed(5)
        x = torch.rand(3, device="cuda")
        with pytest.raises(IndexError, match="4 devices"):
            gens[4]
        return x, gens[idx].initial_seed()
    for x, seed in ct.run(fn, world_size=4).returns:
        assert seed == 5
        assert torch.equal(x, torch.rand(3, generator=torch.Generator().manual_seed(5)))


def test_megatron_style_cuda_rng_tracker():
    """The calls Megatron-core's CudaRNGStatesTracker (megatron/core/tensor_parallel/random.py)
    makes: get/set the current device's state through torch.cuda.get_rng_state,
    torch.cuda.manual_seed, and default_generators[current_device()].set_state run through
    torch.cuda._lazy_call; dropout inside the fork draws from the tracked state."""
    def set_state(state):
        def cb():
            idx = torch.device("cuda").index
            if idx is None:
                idx = torch.cuda.current_device()
            torch.cuda.default_generators[idx].set_state(state)
        torch.cuda._lazy_call(cb)

    def fn():
        r = dist.get_rank()
        torch.cuda.manual_seed(100)                  # data-parallel seed: the same on all ranks
        orig = torch.cuda.get_rng_state()
        torch.cuda.manual_seed(2718 + r)             # tensor-parallel seed: one per rank
        tracked = torch.cuda.get_rng_state()
        set_state(orig)
        x = torch.ones(32, device="cuda")
        outside = F.dropout(x, 0.5)                  # the default (data-parallel) state
        saved = torch.cuda.get_rng_state()
        set_state(tracked)
        inside = F.dropout(x, 0.5)                   # the tracked state
        set_state(saved)
        return outside, inside
    out = ct.run(fn, world_size=4).returns
    for r, (outside, inside) in enumerate(out):
        assert torch.equal(outside, out[0][0])
        with torch.random.fork_rng(devices=[]):  # this process's own generator
            torch.manual_seed(2718 + r)
            assert torch.equal(inside, F.dropout(torch.ones(32), 0.5))
    assert not torch.equal(out[0][1], out[1][1])


def test_rng_calls_off_rank_threads_are_torchs_own():
    ct.install_device_shim()
    torch.manual_seed(3)
    a = torch.rand(2)
    torch.manual_seed(3)
    assert torch.equal(a, torch.rand(2)) and torch.initial_seed() == 3
    assert len(torch.cuda.default_generators) == 0


def test_bad_device_in_rng_call_is_an_error():
    def fn():
        torch.cuda.get_rng_state("cuda:9")
    with pytest.raises(cocemu.Error, match=r"torch.cuda.get_rng_state: device index 9 out of "
                                           r"range"):
        ct.run(fn, world_size=2)


def test_graph_safe_states_are_shared_not_copied():
    """torch's graph-safe generator API on a rank's device (Megatron's cudagraphable RNG
    tracker): graphsafe_get_state gives the device's generator itself, graphsafe_set_state makes
    the device draw from (and advance) the given state, clone_state copies."""
    def fn():
        rank = dist.get_rank()
        torch.cuda.manual_seed(100 + rank)
        default = torch.cuda.default_generators[torch.cuda.current_device()]
        assert default.graphsafe_get_state() is default
        other = default.clone_state()
        other.manual_seed(7)
        copy = other.clone_state()                      # a copy: stays at seed 7's start
        default.graphsafe_set_state(other)              # the device now draws from `other`
        a = torch.randn(4, device="cuda")
        assert torch.cuda.default_generators[torch.cuda.current_device()] is other
        assert not torch.equal(other.get_state(), copy.get_state())  # `other` advanced
        expected = torch.randn(4, generator=copy)       # seed 7's first draw, on the CPU
        assert torch.equal(a.cpu(), expected)
        with pytest.raises(cocemu.Error, match="is not a device generator state"):
            other.graphsafe_set_state(torch.Generator())
        with pytest.raises(cocemu.Error, match="does not capture CUDA graphs"):
            torch.cuda.CUDAGraph.register_generator_state(None, other)
        return a.tolist()
    r = ct.run(fn, world_size=2)
    assert r.returns[0] == r.returns[1]  # both ranks drew seed 7's numbers, whatever their seed
