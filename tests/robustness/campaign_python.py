#!/usr/bin/env python3
"""The bad-input campaign of the Python API (issue #41; not run by CI: minutes, not seconds).

  PYTHONPATH=BUILD/python python tests/robustness/campaign_python.py [--jobs N] [--verbose]
      [-k SUBSTRING] [--list]

Drives `cocemu` (cocemu.run, tensor creation, collectives, point-to-point, streams and events,
groups, fused kernels, cost functions) and `cocemu.torch` (ct.run with torch.distributed calls)
with bad values generated from tables. Each case runs in a forked child (the parent imports
cocemu and torch once) with a wall deadline and an RLIMIT_AS cap, and is classified:

  ok      invalid input: a Python exception whose message names the value seen (and, in
          multi-rank code, the rank); valid input (a control case): returns the right result
  unclear an exception that does not name the value, the rank, or is pybind11's
          "incompatible function arguments"
  silent  returned without an error for an invalid input (or a wrong result for a valid one)
  memory  MemoryError, std::bad_alloc, or a peak RSS over the cap
  hang    still running at the deadline
  crash   the child died of a signal or exited without a report

Prints each case that is not ok with a repro, then the counts; exits 1 if any case is not ok.
"""
import argparse
import collections
import math
import os
import pickle
import re
import resource
import signal
import sys
import time

import numpy as np

import cocemu

try:
    import torch
    import torch.distributed as dist
    import cocemu.torch as ct
except ImportError:  # the torch part is skipped
    torch = None

DEADLINE_S = 60.0  # wall time of one case
RUN_TIMEOUT_S = 3  # timeout_s of the runs (a mismatch or a missing rank fails after it)
AS_EXTRA = 3 << 30  # address space a case may add to the parent's (rank stacks included)
RSS_LIMIT_MB = 2048

Case = collections.namedtuple("Case", "name api n code value valid expect")
# api: "run" (code is a rank body run by cocemu.run(n, ...), `rank` bound), "direct" (code runs
# at top level), "torch" (code is fn's body under ct.run(fn, world_size=n)), "torchrun" (code
# calls ct.run itself). value: the bad value, bound to V. valid: a control case whose code
# asserts its own result. expect: a regex the message must match (default: the value's text).

CASES = []


def case(name, api, code, value=None, n=2, valid=False, expect=None):
    CASES.append(Case(name, api, n, code, value, valid, expect))


# Tables -----------------------------------------------------------------------------------------

NAN, INF = float("nan"), float("inf")
BAD_INDEX = [-1, 2, 7, 2**31, 2**63, 2**64, -2**63 - 1, 1.5, NAN, "0", None, True, [0]]
BAD_COUNT = [-1, -2**63, 2**63, 2**64, 10**30, 1.5, NAN, INF, "4", None, True, [4]]
BAD_FLOAT = [-1.0, NAN, INF, -INF, "1.0", None, [1.0], True]
BAD_FLAG = ["False", "yes", 0, 1, 2, None, 1.0, [True]]
BAD_DTYPE = ["complex", "f128", "", "F32 ", 3, 1.5, np.complex64, object, [np.float32]]
BAD_SHAPE = [(-1,), (2, -1), (10**12,), (2**40, 2**40), (2**63,), (2**64,), (1, 1, 1, 1, 1),
             ("a",), (1.5,), (NAN,), (True,), "abc", 5.5, None, {1: 2}]
BAD_STR = [3, 1.5, ["sum"], ""]  # None: the default; bytes: read as UTF-8 text


def bad_arrays():
    """(label, code building the array, regex of the error)."""
    return [
        ("complex64", "np.zeros(4, np.complex64)", "complex64"),
        ("object", "np.array([1, 'a', None], dtype=object)", "object"),
        ("strided", "np.zeros((4, 4), np.float32)[:, 1]", "contiguous"),
        ("transposed", "np.zeros((3, 4), np.float32).T", "contiguous"),
        ("read-only", "ro(np.zeros(4, np.float32))", "read-only"),
        ("5 dims", "np.zeros((1, 1, 1, 1, 2), np.float32)", "5 dimensions"),
        ("big-endian", "np.zeros(4, '>f4')", "byte order"),
        ("list", "[1.0, 2.0]", "list"),
        ("None", "None", "None"),
        ("str", "'tensor'", "str"),
        ("int", "7", "int"),
        ("torch tensor", "torch.zeros(4) if torch else {}", "Tensor|dict"),
        ("unaligned", "np.frombuffer(bytearray(17), np.uint8)[1:].view(np.float32)", "align"),
        ("float128", "np.zeros(4, np.longdouble)", "float128|longdouble"),
        ("datetime", "np.zeros(4, 'datetime64[s]')", "datetime64"),
        ("structured", "np.zeros(4, [('a', 'f4'), ('b', 'i4')])", r"\[|V8|void|structured"),
    ]


# cocemu.run's own arguments ---------------------------------------------------------------------

for v in [0, -1, 257, 2**31, 2**64, 1.5, NAN, "2", None, True, [2]]:
    case(f"run n_ranks={v!r}", "direct", "cocemu.run(V, lambda rank: None)", v)
case("run fn=3", "direct", "cocemu.run(2, 3)", 3, expect="fn|int")
case("run fn=None", "direct", "cocemu.run(2, None)", None, expect="fn|None")
case("run fn takes no rank", "direct", "cocemu.run(2, lambda: 1)", None,
     expect=r"positional|argument|lambda")
for v in [3, "", "no-such-device", "/dev/zero", "/tmp", "/nonexistent/x.yaml", 1.5, [1]]:
    case(f"run profile={v!r}", "direct", "cocemu.run(1, lambda rank: None, profile=V)", v,
         expect=(re.escape(str(v)) if v not in ("",) else "profile") + "|profile must")
for name in ("deterministic", "dry_run", "record_wall_times"):
    for v in BAD_FLAG:
        case(f"run {name}={v!r}", "direct", f"cocemu.run(1, lambda rank: None, {name}=V)", v,
             expect=name)
for v in [-1, 2**64, 2**63, 1.5, NAN, "1", True, [1]]:
    case(f"run schedule_seed={v!r}", "direct",
         "cocemu.run(1, lambda rank: None, schedule_seed=V)", v)
for v in [0, -1, NAN, INF, 1e10, 1e300, "abc", True, [1]]:
    case(f"run timeout_s={v!r}", "direct", "cocemu.run(1, lambda rank: None, timeout_s=V)", v)
case("run COCEMU_TIMEOUT_MS=abc", "direct",
     "os.environ['COCEMU_TIMEOUT_MS'] = V; cocemu.run(1, lambda rank: None)", "abc",
     expect="COCEMU_TIMEOUT_MS.*abc|abc.*COCEMU_TIMEOUT_MS")
