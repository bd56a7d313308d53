#!/usr/bin/env python3
"""Runs a command on H emulated hosts: `mpirun -n H` with MPI process h inside network namespace h.

Layout: H namespaces `<prefix>-h<i>`, each with one interface `eth0` at 10.78.0.<i+1>/24, joined by a
bridge `br0` in a namespace of its own (`<prefix>-br`), so nothing of the machine's own network is
touched. mpirun runs in the bridge's namespace (10.78.0.254 on br0) with a host file naming the H
namespaces, and its remote shell is a script that runs Open MPI's daemon (orted) in the named
namespace, with that name as its hostname (its own UTS namespace: daemons sharing the machine's
hostname share per-host files of Open MPI and sometimes failed to start). So each host is what
a real one is: its daemon reaches mpirun over TCP across the bridge, its process reaches its own
daemon's PMIx server on its own loopback, and MPI traffic can only take eth0: the TCP BTL
(`btl self,tcp`, no shared memory) on 10.78.0.0/24 with the ob1 PML (not UCX, which picks its own
transports). (`-n 1 ip netns exec nsH cmd` per host does not work: the processes cannot reach
mpirun's PMIx server on the root namespace's loopback.) The byte counters of each eth0 are read
before and after, so a test can check that the traffic crossed the veths.

As a module:  with NetnsHosts(2) as hosts: result = hosts.mpirun(["prog", "arg"])
              result.returncode, result.hosts[h].stdout / .stderr / .returncode,
              result.traffic[h] = (rx_bytes, tx_bytes) of host h's eth0 during the run
As a CLI:     python3 tests/multihost/mpirun_netns.py --hosts 2 -- build/cli/cocemu train ...
              prints each host's output and traffic, exits with mpirun's exit code.

Needs root, `ip netns` (iproute2, a kernel with network namespaces, veth and bridge) and mpirun
(Debian: openmpi-bin); without them `unavailable()` says which is missing, and the CLI exits with
SKIP (77) after saying so. The namespaces are always removed, also after a failure or a timeout.
Python standard library only.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SKIP = 77
SUBNET = "10.78.0.0/24"
LAUNCHER = "10.78.0.254"  # mpirun's address, on the bridge


class Unavailable(RuntimeError):
    """This machine cannot run the harness; the message says why."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise Unavailable(f"`ip {' '.join(args)}` failed ({p.returncode}): {p.stderr.strip()}")
    return p


