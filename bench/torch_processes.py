#!/usr/bin/env python3
"""Ranks as threads, as processes, and torch's gloo, in the same run (issue #43): the host time
of an 8-rank all_reduce of 4 KiB and of 64 MiB per call through torch.distributed, the 64 MiB
call against the memory floor 2 · n · S ÷ the copy bandwidth measured here (two threads, as
STREAM's copy: bytes read + written), and the time to start 8 rank processes.

    .venv/bin/python bench/torch_processes.py [REPEATS=3] [CALLS=200]
    (the module from build/python; COCEMU_BUILD=dir for another build)

Each figure is the median over REPEATS alternated runs of the slowest rank's mean time per call
(CALLS back-to-back calls after a barrier; 3 calls of 64 MiB). The machine is shared and noisy:
compare the ratios printed on the same run.
"""
import os
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.abspath(os.environ.get("COCEMU_BUILD", os.path.join(HERE, "..", "build")))
sys.path.insert(0, os.path.join(BUILD, "python"))
sys.path.insert(0, HERE)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
RANKS = 8
SMALL, LARGE = 4096, 64 << 20


def timed_all_reduce(nbytes, calls):
    """The slowest-rank figure is taken by the caller; this rank's mean seconds per call."""
    import torch
    import torch.distributed as dist
    x = torch.ones(nbytes // 4)
    dist.all_reduce(x)
    dist.barrier()
    t = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(x)
    return (time.perf_counter() - t) / calls


def small():
    return timed_all_reduce(SMALL, int(os.environ.get("BENCH_CALLS", "200")))


def large():
    return timed_all_reduce(LARGE, 3)


def nothing():
    return 0


def _gloo_rank(rank, port, queue, calls):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=RANKS)
    out = (timed_all_reduce(SMALL, calls), timed_all_reduce(LARGE, 3))
    queue.put((rank, out))
    dist.destroy_process_group()


def gloo(calls):
    import socket
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    q = ctx.Queue()
    procs = [ctx.Process(target=_gloo_rank, args=(r, port, q, calls)) for r in range(RANKS)]
    for p in procs:
        p.start()
    outs = [q.get(timeout=600)[1] for _ in procs]
    for p in procs:
        p.join()
    return max(o[0] for o in outs), max(o[1] for o in outs)


def copy_bandwidth():
    """GB/s of two threads each copying 128 MiB (bytes read + written), best of 5."""
    import numpy as np
    src = [np.ones(32 << 20, np.float32) for _ in range(2)]
    dst = [np.empty_like(a) for a in src]
    best = 0.0
    for _ in range(5):
        ts = [threading.Thread(target=np.copyto, args=(d, s)) for d, s in zip(dst, src)]
        t = time.perf_counter()
        for th in ts:
            th.start()
        for th in ts:
            th.join()
        best = max(best, 2 * 2 * src[0].nbytes / (time.perf_counter() - t) / 1e9)
    return best


def main():
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    os.environ["BENCH_CALLS"] = str(calls)
    import cocemu.torch as ct
    import torch_processes as me  # the rank processes import the functions from this module
    torch_import = float(subprocess.run(
        [sys.executable, "-c", "import time; t = time.perf_counter(); import torch; "
         "print(time.perf_counter() - t)"], capture_output=True, text=True).stdout)
    t = time.perf_counter()
    ct.run(me.nothing, world_size=RANKS, processes=True, record=False)
    cold = time.perf_counter() - t
    rows = {k: [] for k in ("threads", "processes", "gloo")}
    starts, floors = [], []
    for _ in range(repeats):
        floors.append(2 * RANKS * LARGE / (copy_bandwidth() * 1e9))
        t = time.perf_counter()
        ct.run(me.nothing, world_size=RANKS, processes=True, record=False)
        starts.append(time.perf_counter() - t)
        for mode in ("threads", "processes"):
            a = ct.run(me.small, world_size=RANKS, record=False, processes=mode == "processes")
            b = ct.run(me.large, world_size=RANKS, record=False, processes=mode == "processes")
            rows[mode].append((max(a.returns), max(b.returns)))
        rows["gloo"].append(gloo(calls))
    med = {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v))
           for k, v in rows.items()}
    floor = statistics.median(floors)
    print(f"# {RANKS} ranks, all_reduce through torch.distributed, median of {repeats} "
          f"alternated runs (slowest rank's mean per call)")
    print(f"{'mode':<10} {'4 KiB us':>10} {'64 MiB ms':>10} {'x floor':>8}")
    for k, (s, big) in med.items():
        print(f"{k:<10} {s * 1e6:>10.1f} {big * 1e3:>10.1f} {big / floor:>8.2f}")
    print(f"memory floor 2·n·S ÷ copy bandwidth: {floor * 1e3:.1f} ms")
    print(f"processes ÷ threads, 4 KiB: {med['processes'][0] / med['threads'][0]:.2f}x; "
          f"gloo ÷ processes, 4 KiB: {med['gloo'][0] / med['processes'][0]:.2f}x")
    print(f"start of {RANKS} rank processes (an empty fn, whole ct.run): first "
          f"{cold:.2f} s (the fork server imports torch: {torch_import:.2f} s alone), then "
          f"median {statistics.median(starts):.2f} s")


if __name__ == "__main__":
    main()
