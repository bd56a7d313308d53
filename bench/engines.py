#!/usr/bin/env python3
"""The three `cocemu train` engines side by side: emulate (rank by rank), model (the step model on
emulated parts) and priced (the step model on priced parts), over a matrix of layouts (dry runs).

    python3 bench/engines.py --cocemu build/cli/cocemu [--big] [--filter TEXT]

Prints, per layout, each engine's iteration time (ms) and the model's and priced's difference
from the emulation (%). The default matrix is the one tests/train/test_engines.cpp asserts on;
--big adds the LLaMA2-7B layouts on two nodes of 910B (minutes of emulation).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SMALL = os.path.join(HERE, "..", "tests", "train", "data", "engines-small.yaml")

MATRIX = os.path.join(HERE, "..", "tests", "train", "data", "engines-matrix.txt")


def matrix(big):
    """(name, flags, bound %) per line of tests/train/data/engines-matrix.txt; --big adds the
    LLaMA2-7B layouts of docs/train.md on two nodes of 910B."""
    base = ["--model", SMALL, "--profile", "ascend-910b", "--nodes", "1"]
    out = []
    with open(MATRIX) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            cols = [c.strip() for c in line.split("|")]
            bound = float(cols[2].split()[1]) if len(cols) > 2 else 2.0
            out.append((cols[0], base + cols[1].split(), bound))
    if big:
        b7 = ["--model", "llama2-7b", "--profile", "ascend-910b", "--nodes", "2"]
        out += [
            ("7b cp16 ring 32k", b7 + ["--tensor-model-parallel-size", "1",
                                       "--context-parallel-size", "16", "--context-parallel-algo",
                                       "megatron_cp_algo", "--seq-length", "32768"], None),
            ("7b tp4 pp2", b7 + ["--tensor-model-parallel-size", "4",
                                 "--pipeline-model-parallel-size", "2"], None),
        ]
    return out


def run(cocemu, flags, engine):
    with tempfile.TemporaryDirectory() as d:
        js = os.path.join(d, "t.json")
        p = subprocess.run([cocemu, "train", "--dry-run", "--iterations", "2", "--engine", engine,
                            "--out-dir", d, "--json", js] + flags,
                           capture_output=True, text=True)
        if p.returncode != 0:
            return None, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "failed"
        with open(js) as f:
            r = json.load(f)
        return r["iteration_ns"] / 1e6, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cocemu", default=os.path.join(HERE, "..", "build", "cli", "cocemu"))
    ap.add_argument("--big", action="store_true")
    ap.add_argument("--filter", default="")
    a = ap.parse_args()
    print(f"{'layout':28} {'emulate':>11} {'model':>11} {'priced':>11} {'model%':>8} {'priced%':>8}")
    for name, flags, _ in matrix(a.big):
        if a.filter not in name:
            continue
        t = {}
        for e in ("emulate", "model", "priced"):
            t[e], err = run(a.cocemu, flags, e)
            if err:
                t[e] = float("nan")
                print(f"  {name} {e}: {err}", file=sys.stderr)
        d = lambda e: 100 * (t[e] / t["emulate"] - 1)
        print(f"{name:28} {t['emulate']:11.3f} {t['model']:11.3f} {t['priced']:11.3f} "
              f"{d('model'):+8.2f} {d('priced'):+8.2f}", flush=True)


if __name__ == "__main__":
    main()
