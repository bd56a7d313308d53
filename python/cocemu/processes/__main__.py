"""`python -m cocemu.processes`: a hub for rank processes started by another launcher (torchrun);
rank 0's init_process_group("cocemu") starts it. Prints `cocemu-hub <address>`, serves the
ranks, writes the run's Chrome trace, SVG and summary to --output, and exits 0, or 1 when the
run failed (the error on stderr)."""
import argparse
import os
import sys

import cocemu

from .hub import Hub


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m cocemu.processes")
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--timeout-s", type=float, required=True)
    p.add_argument("--profile", default="ascend-910b")
    p.add_argument("--deterministic", type=int, default=1)
    p.add_argument("--dry-run", type=int, default=0)
    p.add_argument("--schedule-seed", type=int, default=None)
    p.add_argument("--output", default=None)
    p.add_argument("--hosts", type=int, default=0,
                   help="1: ranks on other hosts connect through gloo (hosts.py)")
    a = p.parse_args(argv)
    hub = Hub(a.world_size, a.timeout_s)
    print("cocemu-hub", hub.address[1:], flush=True)
    sys.stdout.close()
    bridges = None
    if a.hosts:
        from .hosts import Bridges
        bridges = Bridges(hub.address, a.world_size, hub.address[1:], a.timeout_s)
    try:
        hub.accept()
        r = cocemu.run(a.world_size, hub.serve, profile=a.profile,
                       deterministic=bool(a.deterministic), schedule_seed=a.schedule_seed,
                       dry_run=bool(a.dry_run), timeout_s=a.timeout_s)
    except BaseException as e:
        print(f"cocemu hub: the run failed: {e}", file=sys.stderr)
        if bridges is not None:
            bridges.finish()
            sys.stderr.flush()
            os._exit(1)  # gloo waits of the bridges' threads end with the process
        return 1
    if a.output:
        os.makedirs(a.output, exist_ok=True)
        r.write_chrome_trace(os.path.join(a.output, "trace.json"))
        r.write_svg(os.path.join(a.output, "timeline.svg"))
        with open(os.path.join(a.output, "summary.txt"), "w") as f:
            f.write(r.summary(0))
            f.write(f"makespan_ns {r.makespan_ns}\n")
    if bridges is not None:
        bridges.finish()  # the last answers reach the ranks on other hosts
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