case("run COCEMU_TIMEOUT_MS=-5", "direct",
     "os.environ['COCEMU_TIMEOUT_MS'] = V; cocemu.run(1, lambda rank: None)", "-5",
     expect="COCEMU_TIMEOUT_MS")
case("valid: run 4 ranks", "direct",
     "assert cocemu.run(4, lambda rank: rank.id).returns == [0, 1, 2, 3]", valid=True)

# Tensor creation --------------------------------------------------------------------------------

for fn in ("zeros", "empty"):
    for v in BAD_SHAPE:
        exp = None
        if v in [(10**12,), (2**40, 2**40)]:
            exp = r"needs .*(GiB|TiB)|too large|bytes|more than 2\*\*62 elements"
        case(f"rank.{fn} shape={v!r}", "run", f"rank.{fn}(V, 'f32')", v, expect=exp)
    for v in BAD_DTYPE:
        case(f"rank.{fn} dtype={v!r}", "run", f"rank.{fn}((2, 2), V)", v,
             expect=None if v not in ("",) else "dtype")
    for v in BAD_SHAPE[:6]:
        m = {"zeros": "zeros", "empty": "shape_only"}[fn]
        if m == "shape_only" and v == (10**12,):
            continue  # a shape-only tensor has no storage: valid
        case(f"cocemu.Tensor.{m} shape={v!r}", "direct", f"cocemu.Tensor.{m}(V, 'f32')", v,
             expect=r"needs .*(GiB|TiB)|bytes|too large|2\*\*62|-1|" + re.escape(str(v)))
for lbl, code, exp in bad_arrays():
    case(f"Tensor.from_numpy {lbl}", "direct", f"cocemu.Tensor.from_numpy({code})", lbl,
         expect=exp)
for v in [(-1, 2), (0, 9), (3, 1), (2**63, 2**64), (1.5, 2), ("0", "1"), (None, 1)]:
    case(f"Tensor.rows{v!r}", "run", "cocemu.Tensor.zeros((4, 2), 'f32').rows(*V)", v,
         expect="|".join(re.escape(str(x)) for x in v))
for v in [(3, 3), (-1, 8), (9,), (2**63,), ("a",), (1.5, 8)]:
    case(f"Tensor.reshape{v!r}", "direct",
         "cocemu.Tensor.zeros((4, 2), 'f32').reshape(V)", v)
for v in ["np.zeros(4, np.complex64)", "'x'", "None", "np.zeros(4, 'datetime64[s]')"]:
    # (any real array is valid: converted to float32 first, as documented)
    case(f"to_bf16({v})", "direct", f"cocemu.to_bf16({v})", v,
         expect=r"complex64|str|None|datetime64|'x'")
for v in ["np.zeros(4, np.float32)", "np.zeros(4, np.int16)", "'x'", "None"]:
    case(f"from_bf16({v})", "direct", f"cocemu.from_bf16({v})", v,
         expect=r"float32|int16|str|None|uint16")
for v in BAD_DTYPE:
    case(f"numpy_dtype({v!r})", "direct", "cocemu.numpy_dtype(V)", v,
         expect=None if v != "" else "dtype")
case("valid: rank.zeros", "run",
     "t = rank.zeros((2, 3), 'f32'); assert t.shape == (2, 3) and float(t.sum()) == 0",
     valid=True)

# Collectives: bad tensors, options, roots ----------------------------------------------------

COLLS = {
    "all_reduce": "cocemu.all_reduce(W, {x})",
    "broadcast": "cocemu.broadcast(W, {x}, 0)",
    "reduce": "cocemu.reduce(W, {x}, 0)",
    "all_gather": "cocemu.all_gather(W, {x}, f32(8))",
    "all_gather out": "cocemu.all_gather(W, {x}, f32(4))",
    "reduce_scatter": "cocemu.reduce_scatter(W, f32(2), {x})",
    "reduce_scatter out": "cocemu.reduce_scatter(W, {x}, f32(4))",
    "all_to_all": "cocemu.all_to_all(W, f32(4), {x})",
    "all_to_all out": "cocemu.all_to_all(W, {x}, f32(4))",
    "gather": "cocemu.gather(W, f32(8), {x}, 0)",
    "scatter": "cocemu.scatter(W, {x}, f32(8), 0)",
    "isend/irecv": "(cocemu.isend(W, {x}, 1) if r == 0 else cocemu.irecv(W, {x}, 0)).wait()",
    "send/recv": "cocemu.send(W, {x}, 1) if r == 0 else cocemu.recv(W, {x}, 0)",
}
for coll, tmpl in COLLS.items():
    call = coll.split()[0].split("/")[0]
    for lbl, code, exp in bad_arrays():
        if lbl == "torch tensor" or lbl == "read-only" and coll in (
                "all_gather", "reduce_scatter", "all_to_all", "gather", "scatter", "isend/irecv",
                "send/recv"):
            continue  # a read-only input is valid
        case(f"{coll} tensor={lbl}", "run", tmpl.format(x=code) + "; rank.synchronize()", lbl,
             expect=exp)
