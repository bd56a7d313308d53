"""A rank's modeled device allocator (R-PY-13): the bytes of the live device tensors the rank
created, checked against the profile's HBM capacity.

The recording dispatch mode (cocemu.torch._mode) reports every storage an aten op creates on a
rank thread. A storage is a device storage when the op made it for the rank's device (a device
argument naming cuda/npu, `.cuda()`, `.to("cuda")`, a meta tensor of a dry run) or from device
tensors; it counts from its creation until it dies (its last tensor is freed). No caching
allocator is modeled: reserved = allocated. A device allocation that brings the rank over the
profile's `memory_capacity` is an error naming the tensor and the totals (a dry run at production
shapes finds out-of-memory without the memory).
"""
import threading
import weakref

from ._state import error


def _fmt(nbytes):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:.2f} {unit}"
    return f"{nbytes} B"


class Allocator:
    """One rank's live device storages: storage id -> (bytes, weakref, description)."""

    def __init__(self, st):
        self.st = st
        self.capacity = int(st.profile.memory_capacity or 0)  # 0: not given, not checked
        self.live = {}
        self.allocated = 0
        self.peak = 0      # since the last torch.cuda.reset_peak_memory_stats()
        self.run_peak = 0  # of the whole run
        self.lock = threading.RLock()  # a storage may die on another thread (weakref callback)

    def is_device(self, t):
        """Whether tensor `t` is one of the rank's device tensors."""
        if t.is_meta:
            return True
        try:
            return t.untyped_storage()._cdata in self.live
        except (RuntimeError, NotImplementedError):  # sparse, nested
            return False

    def add(self, storage, key, t, op_name):
        """A new device storage (of tensor `t`, made by aten op `op_name`)."""
        nbytes = storage.nbytes()
        ref = weakref.ref(storage, lambda _r, key=key: self._free(key))
        desc = (op_name, tuple(t.shape), t.dtype)
        with self.lock:
            self.live[key] = (nbytes, ref, desc)
            self.allocated += nbytes
            if self.allocated > self.peak:
                self.peak = self.allocated
                if self.allocated > self.run_peak:
                    self.run_peak = self.allocated
            over = self.capacity and self.allocated > self.capacity
        if over:
            self._over(key, nbytes, desc)

    def _free(self, key):
        with self.lock:
            e = self.live.pop(key, None)
            if e is not None:
                self.allocated -= e[0]

    def _over(self, key, nbytes, desc):
        st = self.st
        op, shape, dtype = desc
        with self.lock:
            others = sorted((e for k, e in self.live.items() if k != key),
                            key=lambda e: -e[0])[:3]
        biggest = "; ".join(f"{list(d[1])} {str(d[2]).replace('torch.', '')} from aten.{d[0]} "
                            f"({_fmt(n)})" for n, _, d in others)
        raise error(
            f"rank {st.id}: out of modeled device memory: aten.{op} allocates a {list(shape)} "
            f"{str(dtype).replace('torch.', '')} tensor ({nbytes} bytes, {_fmt(nbytes)}), which "
            f"brings the rank's live device tensors to {self.allocated} bytes "
            f"({_fmt(self.allocated)}), over the {_fmt(self.capacity)} ({self.capacity} bytes) "
            f"of HBM of profile {st.profile.name}; the largest other live tensors: "
            f"{biggest or 'none'}", code="resource_exhausted")


def of(st):
    """The rank's Allocator (made on first use)."""
    a = getattr(st, "cocemu_memory", None)
    if a is None:
        a = st.cocemu_memory = Allocator(st)
    return a


def peak(st):
    """The most bytes of device tensors the rank held at once during the run (RunResult's
    per-rank peak)."""
    a = getattr(st, "cocemu_memory", None)
    return 0 if a is None else a.run_peak


# torch.cuda / torch.npu memory API on a rank thread --------------------------------------------

def _alloc(call, device):
    from . import _rng, _state
    st = _state.require(call)
    _rng.device_index(_rng.of(st), device, call)
    return of(st)


def memory_allocated(device=None):
    return _alloc("torch.cuda.memory_allocated", device).allocated


def max_memory_allocated(device=None):
    return _alloc("torch.cuda.max_memory_allocated", device).peak


def reset_peak_memory_stats(device=None):
    a = _alloc("torch.cuda.reset_peak_memory_stats", device)
    a.peak = a.allocated


def mem_get_info(device=None):
    a = _alloc("torch.cuda.mem_get_info", device)
    if not a.capacity:
        raise error(f"rank {a.st.id}: torch.cuda.mem_get_info: profile {a.st.profile.name} gives "
                    f"no memory_capacity", code="failed_precondition")
    return max(a.capacity - a.allocated, 0), a.capacity


def memory_stats(device=None):
    a = _alloc("torch.cuda.memory_stats", device)
    return {"allocated_bytes.all.current": a.allocated, "allocated_bytes.all.peak": a.peak,
            "reserved_bytes.all.current": a.allocated, "reserved_bytes.all.peak": a.peak}


def empty_cache():
    pass


API = dict(memory_allocated=memory_allocated, max_memory_allocated=max_memory_allocated,
           memory_reserved=memory_allocated, max_memory_reserved=max_memory_allocated,
           reset_peak_memory_stats=reset_peak_memory_stats, mem_get_info=mem_get_info,
           memory_stats=memory_stats, empty_cache=empty_cache)
