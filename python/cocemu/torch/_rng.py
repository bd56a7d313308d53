"""Per-rank random state (R-PY-14): each rank thread has its own CPU generator and one generator
per device of its node, so a rank seeding s draws what one process seeding s draws, whatever the
thread schedule.

Which generator an aten op draws from follows "code that runs on a GPU process draws what it
would there": a random op whose tensors are the rank's device tensors (made with a device argument
naming cuda/npu, `.cuda()`, `.npu()`, `.to("cuda")`, or computed from such tensors; every meta
tensor of a dry run) draws from the generator of the rank's device (its local rank); any other
random op (`torch.rand(3)`, dropout on a tensor made without a device) draws from the rank's CPU
generator. An explicit `generator=` is used as given. The recording dispatch mode
(cocemu.torch._mode) applies the rule; the Python-level RNG API of torch, torch.random, torch.cuda
and torch.npu is replaced by functions that act on the calling rank's generators on rank threads
and call torch's own anywhere else.

The device generators are CPU (mt19937) generators: the numbers a device tensor draws are the ones
the CPU generator would draw from the same seed, not the GPU's Philox stream; their states are
what `torch.Generator().get_state()` returns. A rank that never seeds starts from a fresh
`torch.Generator()` (seed 67280421310721), deterministically.
"""
import collections.abc
import threading

import torch

from . import _state
from ._state import error

_swap_lock = threading.Lock()  # guards torch.default_generator while an op borrows it
_ACCEL = ("cuda", "npu")


class DeviceGenerator(torch.Generator):
    """A rank's device generator: a CPU generator with the CUDA generator's graph-safe state API
    that Megatron's `CudaRNGStatesTracker(use_cudagraphable_rng=True)` uses. A device draws from
    the generator in its slot (`torch.cuda.default_generators[i]`): `graphsafe_get_state()` gives
    that generator itself (its state shared, not copied), `graphsafe_set_state(g)` puts `g` in
    the slot (the device then draws from g's state, advancing it), `clone_state()` gives a copy
    outside any slot."""

    _slot = None  # (RankRng, device index) while this generator is a device's default

    def graphsafe_get_state(self):
        self._require_slot("graphsafe_get_state")
        return self

    def graphsafe_set_state(self, state):
        rng, index = self._require_slot("graphsafe_set_state")
        if not isinstance(state, DeviceGenerator):
            raise error(f"rank {rng.st.id}: Generator.graphsafe_set_state: state = {state!r} "
                        f"({type(state).__name__}) is not a device generator state; allowed "
                        f"what graphsafe_get_state() or clone_state() of a device generator "
                        f"gives")
        self._slot = None
        state._slot = (rng, index)
        rng.devices[index] = state

    def clone_state(self):
        g = DeviceGenerator()
        g.set_state(self.get_state())
        return g

    def _require_slot(self, call):
        if self._slot is None:
            raise error(f"Generator.{call}: this generator is not a device's default generator "
                        f"(torch.cuda.default_generators[i]); cocemu.torch shares graph-safe "
                        f"states through the device's default generator only")
        return self._slot


class RankRng:
    """A rank's generators: `cpu`, and one per device of its node (made on first use)."""

    def __init__(self, st, device_count, local_rank):
        self.st = st
        self.cpu = torch.Generator()
        self.count = device_count
        self.local = local_rank
        self.devices = [None] * device_count

    def device(self, index=None):
        i = self.local if index is None else index
        g = self.devices[i]
        if g is None:
            g = self.devices[i] = DeviceGenerator()
            g._slot = (self, i)
        return g


def of(st):
    """The rank's RankRng (made on first use)."""
    r = getattr(st, "cocemu_rng", None)
    if r is None:
        from . import _device
        r = st.cocemu_rng = RankRng(st, _device.device_count_of(st), _device.local_rank_of(st))
    return r


def _rank_rng(call):
    return of(_state.require(call))