# Shapes and dtypes that do not fit, or differ across ranks.
SHAPES = [
    ("all_gather out too small", "cocemu.all_gather(W, f32(4), f32(4))"),
    ("all_gather out f64", "cocemu.all_gather(W, f32(4), np.zeros(8))"),
    ("all_reduce out shape", "cocemu.all_reduce(W, f32(4), f32(5))"),
    ("all_reduce out dtype", "cocemu.all_reduce(W, f32(4), np.zeros(4))"),
    ("reduce_scatter in not divisible", "cocemu.reduce_scatter(W, f32(2), f32(5))"),
    ("all_to_all size odd", "cocemu.all_to_all(W, f32(3), f32(3))"),
    ("all_to_all dtype", "cocemu.all_to_all(W, f32(4), np.zeros(4))"),
    ("all_reduce size per rank", "cocemu.all_reduce(W, f32(4 + r))"),
    ("all_reduce dtype per rank", "cocemu.all_reduce(W, f32(4) if r else np.zeros(4))"),
    ("broadcast size per rank", "cocemu.broadcast(W, f32(4 + r), 0)"),
    ("broadcast root per rank", "cocemu.broadcast(W, f32(4), r)"),
    ("reduce root per rank", "cocemu.reduce(W, f32(4), r)"),
    ("all_reduce op per rank", "cocemu.all_reduce(W, f32(4), op='sum' if r else 'max')"),
    ("all_reduce vs broadcast", "cocemu.all_reduce(W, f32(4)) if r else cocemu.broadcast(W, "
                                "f32(4), 0)"),
    ("all_gather vs all_reduce", "cocemu.all_gather(W, f32(4), f32(8)) if r else "
                                 "cocemu.all_reduce(W, f32(4))"),
    ("barrier vs all_reduce", "cocemu.barrier(W) if r else cocemu.all_reduce(W, f32(4))"),
    ("rank 1 skips all_reduce", "cocemu.all_reduce(W, f32(4)) if r == 0 else None"),
    ("recv nobody sends", "cocemu.recv(W, f32(4), 1 - r)"),
    ("send size != recv size", "cocemu.send(W, f32(4), 1) if r == 0 else cocemu.recv(W, "
                               "f32(8), 0)"),
    ("send dtype != recv dtype", "cocemu.send(W, f32(4), 1) if r == 0 else cocemu.recv(W, "
                                 "np.zeros(4), 0)"),
    ("send to self", "cocemu.send(W, f32(4), r)"),
    ("recv from self", "cocemu.recv(W, f32(4), r)"),
    ("tags differ", "cocemu.send(W, f32(4), 1, tag=1) if r == 0 else cocemu.recv(W, f32(4), "
                    "0, tag=2)"),
    ("rank 1 raises", "cocemu.barrier(W) if r == 0 else (_ for _ in "
                      "()).throw(ValueError('rank 1 gives up'))"),
    ("all_to_all splits sum", "cocemu.all_to_all(W, f32(4), f32(4), output_splits=[1, 1], "
                              "input_splits=[2, 2])"),
    ("all_to_all splits negative", "cocemu.all_to_all(W, f32(4), f32(4), output_splits=[-1, "
                                   "5], input_splits=[2, 2])"),
    ("all_to_all splits length", "cocemu.all_to_all(W, f32(4), f32(4), output_splits=[4], "
                                 "input_splits=[4])"),
    ("all_to_all splits str", "cocemu.all_to_all(W, f32(4), f32(4), output_splits='22', "
                              "input_splits=[2, 2])"),
    ("all_to_all splits huge", "cocemu.all_to_all(W, f32(4), f32(4), output_splits=[2**63, "
                               "2], input_splits=[2, 2])"),
    ("all_to_all splits differ", "cocemu.all_to_all(W, f32(4), f32(4), output_splits=[2, 2], "
                                 "input_splits=[1 + 2 * r, 3 - 2 * r])"),
    ("gather out too small", "cocemu.gather(W, f32(4) if r == 0 else None, f32(4), 0)"),
    ("scatter in too small", "cocemu.scatter(W, f32(4) if r == 0 else None, f32(4), 0)"),
]
for lbl, code in SHAPES:
    exp = None
    if "raises" in lbl:
        exp = "rank 1 gives up"
    case(lbl, "run", code + "; rank.synchronize()", lbl,
         expect=exp or r"all_reduce|all_gather|reduce_scatter|all_to_all|broadcast|reduce|"
                       r"send|recv|gather|scatter|barrier|splits")
ROOTS = {
    "broadcast root": "cocemu.broadcast(W, f32(4), V)",
    "reduce root": "cocemu.reduce(W, f32(4), V)",
    "gather root": "cocemu.gather(W, f32(8), f32(4), V)",
    "scatter root": "cocemu.scatter(W, f32(8), f32(4), V)",
    "send dst": "cocemu.send(W, f32(4), V)",
    "recv src": "cocemu.recv(W, f32(4), V)",
    "isend dst": "cocemu.isend(W, f32(4), V).wait()",
    "irecv src": "cocemu.irecv(W, f32(4), V).wait()",
    "send tag": "cocemu.send(W, f32(4), 1 - r, tag=V) if r == 0 else cocemu.recv(W, f32(4), 0)",
}
for lbl, code in ROOTS.items():
    for v in BAD_INDEX:
        if lbl == "send tag" and v in (2, 7, True):
            continue  # valid tags (True: an int)
        case(f"{lbl}={v!r}", "run", code + "; rank.synchronize()", v)
OPTS = {"op": BAD_STR + ["median", "SUMM"], "algo": BAD_STR + ["star"], "async_op": BAD_FLAG,
        "deterministic": [v for v in BAD_FLAG if v is not None],  # None: the run's setting
        "label": [3, None, ["l"]]}
for opt, values in OPTS.items():
    for v in values:
        if opt in ("async_op", "deterministic") and v in (0, 1):
            pass  # ints are not flags
        case(f"all_reduce {opt}={v!r}", "run", f"cocemu.all_reduce(W, f32(4), {opt}=V)", v,
             expect=None if v != "" else opt)
case("valid: all_reduce", "run",
     "x = f32(4); x[:] = r + 1; cocemu.all_reduce(W, x); rank.synchronize(); "
     "assert (x == 3).all(), x", valid=True)
case("valid: all_reduce op=ReduceOp.MAX", "run",
     "x = f32(4); x[:] = r + 1; cocemu.all_reduce(W, x, op=cocemu.ReduceOp.MAX) "
     "if hasattr(cocemu.ReduceOp, 'MAX') else cocemu.all_reduce(W, x, op='max'); "
     "rank.synchronize(); assert (x == 2).all(), x", valid=True)

# batch_isend_irecv and P2POp
for lbl, code in [
    ("ops=None", "cocemu.batch_isend_irecv(W, None)"),
    ("ops=3", "cocemu.batch_isend_irecv(W, 3)"),
    ("ops=[3]", "cocemu.batch_isend_irecv(W, [3])"),
    ("ops=['x']", "cocemu.batch_isend_irecv(W, ['x'])"),
    ("P2POp op='put'", "cocemu.batch_isend_irecv(W, [cocemu.P2POp('put', f32(4), 1 - r)])"),
    ("P2POp peer=5", "cocemu.batch_isend_irecv(W, [cocemu.P2POp(cocemu.isend, f32(4), 5)])"),
    ("P2POp peer=-1", "cocemu.batch_isend_irecv(W, [cocemu.P2POp(cocemu.isend, f32(4), -1)])"),
    ("P2POp peer='1'", "cocemu.batch_isend_irecv(W, [cocemu.P2POp(cocemu.isend, f32(4), '1')])"),
    ("P2POp tensor=list", "cocemu.batch_isend_irecv(W, [cocemu.P2POp(cocemu.isend, [1.0], 1 - "
                          "r)])"),
    ("P2POp tag=-1", "cocemu.batch_isend_irecv(W, [cocemu.P2POp(cocemu.isend, f32(4), 1 - r, "
                     "-1)])"),
    ("P2POp tag=1.5", "cocemu.batch_isend_irecv(W, [cocemu.P2POp(cocemu.isend, f32(4), 1 - r, "
                      "1.5)])"),
    ("both send", "cocemu.batch_isend_irecv(W, [cocemu.P2POp(cocemu.isend, f32(4), 1 - "
                  "r)]).wait()"),
    ("tuple ('send', 3)", "cocemu.batch_isend_irecv(W, [('send', f32(4))])"),
]:
    case(f"batch_isend_irecv {lbl}", "run", code + "; rank.synchronize()", lbl,
         expect=r"batch_isend_irecv|P2POp|peer|op|tag|send|recv")

