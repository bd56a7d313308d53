#!/usr/bin/env python3
"""ctest `multihost.train`: `mpirun -n H cocemu train`, `cocemu attention` and `cocemu bench` with
MPI process h in network namespace h (mpirun_netns.py) give what one host gives.

  test_train_mpirun.py --cocemu build/cli/cocemu

Checks (exit 1 on any failure):
  - `cocemu train` with real numerics on 1 host (no mpirun) and on 2 and 4 hosts: the same
    train.json (losses, gradient norms, iteration time, every modeled figure) and the same
    Chrome trace byte for byte, for a layout whose pipeline sends cross hosts and one whose
    data-parallel reductions and distributed-optimizer gathers do; every host's eth0 carried
    traffic; each non-reporting host says which ranks it ran;
  - `cocemu attention` (context-parallel ring over 4 ranks) on 1 and 2 hosts: the same modeled
    lines and the same out/lse/dq/dk/dv arrays byte for byte;
  - `cocemu bench` (TP 8) on 1 and 2 hosts: the same modeled figures and bitwise verdicts for
    serial and script CoC; fused, whose symmetric memory needs the TP group on one host, is left
    out with a note;
  - hosts that run different programs (host 1 one iteration more) both fail within the wait
    timeout, each with an error naming the other host, and no cocemu process is left running;
  - a host killed mid-run (SIGKILL) ends the job: mpirun names the process, no cocemu is left.
Prints each comparison with the host wall times. Exits 77 (SKIP) with the reason when the
machine cannot run the harness (not root, no `ip netns`, no mpirun).
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mpirun_netns  # noqa: E402

failures: list[str] = []


def check(ok: bool, what: str) -> None:
    print(("ok      " if ok else "FAILED  ") + what)
    if not ok:
        failures.append(what)


def one_host(cmd: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    return p, time.monotonic() - t0


def on_hosts(n: int, cmd: list[str], env: dict[str, str] | None = None,
             timeout: float = 300) -> tuple[mpirun_netns.Result, float]:
    t0 = time.monotonic()
    r = mpirun_netns.run(n, cmd, env={"OPENBLAS_NUM_THREADS": "1", **(env or {})},
                         timeout=timeout)
    return r, time.monotonic() - t0


def both(name: str, base: list[str], work: str, hosts: int):
    """Runs `base --out-dir DIR` on 1 host and on `hosts`; (1-host run, its dir, its wall time,
    the hosts' result, their dir, their wall time), or None after a failure (reported)."""
    slug = name.replace(" ", "-")
    d1, dn = os.path.join(work, f"{slug}-1"), os.path.join(work, f"{slug}-{hosts}")
    os.makedirs(d1)
    os.makedirs(dn)
    single, t1 = one_host([*base, "--out-dir", d1])
    check(single.returncode == 0, f"{name} on 1 host exits 0 ({single.stderr[-300:]})")
    result, tn = on_hosts(hosts, [*base, "--out-dir", dn])
    if result.returncode != 0:
        mpirun_netns.report(result)
    check(result.returncode == 0, f"{name} on {hosts} hosts exits 0")
    if single.returncode or result.returncode:
        return None
    return single, d1, t1, result, dn, tn


def cocemu_processes(marker: str) -> list[str]:
    p = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True)
    return [line for line in p.stdout.splitlines() if "pgrep" not in line]


def compare_train(cocemu: str, work: str, name: str, layout: list[str], hosts: int) -> None:
    base = [cocemu, "train", "--dtype", "f32", "--iterations", "2", *layout]
    ran = both(f"train {name}", base, work, hosts)
    if not ran:
        return
    single, d1, t1, result, dn, tn = ran
    a = json.load(open(os.path.join(d1, "train.json")))
    b = json.load(open(os.path.join(dn, "train.json")))
    same_trace = filecmp.cmp(os.path.join(d1, "train.trace.json"),
                             os.path.join(dn, "train.trace.json"), shallow=False)
    print(f"        {name}: 1 host {t1:.2f} s, {hosts} hosts {tn:.2f} s wall (mpirun, namespaces "
          f"made and removed included); loss {a['loss']} vs {b['loss']}; iteration "
          f"{a['iteration_ns']} vs {b['iteration_ns']} ns")
    check(a == b, f"train {name}: train.json on {hosts} hosts equals 1 host's (losses, norms, "
                  "every modeled figure)")
    check(a["loss"] and all(isinstance(x, float) for x in a["loss"]),
          f"train {name}: real losses ({a['loss']})")
    check(same_trace, f"train {name}: the trace on {hosts} hosts is 1 host's byte for byte")
    per = 8 // hosts
    for h in range(1, hosts):
        out = result.hosts[h].stdout
        check(f"host {h} of {hosts} ran ranks {h * per}..{h * per + per - 1}" in out,
              f"train {name}: host {h} says which ranks it ran ({out.strip()[:200]!r})")
    for h, (rx, tx) in enumerate(result.traffic):
        check(rx > 0 and tx > 0, f"train {name}: host {h}'s eth0 carried the run (rx {rx} B, "
                                 f"tx {tx} B)")