def device_index(r, device, call):
    """The device index `device` names ("cuda", "cuda:N", "npu:N", N, torch.device), checked
    against the rank's node."""
    if device is None or device == -1:
        return r.local
    if isinstance(device, bool):
        raise error(f"rank {r.st.id}: {call}: device = {device!r} is not a device")
    if isinstance(device, int):
        index = device
    else:
        kind, index = _parse(device, call, r.st)
        if kind not in _ACCEL:
            raise error(f"rank {r.st.id}: {call}: device {device!r} is not a cuda/npu device "
                        f"(the rank is cuda:{r.local})")
        if index is None:
            return r.local
    if not 0 <= index < r.count:
        raise error(f"rank {r.st.id}: {call}: device index {index} out of range: the rank's node "
                    f"has {r.count} devices (0..{r.count - 1}); the rank is device {r.local}")
    return index


def _parse(device, call, st):
    if isinstance(device, torch.device):
        return device.type, device.index
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        if not index:
            return kind, None
        try:
            return kind, int(index)
        except ValueError:
            raise error(f"rank {st.id}: {call}: cannot read the device {device!r} (expected "
                        f"'cuda', 'cuda:N', 'npu' or 'npu:N')") from None
    raise error(f"rank {st.id}: {call}: device = {device!r} ({type(device).__name__}) is not a "
                f"device (expected an int, a string such as 'cuda:0', or a torch.device)")


def call_with(func, args, kwargs, gen, takes_generator):
    """Runs a random aten op drawing from `gen`: as its `generator` argument when its schema has
    one, else from torch.default_generator holding gen's state for the call (under a lock, so
    no other rank draws from it meanwhile)."""
    if takes_generator:
        kwargs = dict(kwargs)
        kwargs["generator"] = gen
        return func(*args, **kwargs)
    d = torch.default_generator
    with _swap_lock:
        saved = d.get_state()
        d.set_state(gen.get_state())
        try:
            return func(*args, **kwargs)
        finally:
            gen.set_state(d.get_state())
            d.set_state(saved)


# torch / torch.random: the CPU generator (and manual_seed seeds the devices as well) ----------

def manual_seed(seed):
    r = _rank_rng("torch.manual_seed")
    seed = int(seed)
    for i in range(r.count):
        r.device(i).manual_seed(seed)
    return r.cpu.manual_seed(seed)


def seed():
    r = _rank_rng("torch.seed")
    s = r.cpu.seed()
    for i in range(r.count):
        r.device(i).manual_seed(s)
    return s


def initial_seed():
    return _rank_rng("torch.initial_seed").cpu.initial_seed()


def get_rng_state():
    return _rank_rng("torch.get_rng_state").cpu.get_state()


def set_rng_state(new_state):
    _rank_rng("torch.set_rng_state").cpu.set_state(new_state)


TORCH_API = dict(manual_seed=manual_seed, seed=seed, initial_seed=initial_seed,
                 get_rng_state=get_rng_state, set_rng_state=set_rng_state)


# torch.cuda / torch.npu: the device generators -------------------------------------------------

def cuda_get_rng_state(device="cuda"):
    r = _rank_rng("torch.cuda.get_rng_state")
    return r.device(device_index(r, device, "torch.cuda.get_rng_state")).get_state()


def cuda_get_rng_state_all():
    r = _rank_rng("torch.cuda.get_rng_state_all")
    return [r.device(i).get_state() for i in range(r.count)]


def cuda_set_rng_state(new_state, device="cuda"):
    r = _rank_rng("torch.cuda.set_rng_state")
    r.device(device_index(r, device, "torch.cuda.set_rng_state")).set_state(new_state)


def cuda_set_rng_state_all(new_states):
    r = _rank_rng("torch.cuda.set_rng_state_all")
    states = list(new_states)
    if len(states) != r.count:
        raise error(f"rank {r.st.id}: torch.cuda.set_rng_state_all: {len(states)} states given, "
                    f"the rank's node has {r.count} devices")
    for i, s in enumerate(states):
        r.device(i).set_state(s)


def cuda_manual_seed(seed):
    _rank_rng("torch.cuda.manual_seed").device().manual_seed(int(seed))