# Groups ---------------------------------------------------------------------------------------

for v in [[0, 7], [-1], [0, 0], [], "01", None, [1.5], [True, 1], [2**64], [[0]], 3, [NAN]]:
    case(f"new_group ranks={v!r}", "run", "cocemu.new_group(rank, V)", v,
         expect=None if v != [] else r"\[\]|empty")
case("new_group ranks differ per rank", "run", "cocemu.new_group(rank, [r])", "[r]",
     expect=r"new_group|\[0\]|\[1\]", n=2)
# Creating a group is local (as torch's without its store barrier): a rank that never calls
# new_group leaves the group unused, and the first collective on it names the missing rank.
case("new_group only rank 0 calls, then all_reduce on it", "run",
     "g = cocemu.new_group(rank, [0, 1]) if r == 0 else None; "
     "cocemu.all_reduce(g, f32(4)) if r == 0 else None; rank.synchronize()", "",
     expect="all_reduce")
for v in [NAN, "a", None, 1.5, 2**64, [1]]:
    case(f"split color={v!r}", "run", "cocemu.split(W, V)", v)
for v in [NAN, "a", 1.5, 2**64]:
    case(f"split key={v!r}", "run", "cocemu.split(W, 0, key=V)", v)
for dim in ("tp", "cp", "dp", "pp"):
    for v in [0, -1, 3, 2**64, 1.5, "2", None, True]:
        case(f"make_mesh {dim}={v!r}", "run", f"cocemu.make_mesh(rank, {dim}=V)", v)
case("valid: new_group [0, 1]", "run",
     "g = cocemu.new_group(rank, [0, 1]); x = f32(2); x[:] = 1; cocemu.all_reduce(g, x); "
     "rank.synchronize(); assert (x == 2).all()", valid=True)

# Streams and events ---------------------------------------------------------------------------

for v in [3, None, "compute", 1.5]:
    case(f"set_current_stream({v!r})", "run", "rank.set_current_stream(V)", v)
    case(f"stream.wait({v!r})", "run", "rank.compute_stream.wait(V)", v)
    case(f"stream.wait_stream({v!r})", "run", "rank.compute_stream.wait_stream(V)", v)
for kw in ("work_ns", "flops", "bytes"):
    for v in [-1, NAN, INF, -INF, 1e300, 2**64, "1", True, [1]]:
        case(f"launch {kw}={v!r}", "run", f"rank.compute_stream.launch('op', {kw}=V); "
             "rank.synchronize()", v)
for kw, values in (("dtype", BAD_DTYPE[:6]), ("kind", BAD_STR + ["gpu"]),
                   ("launch", BAD_STR + ["warp"]), ("segment", [3, 1.5, ["s"]])):
    for v in values:
        case(f"launch {kw}={v!r}", "run", f"rank.compute_stream.launch('op', work_ns=10, {kw}=V);"
             " rank.synchronize()", v, expect=None if v != "" else kw)
for v in [3, None, 1.5, ["n"]]:
    case(f"launch name={v!r}", "run", "rank.compute_stream.launch(V, work_ns=10)", v)
    case(f"set_segment({v!r})", "run", "rank.set_segment(V)", v)
for lbl, code in [
    ("launch fn=42", "rank.compute_stream.launch('x', 42)"),
    ("launch fn raises", "rank.compute_stream.launch('x', lambda: 1 / 0, work_ns=1); "
                         "rank.synchronize()"),
    ("other rank's stream", "shared.setdefault(r, rank.compute_stream); cocemu.barrier(W); "
     "shared[1 - r].launch('x', work_ns=1); rank.synchronize()"),
    ("other rank's stream as current", "shared.setdefault(r, rank.compute_stream); "
     "cocemu.barrier(W); rank.set_current_stream(shared[1 - r])"),
    ("nested launch", "rank.compute_stream.launch('n', lambda: rank.compute_stream.launch('x'), "
     "work_ns=1); rank.synchronize()"),
    ("segment name=None", "rank.set_segment(None)"),
]:
    case(lbl, "run", code, lbl, expect=r"stream|event|Event|rank \d|division|fn|segment|launch")
case("valid: event chain", "run",
     "s = rank.comm_stream; s.launch('a', work_ns=100); e = s.record(); "
     "rank.compute_stream.wait(e); rank.synchronize(); assert e.query()", valid=True)

# Fused kernels ----------------------------------------------------------------------------------

FUSED = {
    "matmul_all_reduce": "cocemu.matmul_all_reduce(W, {x}, {w}, {o}{kw})",
    "matmul_reduce_scatter": "cocemu.matmul_reduce_scatter(W, {x}, {w}, {o}{kw})",
    "all_gather_matmul": "cocemu.all_gather_matmul(W, {x}, {w}, {o}{kw})",
}
FUSED_OK = {  # x, w, out that fit (2 ranks)
    "matmul_all_reduce": ("f32(4, 3)", "f32(5, 3)", "f32(4, 5)"),  # out = x · wᵀ
    "matmul_reduce_scatter": ("f32(4, 3)", "f32(5, 3)", "f32(2, 5)"),
    "all_gather_matmul": ("f32(2, 3)", "f32(5, 3)", "f32(4, 5)"),
}
for fk, tmpl in FUSED.items():
    x, w, o = FUSED_OK[fk]
    variants = [
        ("x shape", dict(x="f32(4, 7)")), ("w shape", dict(w="f32(5, 7)")),
        ("out shape", dict(o="f32(9, 9)")), ("x 1-d", dict(x="f32(12)")),
        ("x f64", dict(x="np.zeros((4, 3))")), ("w f64", dict(w="np.zeros((5, 3))")),
        ("out int32", dict(o="np.zeros((4, 5), np.int32)")),
        ("x complex", dict(x="np.zeros((4, 3), np.complex64)")),
        ("x None", dict(x="None")), ("w list", dict(w="[[1.0]]")),
        ("x strided", dict(x="np.zeros((4, 6), np.float32)[:, ::2]")),
        ("bias shape", dict(kw=", bias=f32(7)")), ("bias f64", dict(kw=", bias=np.zeros(5)")),
        ("tile_rows=-1", dict(kw=", tile_rows=-1")),
        ("tile_rows=2**63", dict(kw=", tile_rows=2**63")),
        ("tile_rows=1.5", dict(kw=", tile_rows=1.5")),
        ("tiles_per_step=0", dict(kw=", tiles_per_step=0")),
        ("tiles_per_step=-3", dict(kw=", tiles_per_step=-3")),
        ("tiles_per_step=2**40", dict(kw=", tiles_per_step=2**40")),
        ("deterministic='no'", dict(kw=", deterministic='no'")), ("label=3", dict(kw=", label=3")),
        ("x rows per rank", dict(x=x.replace("f32(", "f32(r + ", 1))),
    ]
    for lbl, over in variants:
        args = dict(x=x, w=w, o=o, kw="")
        args.update(over)
        code = tmpl.format(**args) + "; rank.synchronize()"
        val = over.get("kw", "").lstrip(", ").split("=")[-1] or lbl
        exp = "(?i)" + fk + r".*(x|w|out|bias|tile|shape|dtype|contiguous|deterministic|label|" \
            r"\d)|tile_rows|tiles_per_step|deterministic|label|matmul: .*(f64|i32|c64).*do not fit"
        case(f"{fk} {lbl}", "run", code, val, expect=exp)
    case(f"valid: {fk}", "run", tmpl.format(x=x, w=w, o=o, kw="") + "; rank.synchronize()",
         valid=True)