def compare_attention(cocemu: str, work: str) -> None:
    base = [cocemu, "attention", "--cp", "4", "--seq", "256", "--heads", "4", "--head-dim", "32",
            "--dtype", "f32", "--mask", "causal"]
    ran = both("attention", base, work, 2)
    if not ran:
        return
    single, d1, t1, result, d2, t2 = ran
    modeled = lambda text: [l for l in text.splitlines() if l.startswith(("modeled", "rank 0"))]
    check(modeled(single.stdout) and modeled(single.stdout) == modeled(result.hosts[0].stdout),
          "attention: the modeled lines on 2 hosts are 1 host's:\n        " +
          "\n        ".join(modeled(result.hosts[0].stdout)))
    for f in ("out", "lse", "dq", "dk", "dv"):
        check(filecmp.cmp(os.path.join(d1, f + ".npy"), os.path.join(d2, f + ".npy"),
                          shallow=False), f"attention: {f}.npy on 2 hosts is 1 host's")
    print(f"        attention: 1 host {t1:.2f} s, 2 hosts {t2:.2f} s wall")


def compare_bench(cocemu: str, work: str) -> None:
    base = [cocemu, "bench", "--no-progress", "--repeats", "1"]
    ran = both("bench", base, work, 2)
    if not ran:
        return
    single, d1, t1, result, d2, t2 = ran
    check("fused left out" in result.hosts[0].stderr,
          "bench on 2 hosts says why fused is left out (TP 8 across hosts)")
    one = {s["name"]: s for s in json.load(open(os.path.join(d1, "bench.json")))["strategies"]}
    two = json.load(open(os.path.join(d2, "bench.json")))["strategies"]
    check([s["name"] for s in two] == ["serial", "script P=2", "script P=4", "script P=8"],
          f"bench on 2 hosts runs serial and script ({[s['name'] for s in two]})")
    for s in two:
        want = {k: v for k, v in one[s["name"]].items() if k != "wall_ns"}
        got = {k: v for k, v in s.items() if k != "wall_ns"}
        check(want == got and got["bitwise_equal_serial"] is True,
              f"bench {s['name']} on 2 hosts: modeled {got['modeled_ns']} ns, the same figures and "
              "bits as on 1 host")
    print(f"        bench: 1 host {t1:.2f} s, 2 hosts {t2:.2f} s wall")


def error_line(text: str) -> str:
    return next((line for line in text.splitlines() if "error:" in line), "(no error printed)")


def failures_are_reported(cocemu: str, work: str) -> None:
    marker = os.path.join(work, "diverge")
    # Host 1 runs one iteration more: its ranks wait for host 0's, which have finished.
    cmd = ["sh", "-c", f'exec {cocemu} train --dtype f32 --tensor-model-parallel-size 2 '
                       f'--data-parallel-size 4 --pipeline-model-parallel-size 1 --iterations $((2 + OMPI_COMM_WORLD_RANK)) '
                       f'--out-dir {marker}']
    t0 = time.monotonic()
    result, _ = on_hosts(2, cmd, env={"COCEMU_TIMEOUT_MS": "4000"}, timeout=90)
    took = time.monotonic() - t0
    text = [h.stdout + h.stderr for h in result.hosts]
    check(result.returncode != 0 and not result.timed_out,
          f"hosts running different programs: the job fails, not hangs ({took:.1f} s)")
    check(all(h.returncode not in (0, None) for h in result.hosts),
          f"each host exits with an error ({[h.returncode for h in result.hosts]})")
    # Which host's wait ends first is a race; either way each names the other: by its failure,
    # or as what the wait was for.
    check(bool(re.search(r"host 1 failed|recorded ops of host 1", text[0])
               and re.search(r"host 0 failed|on host 0\b", text[1])),
          "each host names the other:\n        " +
          "\n        ".join(error_line(t)[:400] for t in text))
    check(not cocemu_processes(marker), "no cocemu process is left running")

    killed = os.path.join(work, "killed")
    cmd = ["sh", "-c", f'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then (sleep 2; kill -9 $$) & fi; '
                       f'exec {cocemu} train --dtype f32 --tensor-model-parallel-size 2 '
                       f'--data-parallel-size 4 --pipeline-model-parallel-size 1 --iterations 200 --out-dir {killed}']
    result, took = on_hosts(2, cmd, timeout=120)
    check(result.returncode != 0 and not result.timed_out,
          f"a host killed mid-run ends the job ({took:.1f} s, mpirun exit {result.returncode})")
    said = " ".join(result.mpirun_output.split())
    named = re.search(r"Process name: \[\[\d+,\d+\],1\] Exit code: 137", said)
    check(bool(named), "mpirun names the killed process (MPI rank 1 = host 1, exit 137 = "
                       "SIGKILL): " + (named.group(0) if named else said[-400:]))
    check(not cocemu_processes(killed), "no cocemu process is left running")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cocemu", required=True)
    args = parser.parse_args()
    why = mpirun_netns.unavailable()
    if why:
        print(f"SKIP: {why}")
        return mpirun_netns.SKIP
    cocemu = os.path.abspath(args.cocemu)
    with tempfile.TemporaryDirectory(prefix="cocemu-mpirun-") as work:
        compare_train(cocemu, work, "tp2-dp2-pp2", ["--tensor-model-parallel-size", "2",
                      "--pipeline-model-parallel-size", "2", "--data-parallel-size", "2"], 2)
        compare_train(cocemu, work, "tp2-dp4-distopt", ["--tensor-model-parallel-size", "2",
                      "--data-parallel-size", "4", "--pipeline-model-parallel-size", "1",
                      "--use-distributed-optimizer"], 2)
        compare_train(cocemu, work, "tp2-dp2-pp2-4hosts", ["--tensor-model-parallel-size", "2",
                      "--pipeline-model-parallel-size", "2", "--data-parallel-size", "2"], 4)
        compare_attention(cocemu, work)
        compare_bench(cocemu, work)
        failures_are_reported(cocemu, work)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