def cuda_manual_seed_all(seed):
    r = _rank_rng("torch.cuda.manual_seed_all")
    for i in range(r.count):
        r.device(i).manual_seed(int(seed))


def cuda_seed():
    _rank_rng("torch.cuda.seed").device().seed()


def cuda_seed_all():
    r = _rank_rng("torch.cuda.seed_all")
    s = r.device().seed()
    for i in range(r.count):
        r.device(i).manual_seed(s)


def cuda_initial_seed():
    return _rank_rng("torch.cuda.initial_seed").device().initial_seed()


CUDA_API = dict(get_rng_state=cuda_get_rng_state, get_rng_state_all=cuda_get_rng_state_all,
                set_rng_state=cuda_set_rng_state, set_rng_state_all=cuda_set_rng_state_all,
                manual_seed=cuda_manual_seed, manual_seed_all=cuda_manual_seed_all,
                seed=cuda_seed, seed_all=cuda_seed_all, initial_seed=cuda_initial_seed)


class DefaultGenerators(collections.abc.Sequence):
    """torch.cuda.default_generators: on a rank thread, the rank's device generators (Megatron's
    CudaRNGStatesTracker sets `default_generators[current_device()]`); elsewhere torch's."""

    def __init__(self, original):
        self.original = original

    def __getitem__(self, i):
        st = _state.current()
        if st is None:
            return self.original[i]
        r = of(st)
        if isinstance(i, slice):
            return tuple(r.device(j) for j in range(r.count)[i])
        if isinstance(i, bool) or not isinstance(i, int) or not -r.count <= i < r.count:
            raise IndexError(f"rank {st.id}: torch.cuda.default_generators[{i!r}]: the rank's "
                             f"node has {r.count} devices (0..{r.count - 1})")
        return r.device(i % r.count)

    def __len__(self):
        st = _state.current()
        return len(self.original) if st is None else of(st).count


def _on_ranks(impl, original, name):
    def function(*args, **kwargs):
        if _state.current() is None:
            return original(*args, **kwargs)
        return impl(*args, **kwargs)
    function.__name__ = name
    function.__wrapped__ = original
    return function


_installed = False


def install(npu):
    """Replaces the RNG functions of torch, torch.random, torch.cuda, torch.cuda.random and the
    npu shim `npu` (once); off rank threads they call torch's own."""
    global _installed
    if _installed:
        return
    import torch.cuda.random as cuda_random
    import torch.random as torch_random
    for name, impl in TORCH_API.items():
        original = getattr(torch_random, name)
        f = _on_ranks(impl, original, name)
        setattr(torch_random, name, f)
        setattr(torch, name, f)
    for name, impl in CUDA_API.items():
        original = getattr(cuda_random, name)
        f = _on_ranks(impl, original, name)
        setattr(cuda_random, name, f)
        setattr(torch.cuda, name, f)
        setattr(npu, name, impl)
    gens = DefaultGenerators(torch.cuda.default_generators)
    torch.cuda.default_generators = gens
    npu.default_generators = gens
    # torch.cuda._lazy_call runs a seeding callback at once when is_initialized(), else queues
    # it for a CUDA initialisation that never comes (Megatron's _set_cuda_rng_state uses it).
    original_init = torch.cuda.is_initialized
    torch.cuda.is_initialized = _on_ranks(lambda: True, original_init, "is_initialized")
    original_lazy = torch.cuda._lazy_init
    torch.cuda._lazy_init = _on_ranks(lambda: None, original_lazy, "_lazy_init")
    # Graph-safe RNG states need torch's CUDA graph API to name them; a CPU build has the class
    # without the method. Registering a state with a graph: cocemu.torch captures no graphs.
    if not hasattr(torch.cuda.CUDAGraph, "register_generator_state"):
        torch.cuda.CUDAGraph.register_generator_state = _register_generator_state
    _installed = True


def _register_generator_state(graph, generator):
    raise error("torch.cuda.CUDAGraph.register_generator_state: cocemu.torch does not capture "
                "CUDA graphs (graph-safe RNG states work without one: graphsafe_get_state, "
                "graphsafe_set_state, clone_state)", code="unimplemented")
