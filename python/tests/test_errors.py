"""Bad input: each a clear cocemu.Error (or the rank's own Python exception), never a hang, a
crash of the interpreter or a silent copy."""
import numpy as np
import pytest

import cocemu


def fails(n, body, match, code="invalid_argument", **kw):
    with pytest.raises(cocemu.Error, match=match) as info:
        cocemu.run(n, body, **kw)
    assert info.value.code == code
    assert isinstance(info.value, RuntimeError)
    return info.value


def test_wrong_dtype_is_refused_not_copied():
    def body(rank):
        cocemu.all_reduce(rank.world, np.zeros(4, np.complex64))
    e = fails(2, body, r"all_reduce tensor: array of dtype complex64 is not one cocemu has")
    assert e.rank in (0, 1)
    assert "allowed: float32" in str(e)


def test_non_contiguous_and_read_only_arrays():
    def strided(rank):
        cocemu.all_reduce(rank.world, np.zeros((4, 4), np.float32)[:, 1])
    fails(2, strided, r"all_reduce tensor: array of shape \(4\) is not C-contiguous")

    def transposed(rank):
        cocemu.all_gather(rank.world, np.zeros((4, 3), np.float32), np.zeros((3, 2), np.float32).T)
    fails(2, transposed, "all_gather input: .*not C-contiguous")

    def read_only(rank):
        a = np.zeros(4, np.float32)
        a.flags.writeable = False
        cocemu.all_reduce(rank.world, a)
    fails(2, read_only, "all_reduce tensor: array is read-only")

    def too_many_dims(rank):
        cocemu.all_reduce(rank.world, np.zeros((1, 1, 1, 1, 2), np.float32))
    fails(1, too_many_dims, "has 5 dimensions; cocemu tensors have at most 4")

    def swapped(rank):
        cocemu.all_reduce(rank.world, np.zeros(4, ">f4"))
    fails(1, swapped, "not in native byte order")

    def not_an_array(rank):
        cocemu.all_reduce(rank.world, [1.0, 2.0])
    fails(1, not_an_array, "expected a NumPy array or a cocemu.Tensor, got list")


def test_wrong_shapes():
    def body(rank):
        cocemu.all_gather(rank.world, np.zeros(5, np.float32), np.zeros(2, np.float32))
    fails(2, body, "all_gather")

    def dtypes(rank):
        cocemu.all_reduce(rank.world, np.zeros(4, np.float32), np.zeros(4, np.float64))
    fails(2, dtypes, "all_reduce")


def test_ranks_calling_different_collectives():
    def body(rank):
        x = np.zeros(8, np.float32)
        if rank.id == 0:
            cocemu.all_reduce(rank.world, x)
        else:
            cocemu.broadcast(rank.world, x, 0)
        rank.synchronize()
    e = fails(2, body, "all_reduce|broadcast", code="mismatch", timeout_s=20)
    assert "broadcast" in str(e) and "all_reduce" in str(e)


def test_a_rank_that_never_joins_times_out():
    def body(rank):
        if rank.id == 0:
            cocemu.all_reduce(rank.world, np.zeros(4, np.float32))
        rank.synchronize()
    e = fails(2, body, "all_reduce", code="timeout", timeout_s=0.5)
    assert "rank 1" in str(e)


class Boom(ValueError):
    pass


def test_rank_exception_is_reraised_with_its_type_and_rank():
    def body(rank):
        if rank.id == 3:
            raise Boom("rank three gives up")
        cocemu.barrier(rank.world)  # the others are unwound from their wait
    with pytest.raises(Boom, match="rank three gives up") as info:
        cocemu.run(4, body, timeout_s=30)
    assert info.value.rank == 3
    assert "cocemu rank 3" in "".join(getattr(info.value, "__notes__", []))
    assert any(f.name == "body" for f in __import__("traceback").extract_tb(info.value.__traceback__))


def test_stream_callback_exception_is_reraised():
    def body(rank):
        if rank.id == 1:
            rank.compute_stream.launch("bad op", lambda: {}["missing"], work_ns=10)
        rank.synchronize()
    with pytest.raises(KeyError) as info:
        cocemu.run(2, body, timeout_s=30)
    assert info.value.rank == 1


def test_n_ranks_out_of_range():
    fails(0, lambda rank: None, r"n_ranks = 0 is out of range; allowed 1\.\.256")
    fails(257, lambda rank: None, r"n_ranks = 257 is out of range")
    fails(-3, lambda rank: None, r"n_ranks = -3 is out of range")


def test_unknown_profile():
    with pytest.raises(cocemu.Error, match="no-such-device") as info:
        cocemu.run(2, lambda rank: None, profile="no-such-device")
    assert info.value.code == "invalid_argument"
    with pytest.raises(cocemu.Error, match="profile must be a name"):
        cocemu.run(2, lambda rank: None, profile=3)


def test_bad_options():
    fails(1, lambda rank: cocemu.all_reduce(rank.world, np.zeros(2, np.float32), op="median"),
          "reduce op 'median' is unknown")
    fails(1, lambda rank: cocemu.all_reduce(rank.world, np.zeros(2, np.float32), algo="star"),
          "star")
    fails(1, lambda rank: rank.compute_stream.launch("x", work_ns=-1), "work_ns = -1")
    fails(1, lambda rank: rank.compute_stream.launch("x", 42), "fn must be callable")
    fails(1, lambda rank: rank.zeros((2, 2), "complex"), "unknown dtype 'complex'")
    fails(1, lambda rank: rank.zeros((2, -1)), "must be >= 0")
    with pytest.raises(cocemu.Error, match="timeout_s"):
        cocemu.run(1, lambda rank: None, timeout_s=0)


def test_handles_after_the_run_and_on_other_threads():
    kept = {}

    def body(rank):
        kept[rank.id] = (rank, rank.compute_stream, rank.world)
    cocemu.run(2, body)
    rank, stream, world = kept[0]
    for call in (lambda: rank.id, lambda: stream.launch("late", work_ns=1),
                 lambda: cocemu.all_reduce(world, np.zeros(1, np.float32)),
                 lambda: rank.synchronize()):
        with pytest.raises(cocemu.Error, match="has ended"):
            call()

    shared = {}

    def cross(rank):
        shared[rank.id] = rank.compute_stream
        cocemu.barrier(rank.world)
        if rank.id == 1:
            shared[0].launch("not mine", work_ns=1)
    fails(2, cross, "host-side call made from rank 1", timeout_s=20)

    def from_stream_op(rank):
        rank.compute_stream.launch("nested", lambda: rank.compute_stream.launch("x"), work_ns=1)
        rank.synchronize()
    fails(1, from_stream_op, "stream op")


def test_symmetric_misuse():
    def body(rank):
        buf = cocemu.SymmetricBuffer.allocate(rank, [0, 1], 16, n_flags=1)
        buf.put(1, 8, np.zeros(4, np.float32))  # 16 bytes at offset 8 of 16
    fails(2, body, "put")
