#!/usr/bin/env python3
"""Host cost of a collective issued from Python against the same call from C++ (issue #36,
R-PY-4: at most 2x). Both sides run the program of bench/speed/issue_speed.cpp: every rank of an
8-rank world issues CALLS async out-of-place 4 KiB all_reduces back to back, timing the issue loop
alone, then synchronizes its comm stream. Per run: the median over ranks and rounds of the host
issue time per call and of the wall time per call, and the process's CPU time per call (all
threads; a one-call run's CPU time, start-up included, subtracted). The runs alternate, REPEATS
times each (the machine is shared and noisy); the medians are printed side by side.

    /usr/bin/python3 bench/python_overhead.py [REPEATS=7] [CALLS=200] [ROUNDS=5]
    (the module from build/python, the C++ side build/bench/issue_speed; COCEMU_BUILD=dir
    for another build)
"""
import os
import resource
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.abspath(os.environ.get("COCEMU_BUILD", os.path.join(HERE, "..", "build")))
RANKS = 8


def python_side(calls, rounds):
    """The issue_speed program in Python; prints its two medians as issue_speed does."""
    sys.path.insert(0, os.path.join(BUILD, "python"))
    import cocemu

    lock = threading.Lock()
    issue, wall = [], []

    def body(rank):
        world = rank.world
        x, y = rank.zeros((1024,), "f32"), rank.zeros((1024,), "f32")
        cocemu.all_reduce(world, x, y, async_op=True).synchronize()  # plans cached, streams warm
        comm = rank.comm_stream
        for _ in range(rounds):
            cocemu.barrier(world, async_op=True).synchronize()
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                cocemu.all_reduce(world, x, y, async_op=True)
            t1 = time.perf_counter_ns()
            comm.synchronize()
            t2 = time.perf_counter_ns()
            with lock:
                issue.append((t1 - t0) / calls)
                wall.append((t2 - t0) / calls)

    cocemu.run(RANKS, body, record_wall_times=False)
    print(f"host issue per call  {statistics.median(issue) / 1e3:8.2f} us")
    print(f"wall per call        {statistics.median(wall) / 1e3:8.2f} us")


def run_side(cmd, env_extra):
    """Runs one side; returns (its output, the CPU seconds it used, all threads)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", **env_extra)  # no idle OpenBLAS pool
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return out, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def measure(side, calls, rounds, baseline_cpu):
    """(issue us, wall us, CPU us per call beyond a one-call run: start-up and set-up excluded)."""
    cmd, env_extra = side
    out, cpu = run_side(cmd(calls, rounds), env_extra)
    value = lambda key: float(out.split(key)[1].split("us")[0])
    per_call = (cpu - baseline_cpu) * 1e6 / (RANKS * (calls * rounds - 1))
    return value("host issue per call"), value("wall per call"), per_call


def main():
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    tbbmalloc = "/usr/lib/x86_64-linux-gnu/libtbbmalloc_proxy.so.2"
    issue_speed = os.path.join(BUILD, "bench", "issue_speed")
    python = lambda c, r: [sys.executable, os.path.abspath(__file__), "--python-side", str(c), str(r)]
    # issue_speed links oneTBB's scalable malloc (as the cocemu CLI does); the Python side runs
    # with glibc's malloc as `python3` does, and with oneTBB's preloaded, to show what is Python's.
    sides = {
        "C++": (lambda c, r: [issue_speed, str(RANKS), str(c), str(r)], {}),
        "Python": (python, {}),
        "Python+tbbmalloc": (python, {"LD_PRELOAD": tbbmalloc}),
    }
    if not os.path.exists(tbbmalloc):
        del sides["Python+tbbmalloc"]
    baseline = {name: min(run_side(side[0](1, 1), side[1])[1] for _ in range(3))
                for name, side in sides.items()}
    print(f"python_overhead: {RANKS} ranks, {calls} async 4 KiB all_reduces per round and rank, "
          f"{rounds} rounds, {repeats} alternated repeats; us per call: host issue and wall "
          f"(median over ranks and rounds), CPU of all threads")
    print(f"{'repeat':>6} {'side':<17} {'issue':>7} {'wall':>8} {'x C++':>6} {'CPU':>7} {'x C++':>6}")
    rows = {name: [] for name in sides}
    for r in range(repeats):
        names = list(sides) if r % 2 == 0 else list(reversed(sides))
        got = {name: measure(sides[name], calls, rounds, baseline[name]) for name in names}
        for name in sides:
            rows[name].append(got[name])
            v, c = got[name], got["C++"]
            print(f"{r + 1:>6} {name:<17} {v[0]:>7.2f} {v[1]:>8.2f} {v[1] / c[1]:>5.2f}x "
                  f"{v[2]:>7.2f} {v[2] / c[2]:>5.2f}x")
    med = {name: [statistics.median(row[j] for row in rows[name]) for j in range(3)]
           for name in sides}
    for name in sides:
        v, c = med[name], med["C++"]
        print(f"{'median':>6} {name:<17} {v[0]:>7.2f} {v[1]:>8.2f} {v[1] / c[1]:>5.2f}x "
              f"{v[2]:>7.2f} {v[2] / c[2]:>5.2f}x")
    print("target: Python's wall time per call at most 2x C++'s (issue #36)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--python-side":
        python_side(int(sys.argv[2]), int(sys.argv[3]))
    else:
        main()