# Cost functions (no run) ------------------------------------------------------------------------

P = "'ascend-910b'"
COST = {
    "gemm_ns m": f"cocemu.gemm_ns({P}, V, 64, 64)",
    "gemm_ns k": f"cocemu.gemm_ns({P}, 64, 64, V)",
    "gemm_efficiency n": f"cocemu.gemm_efficiency({P}, 64, V, 64)",
    "memory_ns bytes": f"cocemu.memory_ns({P}, V)",
    "attention_ns heads": f"cocemu.attention_ns({P}, V, 128, 128, 64)",
    "attention_ns s_q": f"cocemu.attention_ns({P}, 2, V, 128, 64)",
    "attention_ns d": f"cocemu.attention_ns({P}, 2, 128, 128, V)",
    "unfused_attention_ns s_k": f"cocemu.unfused_attention_ns({P}, 2, 128, V, 64)",
    "collective_ns ranks": f"cocemu.collective_ns({P}, 'all_reduce', V, 1024)",
    "collective_ns numel": f"cocemu.collective_ns({P}, 'all_reduce', 8, V)",
    "collective_ns root": f"cocemu.collective_ns({P}, 'broadcast', 8, 1024, root=V)",
    "fused_kernel_ns m": f"cocemu.fused_kernel_ns({P}, 'matmul_all_reduce', V, 64, 64, 8)",
    "fused_kernel_ns ranks": f"cocemu.fused_kernel_ns({P}, 'matmul_all_reduce', 64, 64, 64, V)",
}
for lbl, code in COST.items():
    for v in BAD_COUNT:
        if "root" in lbl and v in (True,) or "ranks" in lbl and v == [4]:
            continue  # [4]: the group of world rank 4, valid
        case(f"{lbl}={v!r}", "direct", code, v)
FLOATS = {
    "overlapped_ns compute_ns": f"cocemu.overlapped_ns({P}, V, 100.0)",
    "attention_ns visible": f"cocemu.attention_ns({P}, 2, 128, 128, 64, visible=V)",
    "flash_attention_ns flops": f"cocemu.flash_attention_ns({P}, V, 64, 'bf16', 1e6, 128.0)",
    "flash_attention_ns bytes": f"cocemu.flash_attention_ns({P}, 1e9, 64, 'bf16', V, 128.0)",
}
for lbl, code in FLOATS.items():
    for v in BAD_FLOAT:
        case(f"{lbl}={v!r}", "direct", code, v)
for lbl, code in {
    "gemm_ns dtype": f"cocemu.gemm_ns({P}, 64, 64, 64, V)",
    "collective_ns op": f"cocemu.collective_ns({P}, V, 8, 1024)",
    "collective_ns algo": f"cocemu.collective_ns({P}, 'all_reduce', 8, 1024, algo=V)",
    "fused_kernel_ns kind": f"cocemu.fused_kernel_ns({P}, V, 64, 64, 64, 8)",
    "launch_ns kind": f"cocemu.launch_ns({P}, V)",
    "gemm_ns profile": "cocemu.gemm_ns(V, 64, 64, 64)",
}.items():
    for v in BAD_STR + ["nope"]:
        case(f"{lbl}={v!r}", "direct", code, v,
             expect=None if v != "" else r"''|empty|dtype|op|kind|profile|algo")
for lbl, code in [("load_profile", "cocemu.load_profile(V)"),
                  ("load_coc_config", "cocemu.load_coc_config(V)")]:
    for v in ["/dev/zero", "/tmp", "/nonexistent.yaml", "", 3]:
        case(f"{lbl}({v!r})", "direct", code, v, expect=None if v != "" else "path|''|empty")
for v in ["nope", -1.0, NAN, INF, "1", None]:
    case(f"Profile.scaled factor={v!r}", "direct",
         "p = cocemu.load_profile('ascend-910b'); p.scaled(p.scalable_keys()[0], V)"
         if isinstance(v, float) or v in ("1", None) else
         "cocemu.load_profile('ascend-910b').scaled(V, 2.0)", v)
case("valid: gemm_ns", "direct", "assert cocemu.gemm_ns('ascend-910b', 64, 64, 64) > 0",
     valid=True)

# SymmetricBuffer --------------------------------------------------------------------------------

for lbl, code in [
    ("ranks=[0, 5]", "cocemu.SymmetricBuffer.allocate(rank, [0, 5], 16)"),
    ("ranks=[]", "cocemu.SymmetricBuffer.allocate(rank, [], 16)"),
    ("bytes=-1", "cocemu.SymmetricBuffer.allocate(rank, [0, 1], -1)"),
    ("bytes=2**62", "cocemu.SymmetricBuffer.allocate(rank, [0, 1], 2**62)"),
    ("n_flags=-1", "cocemu.SymmetricBuffer.allocate(rank, [0, 1], 16, n_flags=-1)"),
    ("n_flags=2**40", "cocemu.SymmetricBuffer.allocate(rank, [0, 1], 16, n_flags=2**40)"),
    ("put past end", "b = cocemu.SymmetricBuffer.allocate(rank, [0, 1], 16); b.put(1, 8, "
                     "f32(4)); rank.synchronize()"),
    ("put peer=7", "b = cocemu.SymmetricBuffer.allocate(rank, [0, 1], 16); b.put(7, 0, "
                   "f32(1)); rank.synchronize()"),
    ("put offset=-4", "b = cocemu.SymmetricBuffer.allocate(rank, [0, 1], 16); b.put(1, -4, "
                      "f32(1)); rank.synchronize()"),
    ("bytes differ per rank", "cocemu.SymmetricBuffer.allocate(rank, [0, 1], 16 + 16 * r); "
                              "rank.synchronize()"),
]:
    case(f"SymmetricBuffer {lbl}", "run", code, lbl.split("=")[-1],
         expect=r"SymmetricBuffer|symmetric|allocate|put|peer|offset|bytes|flags|rank")

