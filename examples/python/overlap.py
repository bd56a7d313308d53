"""A hand-written overlap scheme: sequence-parallel all_gather -> matmul, serial against P chunks
(chunk c's matmul computes while the later chunks' all_gathers run on the comm stream).
First with real numerics at a small size (the chunked result must equal the serial one bit for
bit), then shapes only at a layer's size for the modeled times. The same program as
examples/cpp/overlap.cpp, the same nanoseconds.
"""
import numpy as np

import cocemu

RANKS, CHUNKS = 8, 4


def gather_matmul(chunks, rows, k, n, dtype, dry_run):
    """y[RANKS * rows, n] = all_gather(x[rows, k]) @ w[k, n] on every rank, in `chunks` pieces."""
    def body(rank):
        x, w = rank.zeros((rows, k), dtype), rank.zeros((k, n), dtype)
        y = rank.zeros((RANKS * rows, n), dtype)
        if rank.numerics:  # small integers: every sum is exact (f32 here: bf16 arrays are uint16)
            x[:] = ((rank.id * 7 + np.arange(rows * k) * 3) % 5 - 2).reshape(rows, k)
            w[:] = (np.arange(k * n) % 3 - 1).reshape(k, n)
        part = rows // chunks  # rows of each rank's x per chunk
        gathered, works = [], []
        for c in range(chunks):  # post every chunk's transfer first
            gathered.append(rank.zeros((RANKS * part, k), dtype))
            label = "" if chunks == 1 else f"[{c + 1}/{chunks}]"
            works.append(cocemu.all_gather(rank.world, gathered[-1], x[c * part:(c + 1) * part],
                                           async_op=True, label=label))
        for c in range(chunks):
            works[c].wait()  # the compute stream waits for chunk c only
            m = RANKS * part

            def matmul(g=gathered[c], c=c):  # rank r's rows of chunk c go to its block of y
                for r in range(RANKS):
                    np.matmul(g[r * part:(r + 1) * part], w,
                              out=y[r * rows + c * part:r * rows + (c + 1) * part])

            rank.compute_stream.launch("matmul" if chunks == 1 else f"matmul[{c + 1}/{chunks}]",
                                       matmul, flops=2 * m * n * k,
                                       work_ns=cocemu.gemm_ns(rank.profile, m, n, k, dtype))
        rank.synchronize()
        return y

    return cocemu.run(RANKS, body, dry_run=dry_run)


small = [gather_matmul(p, 64, 256, 128, "f32", dry_run=False) for p in (1, CHUNKS)]
print("numerics, x [64, 256] per rank: chunked result equal to serial:",
      "yes" if np.array_equal(small[0].returns[0], small[1].returns[0]) else "NO")
serial, chunked = (gather_matmul(p, 512, 4096, 1536, "bf16", dry_run=True) for p in (1, CHUNKS))
print(f"modeled, bf16 x [512, 4096] per rank, w [4096, 1536]: serial "
      f"{serial.makespan_ns / 1e3:.3f} us, chunked (P = {CHUNKS}) {chunked.makespan_ns / 1e3:.3f} us")
chunked.write_chrome_trace("overlap.json")
