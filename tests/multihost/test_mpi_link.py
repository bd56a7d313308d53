#!/usr/bin/env python3
"""ctest `multihost.mpi_link.<H>hosts`: the MPI HostLink between H processes in H network
namespaces (mpirun_netns.py), driving mpi_link_check.

  test_mpi_link.py --check build/tests/mpi_link_check --hosts 2 [--no-bandwidth]

Checks (exit 1 on any failure): every host passes `mpi_link_check messages` (contents of keyed
messages of 0 B .. 24 MiB + 1 in chunks of 1000003 B, both ways between every pair; a timeout;
a failure report naming its host); each host's eth0 sent at least the payload bytes it sent to
the others, so the data crossed the veths. A host
that never ends its link makes host 0 end the job (MPI_Abort) after its 2 s timeout. Then (unless --no-bandwidth) 64 MiB from host 0 to
host 1 through HostLink and through MPI_Send/MPI_Recv, best of 5 each, printed with their ratio
(GB/s = 1e9 bytes/s); bandwidth is reported, not asserted. Exits 77 (SKIP) with the reason when
the machine cannot run the harness (not root, no `ip netns`, no mpirun).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mpirun_netns  # noqa: E402

failures: list[str] = []


def check(ok: bool, what: str) -> None:
    if not ok:
        failures.append(what)
        print(f"FAILED: {what}")


def run_ok(hosts: mpirun_netns.NetnsHosts, command: list[str], env: dict[str, str],
           timeout: float) -> mpirun_netns.Result:
    result = hosts.mpirun(command, env=env, timeout=timeout)
    mpirun_netns.report(result)
    check(not result.timed_out, f"{' '.join(command)} timed out after {timeout:g} s")
    check(result.returncode == 0, f"{' '.join(command)}: mpirun exit {result.returncode}")
    for h, host in enumerate(result.hosts):
        check(host.returncode == 0, f"{' '.join(command)}: host {h} exit {host.returncode}")
    return result


def bandwidth(result: mpirun_netns.Result, mode: str) -> float | None:
    m = re.search(rf"^bandwidth {mode} (\d+) ([\d.]+) ([\d.]+)$", result.hosts[0].stdout, re.M)
    check(m is not None, f"host 0 printed no '{mode}' bandwidth")
    return float(m.group(3)) if m else None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", required=True, help="the mpi_link_check binary")
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--no-bandwidth", action="store_true")
    args = parser.parse_args()
    reason = mpirun_netns.unavailable()
    if reason:
        print(f"SKIP: {reason}")
        return mpirun_netns.SKIP
    env = {"OPENBLAS_NUM_THREADS": "1", "COCEMU_TIMEOUT_MS": "20000"}
    with mpirun_netns.NetnsHosts(args.hosts) as hosts:
        r = run_ok(hosts, [args.check, "messages"], dict(env, COCEMU_MPI_CHUNK_BYTES="1000003"),
                   timeout=60)
        for h, host in enumerate(r.hosts):
            for line in ("ok messages", "ok timeout", "ok closed"):
                check(line in host.stdout, f"host {h} did not print '{line}'")
            if h != args.hosts - 1:
                check(f"ok failure: host {h} of {args.hosts} gave up waiting for a message after "
                      f"the failure: host {args.hosts - 1} failed: injected failure for the test"
                      in host.stdout, f"host {h} did not print the failure of host "
                      f"{args.hosts - 1}")
            m = re.search(r"host \d+ sent (\d+) payload bytes to the others", host.stdout)
            check(m is not None, f"host {h} did not say how much it sent")
            if m:
                sent = int(m.group(1))
                tx = r.traffic[h][1]
                check(tx >= sent, f"host {h}'s eth0 sent {tx} B, less than the {sent} B of "
                      "payload it sent: the MPI traffic did not cross the veths")
                print(f"host {h}: payload {sent} B, eth0 tx {tx} B")
        # A host that never ends its link: host 0 ends the job after its timeout (2 s here).
        start = time.monotonic()
        stuck = hosts.mpirun([args.check, "stuck"], dict(env, COCEMU_TIMEOUT_MS="2000"),
                             timeout=60)
        took = time.monotonic() - start
        mpirun_netns.report(stuck)
        check(stuck.returncode != 0 and not stuck.timed_out,
              f"stuck: mpirun exit {stuck.returncode}, timed out {stuck.timed_out}; expected "
              "the job to end with an error")
        check("waited 2000 ms at the end of the program for the other hosts to reach the end"
              in stuck.hosts[0].stderr, "stuck: host 0 did not say why it ended the job")
        check(took < 30, f"stuck: the job took {took:.1f} s to end; expected about 2 s")
        print(f"stuck: the job ended after {took:.1f} s")
        if not args.no_bandwidth:
            link = run_ok(hosts, [args.check, "bandwidth"], env, timeout=60)
            raw = run_ok(hosts, [args.check, "raw"], env, timeout=60)
            for name, res in (("link", link), ("raw", raw)):
                moved = 6 * (64 << 20)  # a warm-up and 5 timed rounds
                check(res.traffic[0][1] >= moved,
                      f"{name}: host 0's eth0 sent {res.traffic[0][1]} B < {moved} B")
            bw_link, bw_raw = bandwidth(link, "link"), bandwidth(raw, "raw")
            if bw_link and bw_raw:
                print(f"64 MiB host 0 -> host 1 over veths, best of 5: HostLink {bw_link:.3f} GB/s, "
                      f"MPI_Send/MPI_Recv {bw_raw:.3f} GB/s, ratio {bw_link / bw_raw:.2f} "
                      "(target >= 0.50)")
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
