"""A unit test of an overlap scheme of one's own, written against cocemu's Python API: a
row-parallel matmul whose all_reduce is split into P chunks, so that chunk i's all_reduce runs on
the comm stream while chunk i+1's matmul runs on the compute stream. One test checks the numerics
(the same bits as the serial version), the other the modeled time at a full-size shape (dry run).
The same test as docs/examples/overlap_test.cpp, giving the same nanoseconds.

    PYTHONPATH=build/python python3 -m pytest -s examples/python/test_overlap.py
"""
import numpy as np

import cocemu


def matmul_all_reduce(rank, tp, x, w, y, chunks):
    """y = x @ w on this rank's shards, then summed over the group, in `chunks` row blocks."""
    (m, k), n = x.shape, w.shape[1]
    rows = m // chunks
    pending = []
    for c in range(chunks):
        xc, yc = x[c * rows:(c + 1) * rows], y[c * rows:(c + 1) * rows]
        rank.compute_stream.launch("matmul", lambda xc=xc, yc=yc: np.matmul(xc, w, out=yc),
                                   work_ns=cocemu.gemm_ns(rank.profile, rows, n, k, x.dtype))
        # Enqueued on the comm stream after the matmul above; returns at once.
        pending.append(cocemu.all_reduce(tp, yc, async_op=True))
    for work in pending:
        work.wait()  # the compute stream waits, the host does not
    rank.synchronize()


def pattern(rows, cols, seed):
    """Small integers: every sum is exact, so any correct schedule gives the same bits."""
    return ((np.arange(rows * cols) * 7 + seed) % 5 - 2).astype(np.float32).reshape(rows, cols)


def run_numerics(chunks):
    def body(rank):
        y = rank.zeros((64, 32), "f32")
        matmul_all_reduce(rank, rank.world, pattern(64, 16, rank.id), pattern(16, 32, 1), y, chunks)
        return y
    return cocemu.run(8, body).returns[0]


def test_same_bits_as_serial():
    assert np.array_equal(run_numerics(4), run_numerics(1))


def modeled_ns(chunks):
    def body(rank):  # a dry run: rank.zeros gives shape-only tensors
        x, w, y = (rank.zeros(s, "bf16") for s in ((4096, 1024), (1024, 8192), (4096, 8192)))
        matmul_all_reduce(rank, rank.world, x, w, y, chunks)
    return cocemu.run(8, body, dry_run=True).makespan_ns


def test_four_chunks_hide_communication():
    serial, chunked = modeled_ns(1), modeled_ns(4)
    print(f"modeled: serial {serial / 1e3:.1f} us, 4 chunks {chunked / 1e3:.1f} us")
    assert chunked < serial