# Handles kept past the run ------------------------------------------------------------------------

for lbl, code in [
    ("rank.zeros", "k.rank.zeros((2,), 'f32')"),
    ("all_reduce on kept group", "cocemu.all_reduce(k.world, np.zeros(2, np.float32))"),
    ("stream.launch", "k.stream.launch('x', work_ns=1)"),
    ("new_group", "cocemu.new_group(k.rank, [0])"),
]:
    case(f"after the run: {lbl}", "direct",
         "import types; k = types.SimpleNamespace(); "
         "cocemu.run(1, lambda rank: k.__dict__.update(rank=rank, world=rank.world, "
         "stream=rank.compute_stream)); " + code, lbl, expect="ended")

# cocemu.torch -----------------------------------------------------------------------------------

TORCH_BAD = [
    ("non-contiguous", "torch.zeros(4, 4)[:, 1]", "contiguous|stride"),
    ("None", "None", "None|NoneType"),
    ("list", "[1.0, 2.0]", "list"),
    ("str", "'x'", "str"),
    ("int", "3", "int"),
    ("numpy", "np.zeros(4, np.float32)", "ndarray|numpy"),
    ("sparse", "torch.zeros(4).to_sparse()", "sparse"),
    ("quantized", "torch.quantize_per_tensor(torch.zeros(4), 0.1, 0, torch.qint8)",
     "qint8|quantized"),
]
TORCH_COLLS = {
    "all_reduce": "dist.all_reduce({x})",
    "broadcast": "dist.broadcast({x}, 0)",
    "reduce": "dist.reduce({x}, 0)",
    "all_gather": "dist.all_gather([torch.zeros(4), torch.zeros(4)], {x})",
    "all_gather_into_tensor": "dist.all_gather_into_tensor(torch.zeros(8), {x})",
    "reduce_scatter_tensor": "dist.reduce_scatter_tensor(torch.zeros(2), {x})",
    "all_to_all_single": "dist.all_to_all_single(torch.zeros(4), {x})",
    "send/recv": "dist.send({x}, 1) if rank == 0 else dist.recv({x}, 0)",
    "isend/irecv": "(dist.isend({x}, 1) if rank == 0 else dist.irecv({x}, 0)).wait()",
}
if torch is not None:
    for coll, tmpl in TORCH_COLLS.items():
        for lbl, code, exp in TORCH_BAD:
            case(f"torch {coll} tensor={lbl}", "torch", tmpl.format(x=code), lbl, expect=exp)
    TSHAPES = [
        ("all_gather list length 3", "dist.all_gather([torch.zeros(4)] * 3, torch.zeros(4))"),
        ("all_gather sizes", "dist.all_gather([torch.zeros(3), torch.zeros(4)], torch.zeros(4))"),
        ("all_gather_into_tensor size", "dist.all_gather_into_tensor(torch.zeros(7), "
                                        "torch.zeros(4))"),
        ("all_gather_into_tensor dtype", "dist.all_gather_into_tensor(torch.zeros(8, "
                                         "dtype=torch.float64), torch.zeros(4))"),
        ("reduce_scatter_tensor size", "dist.reduce_scatter_tensor(torch.zeros(3), "
                                       "torch.zeros(4))"),
        ("all_to_all_single splits sum", "dist.all_to_all_single(torch.zeros(4), "
                                         "torch.zeros(4), [1, 1], [2, 2])"),
        ("all_to_all_single splits negative", "dist.all_to_all_single(torch.zeros(4), "
                                              "torch.zeros(4), [-1, 5], [2, 2])"),
        ("all_to_all list length", "dist.all_to_all([torch.zeros(2)] * 3, [torch.zeros(2)] * 3)"),
        ("all_reduce size per rank", "dist.all_reduce(torch.zeros(4 + rank))"),
        ("all_reduce dtype per rank", "dist.all_reduce(torch.zeros(4, dtype=torch.float64 if "
                                      "rank else torch.float32))"),
        ("all_reduce op per rank", "dist.all_reduce(torch.zeros(4), op=dist.ReduceOp.MAX if "
                                   "rank else dist.ReduceOp.SUM)"),
        ("broadcast src per rank", "dist.broadcast(torch.zeros(4), rank)"),
        ("all_reduce vs broadcast", "dist.all_reduce(torch.zeros(4)) if rank else "
                                    "dist.broadcast(torch.zeros(4), 0)"),
        ("barrier vs all_reduce", "dist.barrier() if rank else dist.all_reduce(torch.zeros(4))"),
        ("rank 1 skips all_reduce", "dist.all_reduce(torch.zeros(4)) if rank == 0 else None; "
                                    "torch.zeros(1)"),
        ("recv nobody sends", "dist.recv(torch.zeros(4), 1 - rank)"),
        ("send size != recv size", "dist.send(torch.zeros(4), 1) if rank == 0 else "
                                   "dist.recv(torch.zeros(8), 0)"),
        ("send dtype != recv dtype", "dist.send(torch.zeros(4), 1) if rank == 0 else "
                                     "dist.recv(torch.zeros(4, dtype=torch.float64), 0)"),
        ("send to self", "dist.send(torch.zeros(4), rank)"),
        ("rank 1 raises", "dist.barrier() if rank == 0 else (_ for _ in "
                          "()).throw(ValueError('rank 1 gives up'))"),
        ("rank 0 raises before all_reduce", "(_ for _ in ()).throw(KeyError('rank 0 key')) if "
                                            "rank == 0 else dist.all_reduce(torch.zeros(4))"),
        ("op as str", "dist.all_reduce(torch.zeros(4), op='sum')"),
        ("op=42", "dist.all_reduce(torch.zeros(4), op=42)"),
        ("new_group ranks out of range", "dist.new_group([0, 5])"),
        ("new_group ranks negative", "dist.new_group([-1, 0])"),
        ("new_group ranks duplicate", "dist.new_group([0, 0])"),
        ("new_group ranks str", "dist.new_group('01')"),
        ("group=3", "dist.all_reduce(torch.zeros(4), group=3)"),
        ("group='world'", "dist.all_reduce(torch.zeros(4), group='world')"),
        ("numerics CPU all_reduce", None),
        ("set_device 99", "torch.npu.set_device(99)"),
        ("Stream priority str", "torch.npu.Stream(priority='high')"),
        ("stream.wait_event(3)", "torch.npu.current_stream().wait_event(3)"),
        ("stream.wait_stream(None)", "torch.npu.current_stream().wait_stream(None)"),
        ("torch.npu.stream(3)", "exec('with torch.npu.stream(3):\\n  pass')"),
        ("event.elapsed_time unrecorded", "torch.npu.Event(enable_timing=True)"
         ".elapsed_time(torch.npu.Event(enable_timing=True))"),
        ("empty huge", "torch.empty(2**40, device=ct.device())"),
        ("empty negative", "torch.empty(-1, device=ct.device())"),
        ("init_process_group twice", "dist.init_process_group('cocemu')"),
        ("all_gather_object unpicklable", "dist.all_gather_object([None, None], lambda: 1)"),
        ("get_rank(group=3)", "dist.get_rank(group=3)"),
        ("ct.segment(3)", "exec('with ct.segment(3):\\n  pass')"),
    ]
    for lbl, code in TSHAPES:
        if code is None:
            continue
        v = {"op=42": 42, "set_device 99": 99, "group=3": 3}.get(lbl, lbl)
        exp = None
        if "raises" in lbl:
            exp = "rank 1 gives up|rank 0 key"
        case(f"torch {lbl}", "torch", code, v, expect=exp or
             r"all_reduce|allreduce|all_gather|allgather|reduce_scatter|all_to_all|alltoall|"
             r"broadcast|reduce|send|recv|barrier|group|split|op|ReduceOp|42|99|device|stream|"
             r"Stream|event|Event|record_stream|Distributed|DDP|size|memory|bytes|negative|"
             r"pickl|segment|process group|-1")
    TSRC = {
        "broadcast src": "dist.broadcast(torch.zeros(4), V)",
        "reduce dst": "dist.reduce(torch.zeros(4), V)",
        "send dst": "dist.send(torch.zeros(4), V)",
        "recv src": "dist.recv(torch.zeros(4), V)",
        "isend dst": "dist.isend(torch.zeros(4), V).wait()",
        "gather dst": "dist.gather(torch.zeros(4), [torch.zeros(4)] * 2 if rank == V else "
                      "None, dst=V)",
        "scatter src": "dist.scatter(torch.zeros(4), [torch.zeros(4)] * 2 if rank == V else "
                       "None, src=V)",
    }
    for lbl, code in TSRC.items():
        for v in [-1, 2, 2**40, 2**64, 1.5, "0", None, NAN]:
            if v is None and lbl == "recv src":
                continue  # any source: valid
            case(f"torch {lbl}={v!r}", "torch", code, v)
    RUNARGS = {
        "world_size": [0, -1, 257, True, "2", 1.5, None, 2**64],
        "numerics": BAD_FLAG, "checked": BAD_FLAG[:4], "record": BAD_FLAG[:4],
        "processes": BAD_FLAG[:4],
        "timeout_s": [0, -1, NAN, INF, 1e10, "abc", True],
        "schedule_seed": [-1, 2**64, 1.5, "1", True],
        "profile": [3, "no-such-device", "/dev/zero", ""],
    }
    for arg, values in RUNARGS.items():
        for v in values:
            case(f"ct.run {arg}={v!r}", "torchrun", f"ct.run(lambda: None, {arg}=V)"
                 if arg != "world_size" else "ct.run(lambda: None, world_size=V)", v,
                 expect=None if v != "" else "profile")
    case("ct.run fn=3", "torchrun", "ct.run(3, world_size=2)", 3, expect="fn|int")
    case("ct.run COCEMU_TIMEOUT_MS=abc", "torchrun",
         "os.environ['COCEMU_TIMEOUT_MS'] = V; ct.run(lambda: None, world_size=2)", "abc",
         expect="COCEMU_TIMEOUT_MS")
    case("ct.run numerics=False CPU all_reduce", "torchrun",
         "r = ct.run(lambda: (lambda x: (dist.all_reduce(x), x.tolist())[1])"
         "(torch.full((4,), dist.get_rank() + 1.0)), world_size=2, numerics=False); "
         "assert r.returns[0] == [3.0] * 4, r.returns", "numerics=False CPU tensor",
         expect=r"cpu|CPU|meta|numerics")
    case("ct.run kept ProcessGroup", "torchrun",
         "import types; k = types.SimpleNamespace(); "
         "ct.run(lambda: k.__dict__.update(g=dist.group.WORLD), world_size=1); "
         "k.g.allreduce([torch.zeros(2)])", "kept group", expect="ended")
    case("valid: torch all_reduce", "torchrun",
         "r = ct.run(lambda: (lambda x: (dist.all_reduce(x), x.tolist())[1])"
         "(torch.full((4,), dist.get_rank() + 1.0)), world_size=2); "
         "assert r.returns[0] == [3.0] * 4, r.returns", valid=True)
    for lbl, code in [
        ("complex all_reduce", "x = torch.full((4,), complex(rank + 1, 1)); dist.all_reduce(x); "
         "assert x.tolist() == [complex(3, 2)] * 4, x"),
        ("requires_grad leaf all_reduce", "x = torch.ones(4, requires_grad=True); "
         "dist.all_reduce(x); assert x.tolist() == [2.0] * 4, x"),
        ("async work waited twice", "x = torch.ones(4); w = dist.all_reduce(x, async_op=True); "
         "w.wait(); w.wait(); assert x.tolist() == [2.0] * 4"),
        ("all_reduce on a group without this rank", "g = dist.new_group([0]); x = torch.ones(4); "
         "dist.all_reduce(x, group=g); assert x.tolist() == [1.0] * 4"),
        ("record_stream cocemu stream", "t = torch.zeros(4); "
         "t.record_stream(torch.npu.current_stream())"),
        ("DDP construct", "torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))"),
    ]:
        case(f"valid: torch {lbl}", "torch", code, valid=True)


