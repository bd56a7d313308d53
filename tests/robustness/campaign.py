#!/usr/bin/python3
"""The robustness campaign of issue #34 (not run by CI: minutes, not seconds).

  tests/robustness/campaign.py BUILD_DIR [--inputs] [--numbers] [--issue] [--resources N]

--inputs     every subcommand x every path option x {missing, directory, fifo, /dev/zero, huge,
             alias bomb, deep nesting}
--numbers    every numeric option of every subcommand at its documented limits and just past
             them (ranges read from `cocemu SUB --help`), on a cheap base command
--issue      the commands of issue #34
--resources  limits_child under prlimit --as and --nproc at 8, 64 and 256 ranks, N times each
--verbose    print every case as it ends
(none: all of them, resources 20 times)

Each case's outcome is classified: ok (exit 0 where the input is valid, under 1 GB), clear error
(exit 2, an "error:" message without the developer tail), crash (a signal or another status),
hang (killed at the deadline without using the CPU), slow (killed while working on an input that
must be refused), memory (an error after a peak RSS over 1 GB), silent (exit 0 for an input that
must be refused); and for valid requests the estimates let through: valid, heavy (finished over
1 GB) and valid, long (still working at the deadline). Prints every case that is not ok or a
clear error, and the counts.
"""
import collections
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time

DEADLINE = 10.0
RSS_LIMIT_MB = 1024


def run(argv, env=None, deadline=DEADLINE):
    """(exit, stderr, seconds, peak_rss_mb, cpu_seconds); exit 124 when killed at the deadline."""
    e = dict(os.environ)
    e.setdefault("OPENBLAS_NUM_THREADS", "1")
    e.pop("COCEMU_MAX_SECONDS", None)
    if env:
        e.update(env)
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=e,
                         start_new_session=True)
    killed = False
    err = b""
    while True:
        try:
            _, err = p.communicate(timeout=max(0.01, deadline - (time.monotonic() - t0)))
            break
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            killed = True
    # communicate() reaped the child: its rusage is in RUSAGE_CHILDREN (the max RSS of any child
    # so far, so each case runs in a fresh forked interpreter below).
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    code = 124 if killed else (p.returncode if p.returncode >= 0 else 128 - p.returncode)
    return code, err.decode(errors="replace"), time.monotonic() - t0, ru.ru_maxrss / 1024.0, \
        ru.ru_utime + ru.ru_stime


