"""cocemu quick start: 8 ranks all-reduce a vector after a producer kernel; the run records a
modeled device timeline (the same program as examples/cpp/quickstart.cpp, the same nanoseconds).
"""
import cocemu


def body(rank):                                     # runs on each of the 8 rank threads
    x = rank.zeros((1024,), "f32")                  # a NumPy array over cocemu's memory
    # A kernel on the compute stream: 5 us modeled; it writes rank + 1 into x.
    rank.compute_stream.launch("produce", lambda: x.fill(rank.id + 1), work_ns=5000)
    work = cocemu.all_reduce(rank.world, x, async_op=True)  # comm stream, after the producer
    work.wait()          # the compute stream waits for it; the host does not block
    rank.synchronize()   # the host waits for all of this rank's streams
    return float(x[0])


r = cocemu.run(8, body)
print(f"x[0] = {r.returns[0]:g} on every rank")
print(f"modeled time {r.makespan_ns / 1e3:.3f} us (host wall time {r.wall_ns / 1e6:.3f} ms)")
r.write_chrome_trace("trace.json")                  # open in Perfetto or chrome://tracing
r.write_svg("timeline.svg", "quickstart")