def unavailable() -> str | None:
    """Why the harness cannot run here (not root, no `ip netns`, no mpirun), or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces); running as uid %d" % os.geteuid()
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    if shutil.which("mpirun") is None:
        return "mpirun is not installed (Debian: apt-get install openmpi-bin libopenmpi-dev)"
    probe = f"cocemu-probe-{os.getpid()}"
    p = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        return f"`ip netns add` failed: {p.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return None


@dataclasses.dataclass
class HostOutput:
    stdout: str
    stderr: str
    returncode: int | None  # None: the process never ended (killed with the run)


@dataclasses.dataclass
class Result:
    returncode: int  # mpirun's; -signal after a timeout
    timed_out: bool
    mpirun_output: str  # what mpirun itself printed (its errors, the job's abort)
    hosts: list[HostOutput]
    traffic: list[tuple[int, int]]  # per host: (rx_bytes, tx_bytes) of eth0 during the run
    command: list[str]  # the mpirun command line


class NetnsHosts:
    """H network namespaces joined by a bridge; removed on exit from the `with` block."""

    def __init__(self, n_hosts: int, prefix: str | None = None):
        if n_hosts < 1 or n_hosts > 250:
            raise ValueError(f"hosts={n_hosts}; allowed: 1..250")
        self.n_hosts = n_hosts
        self.prefix = prefix or f"cocemu{os.getpid()}"
        self.bridge_ns = f"{self.prefix}-br"
        self.names = [f"{self.prefix}-h{h}" for h in range(n_hosts)]
        self.addresses = [f"10.78.0.{h + 1}" for h in range(n_hosts)]
        self._made: list[str] = []

    def __enter__(self) -> NetnsHosts:
        try:
            self._setup()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def _add_ns(self, name: str) -> None:
        _ip("netns", "add", name)
        self._made.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _setup(self) -> None:
        reason = unavailable()
        if reason:
            raise Unavailable(reason)
        self._add_ns(self.bridge_ns)
        _ip("-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.bridge_ns, "addr", "add", f"{LAUNCHER}/24", "dev", "br0")
        _ip("-n", self.bridge_ns, "link", "set", "br0", "up")
        for h, ns in enumerate(self.names):
            self._add_ns(ns)
            port = f"h{h}"
            _ip("-n", self.bridge_ns, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                "netns", ns)
            _ip("-n", self.bridge_ns, "link", "set", port, "master", "br0")
            _ip("-n", self.bridge_ns, "link", "set", port, "up")
            _ip("-n", ns, "addr", "add", f"{self.addresses[h]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")

    def remove(self) -> None:
        """Ends every process left in the namespaces and deletes them (idempotent)."""
        for ns in reversed(self._made):
            pids = _ip("netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _ip("netns", "del", ns, check=False)
        self._made.clear()

    def counters(self) -> list[tuple[int, int]]:
        """(rx_bytes, tx_bytes) of each host's eth0."""
        out = []
        for ns in self.names:
            stats = []
            for what in ("rx_bytes", "tx_bytes"):
                p = subprocess.run(["ip", "netns", "exec", ns, "cat",
                                    f"/sys/class/net/eth0/statistics/{what}"],
                                   capture_output=True, text=True, timeout=30, check=True)
                stats.append(int(p.stdout))
            out.append((stats[0], stats[1]))
        return out

    def mpirun(self, command: list[str], env: dict[str, str] | None = None,
               timeout: float = 120.0, mpirun_args: list[str] | None = None) -> Result:
        """Runs `command` once in each namespace under one mpirun; waits at most `timeout` s."""
        if not command:
            raise ValueError("command is empty; give the program to run on every host")
        run_env = dict(os.environ)
        run_env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
        run_env.update(env or {})
        with tempfile.TemporaryDirectory(prefix="mpirun-netns-") as out:
            # Each host's process writes its own stdout/stderr files and its exit code.
            wrap = os.path.join(out, "host.sh")
            with open(wrap, "w") as f:
                f.write('#!/bin/sh\nout="%s/$OMPI_COMM_WORLD_RANK"\n'
                        '"$@" >"$out.out" 2>"$out.err"\nrc=$?\necho "$rc" >"$out.rc"\n'
                        'exit "$rc"\n' % out)
            # mpirun's remote shell: "<agent> <host> <orted command line>" runs the daemon in
            # that host's namespace.
            agent = os.path.join(out, "agent.sh")
            with open(agent, "w") as f:
                f.write('#!/bin/sh\nhost="$1"\nshift\nexec ip netns exec "$host" unshare --uts '
                        'sh -c \'hostname "$0" && eval "$1"\' "$host" "$*" '
                        '2>>"%s/agent-$host.log"\n' % out)
            os.chmod(wrap, 0o755)
            os.chmod(agent, 0o755)
            hostfile = os.path.join(out, "hosts")
            with open(hostfile, "w") as f:
                f.writelines(f"{ns} slots=1\n" for ns in self.names)
            argv = ["ip", "netns", "exec", self.bridge_ns, "mpirun", "--hostfile", hostfile,
                    "-n", str(self.n_hosts), "--bind-to", "none", *(mpirun_args or []), wrap,
                    *command]
            for key, value in {
                "plm_rsh_agent": agent, "plm_rsh_no_tree_spawn": "1",
                "oob_tcp_if_include": SUBNET, "btl_tcp_if_include": SUBNET,
                "btl": "self,tcp", "pml": "ob1"}.items():
                run_env[f"OMPI_MCA_{key}"] = value
            before = self.counters()
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=run_env, text=True,
                                    start_new_session=True)
            timed_out = False
            try:
                mpirun_output, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
                    try:
                        os.killpg(proc.pid, sig)
                    except ProcessLookupError:
                        pass
                    try:
                        mpirun_output, _ = proc.communicate(timeout=grace)
                        break
                    except subprocess.TimeoutExpired:
                        continue
                else:
                    mpirun_output = ""
                mpirun_output = (mpirun_output or "") + \
                    f"\nmpirun_netns: timed out after {timeout:g} s; the run was killed\n"
            after = self.counters()
            for ns in self.names:  # what the daemons' launches printed (errors), if anything
                try:
                    with open(os.path.join(out, f"agent-{ns}.log"), errors="replace") as f:
                        text = f.read()
                except FileNotFoundError:
                    continue
                if text.strip():
                    mpirun_output += f"\nmpirun_netns: the launch of {ns}'s daemon printed:\n{text}"

            hosts = []
            for h in range(self.n_hosts):
                def read(ext: str) -> str:
                    try:
                        with open(os.path.join(out, f"{h}.{ext}"), errors="replace") as f:
                            return f.read()
                    except FileNotFoundError:
                        return ""
                rc = read("rc").strip()
                hosts.append(HostOutput(read("out"), read("err"), int(rc) if rc else None))
        traffic = [(a[0] - b[0], a[1] - b[1]) for a, b in zip(after, before)]
        return Result(proc.returncode, timed_out, mpirun_output, hosts, traffic, argv)


def run(n_hosts: int, command: list[str], env: dict[str, str] | None = None,
        timeout: float = 120.0) -> Result:
    """Makes the namespaces, runs `command` on every host, removes them."""
    with NetnsHosts(n_hosts) as hosts:
        return hosts.mpirun(command, env=env, timeout=timeout)


def report(result: Result, out=sys.stdout) -> None:
    """Prints each host's output and traffic, then mpirun's own output."""
    for h, host in enumerate(result.hosts):
        rx, tx = result.traffic[h]
        print(f"=== host {h}: exit {host.returncode}, eth0 rx {rx} B tx {tx} B", file=out)
        if host.stdout:
            print(host.stdout, end="" if host.stdout.endswith("\n") else "\n", file=out)
        if host.stderr:
            print(f"--- host {h} stderr", file=out)
            print(host.stderr, end="" if host.stderr.endswith("\n") else "\n", file=out)
    if result.mpirun_output.strip():
        print("=== mpirun", file=out)
        print(result.mpirun_output, end="", file=out)
    print(f"=== exit {result.returncode}{' (timed out)' if result.timed_out else ''}", file=out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description="Run COMMAND under `mpirun -n HOSTS`, MPI process h in network namespace h "
                    "(10.78.0.h+1 on a bridge); needs root, ip netns and mpirun.")
    parser.add_argument("--hosts", type=int, default=2, help="number of hosts (default 2)")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds before the run is killed (default 600)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --, e.g. -- build/cli/cocemu train ...")
    if args.hosts < 1:
        parser.error(f"--hosts {args.hosts}; allowed: 1 or more")
    reason = unavailable()
    if reason:
        print(f"mpirun_netns: cannot run here: {reason}", file=sys.stderr)
        return SKIP
    start = time.monotonic()
    result = run(args.hosts, command, timeout=args.timeout)
    report(result)
    print(f"=== {time.monotonic() - start:.1f} s", file=sys.stderr)
    return result.returncode if result.returncode >= 0 else 128 - result.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
