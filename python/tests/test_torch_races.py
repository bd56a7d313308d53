"""Stream races (R-PY-16): in checked mode, an op that reads or writes a tensor on one stream while
an op on another stream may still write it (no event, wait_stream, synchronize or Work.wait()
orders them) is an error naming both ops, their streams and the rank."""
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import cocemu  # noqa: E402
import cocemu.torch as ct  # noqa: E402

def side_stream_program(order):
    """y = x @ x on a side stream, then y read on the main stream, ordered by `order`."""
    def fn():
        main, side = torch.cuda.current_stream(), torch.cuda.Stream()
        x = torch.ones(64, 64, device="cuda")
        side.wait_stream(main)
        with torch.cuda.stream(side):
            y = x @ x
        if order == "wait_stream":
            main.wait_stream(side)
        elif order == "event":
            ev = torch.cuda.Event()
            ev.record(side)
            main.wait_event(ev)
        elif order == "event_wait":
            ev = side.record_event()
            ev.wait()
        elif order == "stream_synchronize":
            side.synchronize()
        elif order == "event_synchronize":
            side.record_event().synchronize()
        elif order == "device_synchronize":
            torch.cuda.synchronize()
        return float((y + 1).sum())
    return fn


@pytest.mark.parametrize("order", ["wait_stream", "event", "event_wait", "stream_synchronize",
                                   "event_synchronize", "device_synchronize"])
def test_ordered_cross_stream_use_passes(order):
    assert ct.run(side_stream_program(order), world_size=2).returns == [64.0 * 64 * 65] * 2


def test_reading_a_side_streams_result_unordered_is_an_error_naming_both_ops():
    with pytest.raises(cocemu.Error) as e:
        ct.run(side_stream_program(None), world_size=2)
    msg = str(e.value)
    assert "stream race: aten.add on stream compute reads a [64, 64] float32 tensor" in msg
    assert "aten.mm (op 1 on stream stream1, rank" in msg
    assert e.value.code == "failed_precondition"


def test_unchecked_runs_do_not_check():
    assert ct.run(side_stream_program(None), world_size=1, checked=False).returns == \
        [64.0 * 64 * 65]


def test_side_stream_reading_main_streams_write_without_waiting_is_an_error():
    def fn():
        side = torch.cuda.Stream()
        x = torch.zeros(8, device="cuda")
        x.add_(1)                       # main writes x
        with torch.cuda.stream(side):
            return float((x * 2).sum())  # side reads it: nothing orders them
    with pytest.raises(cocemu.Error, match=r"aten.mul on stream stream1 reads a \[8\] float32 "
                                           r"tensor that aten.add_ \(op 2 on stream compute"):
        ct.run(fn, world_size=1)


def test_host_ops_inside_unmodeled_are_not_checked():
    def fn():
        side = torch.cuda.Stream()
        with ct.unmodeled():
            w = torch.ones(4, device="cuda")
        with torch.cuda.stream(side):
            return float((w * 2).sum())
    assert ct.run(fn, world_size=1).returns == [8.0]


def test_waiting_for_a_collective_on_a_side_stream_then_reading_on_main_is_an_error():
    def fn():
        side = torch.cuda.Stream()
        x = torch.ones(1024, device="cuda")
        work = dist.all_reduce(x, async_op=True)
        with torch.cuda.stream(side):
            work.wait()                 # the side stream waits, the main stream does not
        return float(x.sum())
    with pytest.raises(cocemu.Error, match=r"aten.sum on stream compute reads a \[1024\] float32 "
                                           r"tensor that aten.all_reduce \(op 1 on stream"):
        ct.run(fn, world_size=2)


def test_collective_from_a_side_stream_without_wait_stream_is_an_error():
    def fn(wait):
        def body():
            side = torch.cuda.Stream()
            x = torch.ones(1024, device="cuda") * 2    # written on the main stream
            if wait:
                side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                dist.all_reduce(x)
            torch.cuda.current_stream().wait_stream(side)
            return float(x.sum())
        return body
    assert ct.run(fn(True), world_size=2).returns == [4096.0] * 2
    with pytest.raises(cocemu.Error, match=r"aten.all_reduce on stream .* a \[1024\] float32 "
                                           r"tensor that aten.mul \(op 2 on stream compute"):
        ct.run(fn(False), world_size=2)