def isolated(argv, env=None, deadline=DEADLINE):
    """run() in a forked child, so that RUSAGE_CHILDREN's peak is this case's alone."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        res = run(argv, env, deadline)
        os.write(w, repr(res).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 1 << 16)
        if not chunk:
            break
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return eval(data.decode())  # our own repr of a tuple


def classify(res, must_fail, prefix="cocemu: error: ", rss_limit_mb=RSS_LIMIT_MB):
    code, err, secs, rss, cpu = res
    if code == 124:
        if cpu < 1.0:
            return "hang"
        # Killed while working: a valid request the estimates let through, or a bad one that
        # should have been refused.
        return "slow" if must_fail else "valid, long"
    if code == 0:
        if must_fail:
            return "silent"
        return "ok" if rss <= rss_limit_mb else "valid, heavy"
    if rss > rss_limit_mb:
        return "memory"  # an error, after spending more than 1 GB
    # (plan lists the reasons it pruned every candidate on lines of their own.)
    if code == 2 and err.startswith(prefix) and "failed at" not in err:
        return "clear error"
    if code == 2 and err.startswith(prefix):
        return "unclear error"
    return "crash"


VERBOSE = False


class Tally:
    def __init__(self, name):
        self.name, self.counts, self.bad = name, collections.Counter(), []

    def add(self, label, outcome, res):
        self.counts[outcome] += 1
        if VERBOSE:
            print(f"  {outcome:12} {label}: {res[1].strip()[:160]}")
            sys.stdout.flush()
        if outcome not in ("ok", "clear error"):
            self.bad.append((label, outcome, res))

    def report(self):
        total = sum(self.counts.values())
        print(f"\n== {self.name}: {total} cases: " +
              ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items())))
        for label, outcome, res in self.bad:
            code, err, secs, rss, cpu = res
            print(f"  [{outcome}] {label}: exit {code}, {secs:.1f} s, {rss:.0f} MB, "
                  f"cpu {cpu:.1f} s: {err.strip()[:300]}")
        sys.stdout.flush()


def scratch_files(tmp):
    fifo = os.path.join(tmp, "pipe.yaml")
    if not os.path.exists(fifo):
        os.mkfifo(fifo)
    huge = os.path.join(tmp, "huge.yaml")
    with open(huge, "wb") as f:
        f.write(b"# padding\n")
        f.seek(5 << 20)
        f.write(b"\n")
    bomb = "name: bomb\na0: &a0 [x, x, x, x, x, x, x, x, x]\n"
    for i in range(1, 9):
        bomb += f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]\n"
    with open(os.path.join(tmp, "bomb.yaml"), "w") as f:
        f.write(bomb)
    with open(os.path.join(tmp, "deep.yaml"), "w") as f:
        f.write("a: " + "[" * 5000 + "]" * 5000 + "\n")
    return {"missing": os.path.join(tmp, "no-such.yaml"), "directory": tmp, "fifo": fifo,
            "/dev/zero": "/dev/zero", "huge": huge, "alias bomb": os.path.join(tmp, "bomb.yaml"),
            "deep nesting": os.path.join(tmp, "deep.yaml")}


def path_options(tmp):
    out = os.path.join(tmp, "out")
    os.makedirs(out, exist_ok=True)
    attn = "attention --seq 64 --heads 2 --head-dim 16 --cp 2"
    return [
        ("bench --dry-run --out-dir " + out, o) for o in ("--model", "--profile", "--coc-config")
    ] + [
        ("tune -o " + out + "/t.yaml", o) for o in ("--model", "--profile", "--coc-config")
    ] + [
        ("train --dry-run --out-dir " + out, o)
        for o in ("--config", "--model", "--profile", "--coc-config")
    ] + [
        ("plan --model llama2-7b --global-batch 64 --out-dir " + out, "--profile"),
        ("plan --global-batch 64 --out-dir " + out, "--model"),
        ("validate", "--references"),
        (attn + " --dry-run", "--profile"),
        ("collbench --dry-run -n 2 -e 4096", "--profile"),
    ] + [(attn, o) for o in ("--q", "--k", "--v", "--dout")] + [
        (attn + " --mask general", "--mask-file"),
    ]


def output_options(tmp):
    """Output paths: (base command, option, whether it names a folder)."""
    out = os.path.join(tmp, "out")
    attn = "attention --dry-run --seq 64 --heads 2 --head-dim 16 --cp 2"
    return [
        ("mlpbench --m 64 --hidden 64 --ffn 64 --repeats 1 --ranks 2", "--json", False),
        ("collbench --dry-run -n 2 -e 4096", "--json", False),
        (attn, "--json", False), (attn, "--trace", False), (attn, "--svg", False),
        ("tune", "-o", False),
        ("bench --dry-run --out-dir " + out, "--json", False),
        ("train --dry-run --out-dir " + out, "--json", False),
        ("plan --model llama2-7b --global-batch 64 --out-dir " + out, "--json", False),
        ("validate", "--json", False),
        ("bench --dry-run", "--out-dir", True),
        ("train --dry-run", "--out-dir", True),
        ("plan --model llama2-7b --global-batch 64", "--out-dir", True),
    ]


def inputs(cocemu, tmp):
    t = Tally("inputs: path options x bad files")
    files = scratch_files(tmp)
    for base, option in path_options(tmp):
        for kind, path in files.items():
            argv = [cocemu] + base.split() + [option, path]
            res = isolated(argv)
            t.add(f"{kind} as {base.split()[0]} {option}", classify(res, True), res)
    # Outputs: a missing file is created, a regular file or a device overwritten; a folder (for a
    # file) or a file (for a folder) and a named pipe must be refused.
    for base, option, folder in output_options(tmp):
        for kind, path in files.items():
            if kind in ("huge", "alias bomb", "deep nesting"):  # restore the inputs afterwards
                path = os.path.join(tmp, "scratch-" + kind.replace(" ", "-"))
                with open(path, "w") as f:
                    f.write("x\n")
            if kind == "missing" and folder:
                path = os.path.join(tmp, "new-folder")
            must_fail = kind in ("fifo",) or (kind == "directory") != folder and kind != "missing"
            argv = [cocemu] + base.split() + [option, path]
            res = isolated(argv)
            t.add(f"{kind} as output {base.split()[0]} {option}", classify(res, must_fail), res)
    t.report()
    return t


HELP_RANGE = re.compile(r"^\s+(-\w, )?(--[\w-]+)\s+(INT|UINT|FLOAT|INT:INT|UINT:UINT|FLOAT:FLOAT|"
                        r"INT:NUMBER|UINT:NUMBER|FLOAT:NUMBER)?[^\[]*\[([-+\d.e]+) - ([-+\d.e]+)\]")

BASES = {
    "bench": "bench --dry-run --out-dir {out}",
    "tune": "tune -o {out}/t.yaml",
    "collbench": "collbench --dry-run -n 4 -e 65536",
    "attention": "attention --dry-run --seq 64 --heads 2 --head-dim 16 --cp 2",
    "mlpbench": "mlpbench --m 64 --hidden 64 --ffn 64 --repeats 1 --ranks 2",
    "train": "train --dry-run --out-dir {out}",
    "plan": "plan --model llama2-7b --global-batch 64 --out-dir {out}",
    "validate": "validate",
}


def numbers(cocemu, tmp):
    t = Tally("numbers: every numeric option at and past its limits")
    out = os.path.join(tmp, "out")
    os.makedirs(out, exist_ok=True)
    for sub, base in BASES.items():
        helptext = subprocess.run([cocemu, sub, "--help"], capture_output=True, text=True).stdout
        for line in helptext.splitlines():
            m = HELP_RANGE.match(line)
            if not m:
                continue
            opt, lo, hi = m.group(2), m.group(4), m.group(5)
            is_float = "." in lo + hi or "e" in lo + hi
            conv = float if is_float else int
            lo_v, hi_v = conv(float(lo)), conv(float(hi))
            past = [lo_v - (1 if not is_float else abs(lo_v) * 0.5 + 1e-3),
                    hi_v + (1 if not is_float else abs(hi_v) + 1)]
            for v, must_fail in [(lo_v, False), (hi_v, False)] + [(p, True) for p in past] + \
                    [("nan", True), ("text", True), ("", True)]:
                argv = [cocemu] + base.format(out=out).split() + [opt, str(v)]
                res = isolated(argv)
                t.add(f"{sub} {opt} {v}", classify(res, must_fail), res)
    t.report()
    return t


def issue(cocemu, tmp, source):
    t = Tally("issue #34's commands")
    out = " --out-dir " + os.path.join(tmp, "out")
    with open(os.path.join(source, "configs/train/llama2-70b-910b-64nodes.yaml")) as f:
        mbn = f.read().replace("micro_batch_num: 128", "micro_batch_num: 1048576")
    with open(os.path.join(tmp, "mbn.yaml"), "w") as f:
        f.write(mbn)
    with open(os.path.join(tmp, "ar.yaml"), "w") as f:
        f.write("references:\n  - name: all_reduce over 65536 ranks\n    kind: collective\n"
                "    device: h100-sxm\n    op: all_reduce\n    ranks: 65536\n    bytes: 1048576\n"
                "    metric: busbw\n    published: 100\n    source: a test\n")
    cmds = [
        "bench --model llama2-70b" + out, "bench --model llama2-7b" + out,
        "train --model llama2-7b" + out,
        "train --model llama2-70b --nodes 1 --tensor-model-parallel-size 8" + out,
        "train --micro-batch-size 1048576" + out,
        "train --model llama2-70b --nodes 8 --tensor-model-parallel-size 8 "
        "--pipeline-model-parallel-size 8" + out,
        "train --dry-run --model llama2-7b --iterations 1000" + out,
        "train --dry-run --config " + os.path.join(tmp, "mbn.yaml") + out,
        "plan --model llama2-7b --nodes 4096 --global-batch 4096" + out,
        "plan --model llama2-70b --nodes 4096 --global-batch 32768" + out,
        "validate --references " + os.path.join(tmp, "ar.yaml"),
        "attention --seq 16777216 --heads 1 --head-dim 1 --cp 1",
        "train --nodes 8" + out,
    ] + [f"{c} /dev/zero" for c in ("train --dry-run --config", "validate --references",
                                     "bench --model", "bench --dry-run --coc-config")]
    for cap in (None, 4 << 30, 6 << 30):
        for c in cmds:
            argv = ([] if cap is None else ["prlimit", f"--as={cap}"]) + [cocemu] + c.split()
            res = isolated(argv, deadline=60.0 if cap is None else DEADLINE)
            # Valid requests may run: the step model's 1000 iterations and the tiny model always;
            # uncapped, what the estimates let through on this machine's memory (plan over 4096
            # nodes, 2^20 micro-batches) is valid too.
            valid = "--iterations 1000" in c or c.startswith("train --nodes 8") or (
                cap is None and ("--nodes 4096" in c or "mbn.yaml" in c))
            label = ("uncapped " if cap is None else f"--as={cap >> 30}G ") + c
            t.add(label, classify(res, not valid), res)
    t.report()
    return t


def threads_of_user(uid):
    n = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/status") as f:
                text = f.read()
        except OSError:
            continue
        u = re.search(r"^Uid:\s+(\d+)", text, re.M)
        th = re.search(r"^Threads:\s+(\d+)", text, re.M)
        if u and th and int(u.group(1)) == uid:
            n += int(th.group(1))
    return n


def resources(child, repeats):
    t = Tally(f"resources: limits_child under prlimit, {repeats} times each")
    for ranks in (8, 64, 256):
        cases = []
        for gib in (1, 2, 4):
            for mode, mib in (("streams", "64"), ("alloc", "256"), ("host", "256"), ("gemm", "64")):
                # The child is asked to allocate up to its limit: "memory" here is a peak RSS
                # over the address-space limit, which the kernel does not allow.
                cases.append((f"--as={gib}G {mode} {ranks}",
                              ["prlimit", f"--as={gib << 30}", child, mode, str(ranks), mib],
                              gib * 1024))
        for extra in (50, 400):
            prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] \
                if os.getuid() == 0 else []
            uid = 65534 if os.getuid() == 0 else os.getuid()
            cases.append((f"--nproc=+{extra} streams {ranks}",
                          prefix + ["prlimit", f"--nproc={threads_of_user(uid) + extra}", child,
                                    "streams", str(ranks)], RSS_LIMIT_MB))
        for label, argv, rss_limit_mb in cases:
            for _ in range(repeats):
                res = isolated(argv, env={"COCEMU_TIMEOUT_MS": "30000"}, deadline=60.0)
                # A case the limit leaves room for may finish: exit 0 is ok (not "silent").
                t.add(label, classify(res, False, prefix="limits_child: error: ",
                                      rss_limit_mb=rss_limit_mb), res)
    t.report()
    return t


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    build = sys.argv[1]
    cocemu = os.path.join(build, "cli/cocemu")
    child = os.path.join(build, "tests/limits_child")
    source = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    global VERBOSE
    VERBOSE = "--verbose" in sys.argv
    parts = set(a for a in sys.argv[2:] if a.startswith("--") and a != "--verbose")
    repeats = 20
    if "--resources" in sys.argv:
        i = sys.argv.index("--resources")
        if i + 1 < len(sys.argv) and sys.argv[i + 1].isdigit():
            repeats = int(sys.argv[i + 1])
    everything = not parts
    tallies = []
    with tempfile.TemporaryDirectory() as tmp:
        if everything or "--inputs" in parts:
            tallies.append(inputs(cocemu, tmp))
        if everything or "--numbers" in parts:
            tallies.append(numbers(cocemu, tmp))
        if everything or "--issue" in parts:
            tallies.append(issue(cocemu, tmp, source))
        if everything or "--resources" in parts:
            tallies.append(resources(child, repeats))
    total = collections.Counter()
    for t in tallies:
        total.update(t.counts)
    print("\n== all: " + ", ".join(f"{k} {v}" for k, v in sorted(total.items())))
    bad = sum(v for k, v in total.items()
              if k not in ("ok", "clear error", "valid, heavy", "valid, long"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
