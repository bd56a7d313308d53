"""Bad input: each a clear cocemu.Error (or the rank's own Python exception), never a hang, a
crash of the interpreter or a silent copy."""
import re

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


@pytest.mark.parametrize("value,match", [
    (1e10, r"timeout_s = 10000000000\.0 is out of range; allowed a number of seconds in \(0, 86400\]"),
    (1e17, r"timeout_s = 1e\+17 is out of range"),
    (1e300, r"timeout_s = 1e\+300 is out of range"),
    (10**400, r"timeout_s = 1000.* is out of range"),
    (float("nan"), r"timeout_s = nan is out of range"),
    (float("inf"), r"timeout_s = inf is out of range"),
    (-1, r"timeout_s = -1 is out of range"),
    (0, r"timeout_s = 0 is out of range"),
    ("abc", r"timeout_s = 'abc' \(str\) is not a number of seconds"),
    (True, r"timeout_s = True \(bool\) is not a number of seconds"),
])
def test_timeout_out_of_range_is_refused(value, match):
    # 1e10 s used to overflow the deadline (the wait fired at once: "no progress for
    # 15000000000100 ms"), 1e17 and more wrapped it to 1 ms.
    fails(1, lambda rank: None, match, timeout_s=value)


def test_a_day_of_timeout_waits_for_a_late_rank():
    # The largest timeout allowed: a rank 0.3 s late is waited for, not reported at once.
    import time

    def body(rank):
        if rank.id == 3:
            time.sleep(0.3)
        x = np.full(4, rank.id + 1, np.float32)
        cocemu.all_reduce(rank.world, x)
        rank.synchronize()
        return float(x[0])

    assert cocemu.run(4, body, timeout_s=86400).returns == [10.0] * 4


@pytest.mark.parametrize("kw,match", [
    (dict(schedule_seed=-1), r"schedule_seed = -1 is out of range; allowed 0\.\.9223372036854775807"),
    (dict(schedule_seed=2**64), r"schedule_seed = 18446744073709551616 is out of range"),
    (dict(schedule_seed=True), r"schedule_seed = True \(bool\) is not an integer"),
    (dict(schedule_seed="7"), r"schedule_seed = '7' \(str\) is not an integer"),
    (dict(dry_run="False"), r"dry_run = 'False' \(str\) is not a bool; allowed True or False"),
    (dict(dry_run=0), r"dry_run = 0 \(int\) is not a bool"),
    (dict(deterministic="yes"), r"deterministic = 'yes' \(str\) is not a bool"),
    (dict(record_wall_times=None), r"record_wall_times = None \(NoneType\) is not a bool"),
])
def test_run_arguments_are_checked_strictly(kw, match):
    fails(1, lambda rank: None, match, **kw)


def test_world_size_and_function_are_checked_strictly():
    fails(True, lambda rank: None, r"n_ranks = True \(bool\) is not an integer; allowed 1\.\.256")
    fails(2.0, lambda rank: None, r"n_ranks = 2\.0 \(float\) is not an integer")
    fails("2", lambda rank: None, r"n_ranks = '2' \(str\) is not an integer")
    fails(10**30, lambda rank: None, r"n_ranks = 10{30} is out of range; allowed 1\.\.256")
    fails(2, 42, r"fn = 42 \(int\) is not callable")
    # NumPy integers and bools are what they say.
    assert cocemu.run(np.int64(2), lambda rank: rank.id, dry_run=np.bool_(True)).returns == [0, 1]


def test_a_huge_tensor_is_refused_with_its_size():
    e = fails(1, lambda rank: rank.zeros((10**12,), "f32"),
              r"a tensor of shape .*1000000000000.* f32 needs 3725\.3 GiB \(4000000000000 bytes\); "
              r"this process may use .* more", code="too_large")
    assert "dry run" in str(e)


def _interrupted_run(body, n=2, after_s=0.5):
    """Runs `body` on n ranks and sends this process SIGINT `after_s` into the run; returns the
    KeyboardInterrupt and the seconds from the signal to its arrival."""
    import os
    import signal
    import threading
    import time

    sent = []

    def interrupt():
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Timer(after_s, interrupt)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            cocemu.run(n, body, timeout_s=60)
        return info.value, time.monotonic() - sent[0]
    finally:
        timer.cancel()


def test_ctrl_c_stops_a_deadlocked_run_and_says_where_each_rank_was():
    def body(rank):
        if rank.id == 0:  # a recv nobody sends: without the interrupt, 60 s to the timeout
            cocemu.recv(rank.world, np.zeros(4, np.float32), 1)
        else:
            rank.synchronize()

    e, took = _interrupted_run(body)
    assert took < 2.0, f"KeyboardInterrupt {took:.2f} s after SIGINT"
    note = "\n".join(getattr(e, "__notes__", []))
    assert "run interrupted by Python's KeyboardInterrupt" in note
    assert "rank 0: [host] running; [comm] recv" in note and "rank 1:" in note
    assert "still running" not in note  # every rank unwound