# Running a case -----------------------------------------------------------------------------------

def ro(a):
    a.flags.writeable = False
    return a


def f32(*shape):
    return np.zeros(shape, np.float32)


def execute(c):
    env = dict(np=np, cocemu=cocemu, V=c.value, ro=ro, f32=f32, os=os, NAN=NAN, INF=INF,
               torch=torch)
    if torch is not None:
        env.update(dist=dist, ct=ct)
    if c.api == "direct" or c.api == "torchrun":
        exec(c.code, env)
        return None
    if c.api == "run":
        shared = {}

        def body(rank):
            local = dict(env, rank=rank, r=rank.id, W=rank.world, shared=shared)
            exec(c.code, local)
        cocemu.run(c.n, body, timeout_s=RUN_TIMEOUT_S)
        return None
    if c.api == "torch":
        def fn():
            local = dict(env, rank=dist.get_rank())
            exec(c.code, local)
        ct.run(fn, world_size=c.n, timeout_s=RUN_TIMEOUT_S)
        return None
    raise AssertionError(c.api)


def child(c, w):
    """Runs in the forked child: writes (status, type, message, rank) to w."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/status") as f:
        vm = int(re.search(r"^VmSize:\s+(\d+)", f.read(), re.M).group(1)) * 1024
    cap = vm + AS_EXTRA
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else
                                            min(cap, hard), hard))
    try:
        execute(c)
        report = ("returned", "", "", None)
    except BaseException as e:  # noqa: B902 - every exception is a result here
        text = str(e) + "".join("\n" + n for n in getattr(e, "__notes__", []))
        report = ("raised", type(e).__name__, text, getattr(e, "rank", None))
    os.write(w, pickle.dumps(report))
    os._exit(0)


def names_value(v, text):
    if v is None:
        return "None" in text
    if isinstance(v, float):
        if math.isnan(v):
            return "nan" in text.lower()
        if math.isinf(v):
            return "inf" in text.lower()
        return any(s in text for s in {repr(v), str(v), f"{v:g}", f"{v:.6g}", str(int(v))
                                       if v.is_integer() and abs(v) < 1e18 else repr(v)})
    if isinstance(v, type):
        return v.__name__ in text
    if isinstance(v, str) and v == "":
        return "''" in text or '""' in text
    if isinstance(v, (tuple, list)) and any(
            (x is True or x not in (0, 1, 2)) and names_value(x, text) for x in v):
        return True  # the bad element named on its own
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) > 2**53:
        return any(s in text for s in {repr(v), repr(float(v)), f"{float(v):g}"})
    return any(s in text for s in {repr(v), str(v)}) or (
        isinstance(v, (list, tuple)) and re.sub(r"\s", "", str(v)) in re.sub(r"\s", "", text))


def classify(c, report, signo, rss_mb, timed_out):
    if timed_out:
        return "hang", "killed at the deadline"
    if report is None:
        return "crash", f"no report; signal {signo}" if signo else "no report"
    status, etype, text, rank = report
    if rss_mb > RSS_LIMIT_MB:
        return "memory", f"peak RSS {rss_mb:.0f} MB"
    if status == "returned":
        return ("ok", "") if c.valid else ("silent", "returned without an error")
    if c.valid:
        return "silent", f"valid case raised {etype}: {text[:300]}"
    if etype == "MemoryError" or "bad_alloc" in text:
        return "memory", f"{etype}: {text[:300]}"
    if "incompatible function arguments" in text or "incompatible constructor arguments" in text:
        return "unclear", f"{etype}: pybind11's incompatible arguments: {text[:200]}"
    if c.expect is not None:
        named = re.search(c.expect, text) is not None
    else:
        named = names_value(c.value, text)
    if not named:
        return "unclear", f"{etype}: message does not name the value: {text[:300]}"
    if c.api in ("run", "torch") and c.n > 1 and not re.search(r"\brank \d+|rank=\d|rank\d",
                                                                 text):
        return "unclear", f"{etype}: message does not name the rank: {text[:300]}"
    return "ok", ""


def start(c):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            os.setpgid(0, 0)
            sys.stdout.flush()
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            child(c, w)
        finally:
            os._exit(3)
    os.close(w)
    os.set_blocking(r, False)
    return dict(pid=pid, r=r, data=b"", t0=time.monotonic(), case=c)


def _drain(job):
    """Reads what the child has written so far (the pipe is non-blocking)."""
    try:
        while True:
            chunk = os.read(job["r"], 1 << 16)
            if not chunk:
                break
            job["data"] += chunk
    except BlockingIOError:
        pass


def poll(job):
    """None while running, else (outcome, detail, seconds)."""
    _drain(job)
    pid, status, ru = os.wait4(job["pid"], os.WNOHANG)
    timed_out = False
    if pid == 0:
        if time.monotonic() - job["t0"] < DEADLINE_S:
            return None
        os.killpg(job["pid"], signal.SIGKILL)
        pid, status, ru = os.wait4(job["pid"], 0)
        timed_out = True
    _drain(job)
    os.close(job["r"])
    try:
        report = pickle.loads(job["data"]) if job["data"] else None
    except Exception:  # noqa: BLE001 - a torn report is a crash
        report = None
    signo = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
    outcome, detail = classify(job["case"], report, signo, ru.ru_maxrss / 1024.0, timed_out)
    return outcome, detail, time.monotonic() - job["t0"]


def repro(c):
    v = f"V = {c.value!r}\n" if c.value is not None and "V" in c.code else ""
    if c.api == "run":
        return f"{v}def body(rank): r, W = rank.id, rank.world; {c.code}\n" \
               f"cocemu.run({c.n}, body, timeout_s={RUN_TIMEOUT_S})"
    if c.api == "torch":
        return f"{v}def fn(): rank = dist.get_rank(); {c.code}\n" \
               f"ct.run(fn, world_size={c.n}, timeout_s={RUN_TIMEOUT_S})"
    return f"{v}{c.code}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("-k", default=None, help="only the cases whose name holds this")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.pop("COCEMU_TIMEOUT_MS", None)
    cases = [c for c in CASES if a.k is None or a.k in c.name]
    if a.list:
        for c in cases:
            print(c.name)
        print(len(cases), "cases")
        return 0
    counts = collections.Counter()
    bad = []
    pending = list(cases)
    running = []
    t0 = time.monotonic()
    while pending or running:
        while pending and len(running) < max(1, a.jobs):
            running.append(start(pending.pop(0)))
        for job in list(running):
            res = poll(job)
            if res is None:
                continue
            running.remove(job)
            outcome, detail, secs = res
            c = job["case"]
            counts[outcome] += 1
            if a.verbose:
                print(f"  {outcome:8} {secs:5.1f} s  {c.name}  {detail[:200]}", flush=True)
            if outcome != "ok":
                bad.append((c, outcome, detail, secs))
        time.sleep(0.005)
    print(f"\n== cocemu Python API: {len(cases)} cases in {time.monotonic() - t0:.0f} s")
    for c, outcome, detail, secs in bad:
        print(f"\n[{outcome}] {c.name} ({secs:.1f} s): {detail}")
        print("    " + repro(c).replace("\n", "\n    "))
    keys = ["ok", "unclear", "silent", "memory", "hang", "crash"]
    print("\n== counts: " + ", ".join(f"{k} {counts[k]}" for k in keys))
    return 0 if counts["ok"] == len(cases) else 1


if __name__ == "__main__":
    sys.exit(main())