def test_ctrl_c_during_a_sleep_names_the_ranks_left_running():
    import time

    def body(rank):
        time.sleep(3 if rank.id == 1 else 0)  # cannot be interrupted from outside
        rank.synchronize()

    e, took = _interrupted_run(body)
    assert took < 2.0, f"KeyboardInterrupt {took:.2f} s after SIGINT"
    note = "\n".join(getattr(e, "__notes__", []))
    assert "rank 1 still running its own host code" in note
    assert "rank 0:" in note and "rank 1: [host] running" in note
    time.sleep(3)  # let rank 1 return (its later cocemu calls fail quietly)


def test_ctrl_c_stops_ranks_running_python():
    def body(rank):
        while True:  # a busy loop gets KeyboardInterrupt on its thread
            pass

    e, took = _interrupted_run(body, n=3)
    assert took < 2.0, f"KeyboardInterrupt {took:.2f} s after SIGINT"
    assert "still running" not in "\n".join(getattr(e, "__notes__", []))
    # The next run is unaffected.
    assert cocemu.run(2, lambda rank: rank.id).returns == [0, 1]


@pytest.mark.parametrize("sig,status", [("SIGINT", 130), ("SIGTERM", 143)])
def test_the_cli_stops_on_a_signal_and_says_where_each_rank_was(sig, status):
    import os
    import signal
    import subprocess
    import time

    from conftest import build_dir

    cli = os.path.join(build_dir(), "cli", "cocemu")
    # About 8 s of 4 KiB all_reduce calls on 8 ranks.
    p = subprocess.Popen([cli, "collbench", "-n", "8", "--ops", "all_reduce", "-b", "4096",
                          "-e", "4096", "--samples", "1000", "-w", "100000"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    time.sleep(1.0)
    sent = time.monotonic()
    p.send_signal(getattr(signal, sig))
    try:
        _, err = p.communicate(timeout=10)
    finally:
        p.kill()
    took = time.monotonic() - sent
    assert took < 2.0, f"the CLI stopped {took:.2f} s after {sig}"
    assert p.returncode == status, err
    assert f"run interrupted by {sig}" in err
    assert "what each rank was last doing" in err and "rank 7:" in err


def test_the_checks_wrappers_of_run_use():
    # cocemu.torch.run checks its own arguments with these, as cocemu.run does.
    from cocemu import _cocemu
    assert _cocemu._check_bool(True, "ct.run", "numerics") is True
    with pytest.raises(cocemu.Error, match=r"ct\.run: numerics = 'False' \(str\) is not a bool"):
        _cocemu._check_bool("False", "ct.run", "numerics")
    assert _cocemu._check_timeout_s(2, "ct.run", "timeout_s") == 2.0
    with pytest.raises(cocemu.Error, match=r"ct\.run: timeout_s = 'abc' \(str\) is not a number"):
        _cocemu._check_timeout_s("abc", "ct.run", "timeout_s")
    assert _cocemu._default_timeout_s() > 0


def test_a_bad_timeout_variable_is_named():
    import os
    import subprocess
    import sys
    code = "import cocemu; cocemu.run(1, lambda rank: None)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, COCEMU_TIMEOUT_MS="abc"), timeout=60)
    assert p.returncode != 0 and "COCEMU_TIMEOUT_MS" in p.stderr and "abc" in p.stderr, p.stderr


# Found by tests/robustness/campaign_python.py: each value was a crash (collective_ns root -1:
# a double free), a silent answer (a negative GEMM size priced, True taken for 1, None for
# float64, a 2**80-element shape wrapped, a 7-element bias on 5 columns) or pybind11's
# "incompatible function arguments" without the argument's name. Each is now a cocemu.Error
# naming the call, the argument and the value.
P = "ascend-910b"
DIRECT_BAD = [
    (lambda: cocemu.collective_ns(P, "broadcast", 8, 1024, root=-1),
     r"collective_ns: root = -1 is out of range; allowed 0\.\.7"),
    (lambda: cocemu.collective_ns(P, "all_reduce", 1.5, 1024), r"ranks = 1\.5 \(float\)"),
    (lambda: cocemu.collective_ns(P, "all_reduce", 8, True), r"numel = True \(bool\)"),
    (lambda: cocemu.collective_ns(P, 3, 8, 1024), r"op = 3 \(int\) is not a str"),
    (lambda: cocemu.collective_ns(P, "all_reduce", 8, 1024, algo=3), r"algo = 3 \(int\)"),
    (lambda: cocemu.gemm_ns(P, -1, 64, 64), r"gemm_ns: m = -1 is out of range"),
    (lambda: cocemu.gemm_ns(P, 64, 64, True), r"gemm_ns: k = True \(bool\) is not an integer"),
    (lambda: cocemu.gemm_ns(P, 64, 2**64, 64), r"n = 18446744073709551616 is out of range"),
    (lambda: cocemu.memory_ns(P, -1), r"memory_ns: bytes = -1 is out of range"),
    (lambda: cocemu.attention_ns(P, 2, -1, 128, 64), r"attention_ns: s_q = -1"),
    (lambda: cocemu.attention_ns(P, 2, 128, 128, 64, visible=float("nan")), r"visible = nan"),
    (lambda: cocemu.overlapped_ns(P, float("inf"), 1.0), r"compute_ns = inf is out of range"),
    (lambda: cocemu.flash_attention_ns(P, -1.0, 64, "bf16", 1e6, 128.0), r"flops = -1\.0"),
    (lambda: cocemu.fused_kernel_ns(P, "matmul_all_reduce", 64, 64, 64, True),
     r"fused_kernel_ns: ranks = True \(bool\)"),
    (lambda: cocemu.fused_kernel_ns(P, None, 64, 64, 64, 8), r"kind = None"),
    (lambda: cocemu.launch_ns(P, 3), r"launch_ns: kind = 3 \(int\)"),
    (lambda: cocemu.Tensor.zeros((2**40, 2**40)), r"shape \(1099511627776, 1099511627776\) "
                                                  r"has more than 2\*\*62 elements"),
    (lambda: cocemu.Tensor.zeros((2, -1)), r"shape \(2, -1\): dimension 1 = -1 must be >= 0"),
    (lambda: cocemu.Tensor.zeros(("a",)), r"dimension 0 = 'a' \(str\) is not an integer"),
    (lambda: cocemu.Tensor.zeros((1, 1, 1, 1, 1)), r"shape \(1, 1, 1, 1, 1\) has 5 dimensions"),
    (lambda: cocemu.Tensor.zeros((2, 2), None), r"dtype None is not a dtype"),
    (lambda: cocemu.Tensor.zeros((2, 2), [np.float32]), r"dtype \[<class 'numpy.float32'>\]"),
    (lambda: cocemu.Tensor.zeros((4, 2)).rows(1.5, 2), r"Tensor\.rows: begin = 1\.5"),
    (lambda: cocemu.to_bf16(np.zeros(4, np.complex64)),
     r"to_bf16: x = .*\(complex64\) is not an array of real"),
    (lambda: cocemu.to_bf16(None), r"to_bf16: x = None"),
    (lambda: cocemu.from_bf16(np.zeros(4, np.float32)), r"from_bf16: x must be a uint16 array.*"
                                                        r"float32"),
    (lambda: cocemu.load_profile(3), r"got 3 \(int\)"),
    (lambda: cocemu.load_profile(P).scaled(cocemu.load_profile(P).scalable_keys()[0],
                                           float("nan")), r"Profile\.scaled: factor = nan"),
    (lambda: cocemu.load_coc_config(3), r"load_coc_config: path = 3 \(int\)"),
]


@pytest.mark.parametrize("call,match", DIRECT_BAD)
def test_bad_values_of_the_cost_and_tensor_functions_are_named(call, match):
    with pytest.raises(cocemu.Error, match=match) as info:
        call()
    assert info.value.code == "invalid_argument"


def f32(*shape):
    return np.zeros(shape, np.float32)


RANK_BAD = [
    (lambda rank, W: cocemu.broadcast(W, f32(4), 1.5), r"broadcast: root = 1\.5 \(float\)"),
    (lambda rank, W: cocemu.broadcast(W, f32(4), True), r"broadcast: root = True \(bool\)"),
    (lambda rank, W: cocemu.reduce(W, f32(4), 2**31), r"reduce: root = 2147483648 is out of range; "
                                                      r"allowed 0\.\.1"),
    (lambda rank, W: cocemu.send(W, f32(4), "1"), r"send: dst = '1' \(str\)"),
    (lambda rank, W: cocemu.irecv(W, f32(4), 0, tag=1.5), r"irecv: tag = 1\.5"),
    (lambda rank, W: cocemu.all_reduce(W, f32(4), async_op=None), r"async_op = None"),
    (lambda rank, W: cocemu.all_reduce(W, f32(4), deterministic=1), r"deterministic = 1 \(int\)"),
    (lambda rank, W: cocemu.all_reduce(W, f32(4), op=3), r"op = 3 \(int\) is not a reduce op"),
    (lambda rank, W: cocemu.all_reduce(W, f32(4), op="SUMM"), r"reduce op 'SUMM' is unknown"),
    (lambda rank, W: cocemu.all_reduce(W, f32(4), algo=["ring"]), r"algo = \['ring'\]"),
    (lambda rank, W: cocemu.all_reduce(W, f32(4), label=3), r"label = 3 \(int\) is not a str"),
    (lambda rank, W: cocemu.barrier(W, async_op="yes"), r"barrier: async_op = 'yes'"),
    (lambda rank, W: cocemu.all_to_all(W, f32(4), f32(4), output_splits="22", input_splits=[2, 2]),
     r"all_to_all: output_splits = '22'"),
    (lambda rank, W: cocemu.batch_isend_irecv(W, 3), r"batch_isend_irecv: ops = 3"),
    (lambda rank, W: cocemu.batch_isend_irecv(W, [3]), r"an op is a cocemu\.P2POp .* got 3"),
    (lambda rank, W: cocemu.new_group(rank, [0, 1.5]), r"new_group: a rank = 1\.5"),
    (lambda rank, W: cocemu.split(W, "a"), r"split: color = 'a' \(str\)"),
    (lambda rank, W: cocemu.make_mesh(rank, tp=True), r"make_mesh: tp = True \(bool\)"),
    (lambda rank, W: cocemu.matmul_all_reduce(W, f32(4, 3), f32(5, 3), f32(4, 5), bias=f32(7)),
     r"matmul_all_reduce: bias f32\[7\] must be \[5\]"),
    (lambda rank, W: cocemu.matmul_reduce_scatter(W, f32(4, 3), f32(5, 3), f32(2, 5),
                                                  tiles_per_step=2**40),
     r"tiles_per_step = 1099511627776 is out of range; allowed 1\.\.15"),
    (lambda rank, W: cocemu.all_gather_matmul(W, f32(2, 3), f32(5, 3), f32(4, 5), tile_rows=1.5),
     r"all_gather_matmul: tile_rows = 1\.5"),
    (lambda rank, W: rank.zeros((True,)), r"dimension 0 = True \(bool\)"),
    (lambda rank, W: rank.compute_stream.launch("op", work_ns=1e300), r"work_ns = 1e\+300 is out "
                                                                      r"of range"),
    (lambda rank, W: rank.compute_stream.launch("op", flops=True), r"flops = True \(bool\)"),
    (lambda rank, W: rank.compute_stream.launch(3, work_ns=1), r"name = 3 \(int\) is not a str"),
    (lambda rank, W: rank.compute_stream.wait(3), r"Stream\.wait: event = 3 \(int\)"),
    (lambda rank, W: rank.compute_stream.wait_stream(None), r"wait_stream: stream = None"),
    (lambda rank, W: rank.set_current_stream("compute"), r"stream = 'compute' \(str\)"),
    (lambda rank, W: rank.set_segment(None), r"set_segment: name = None"),
    (lambda rank, W: cocemu.SymmetricBuffer.allocate(rank, [0, 1], -1), r"bytes = -1 is out"),
    (lambda rank, W: cocemu.SymmetricBuffer.allocate(rank, [0, 1], 16).put(1, -4, f32(1)),
     r"SymmetricBuffer\.put: offset = -4 is out of range"),
]


@pytest.mark.parametrize("call,match", RANK_BAD)
def test_bad_values_on_ranks_are_named_with_the_rank(call, match):
    def body(rank):
        call(rank, rank.world)
        rank.synchronize()
    e = fails(2, body, match, timeout_s=20)
    assert re.search(r"rank [01] failed", str(e)), str(e)


def test_the_strict_arguments_still_take_numpy_integers_and_defaults():
    # np.int64 roots and sizes, a float work_ns given as an int, deterministic=None (the run's).
    assert cocemu.gemm_ns(P, np.int64(64), 64, 64) == cocemu.gemm_ns(P, 64, 64, 64)
    assert cocemu.collective_ns(P, "broadcast", 4, 1024, root=np.int32(3)) > 0
    assert cocemu.Tensor.zeros((2**40, 2**40, 0)).numel == 0  # empty: no element count to wrap

    def body(rank):
        x = np.full(4, rank.id + 1, np.float32)
        cocemu.broadcast(rank.world, x, np.int64(1), deterministic=None, async_op=False)
        rank.compute_stream.launch("op", work_ns=5)
        rank.synchronize()
        return float(x[0])
    assert cocemu.run(2, body).returns == [2.0, 2.0]
