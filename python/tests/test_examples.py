"""The README's examples: the issue's exact program, examples/python/*.py, and the same programs
in C++ giving the same modeled timeline to the nanosecond (R-PY-4)."""
import importlib.util
import json
import os
import subprocess

import numpy as np

import cocemu
from conftest import EXAMPLES, run_binary, run_script


def test_issue_example_as_written():
    def body(rank):
        x = rank.zeros((1024,), "f32"); x[:] = rank.id + 1
        cocemu.all_reduce(rank.world, x)          # async_op=False: as torch.distributed
        rank.synchronize()
        return float(x[0])
    r = cocemu.run(8, body)                       # r.returns == [36.0] * 8, r.makespan_ns > 0
    assert r.returns == [36.0] * 8
    assert r.makespan_ns > 0


def test_quickstart_python_prints_and_writes(tmp_path):
    out = run_script(os.path.join(EXAMPLES, "python", "quickstart.py"), tmp_path)
    assert out.splitlines()[0] == "x[0] = 36 on every rank"
    assert "modeled time" in out
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert any(e.get("name", "").startswith("all_reduce") for e in trace["traceEvents"])
    assert (tmp_path / "timeline.svg").read_text().startswith("<svg")


def modeled_lines(text):
    """The lines with modeled times: host wall times differ from run to run."""
    return [line.split(" (host wall")[0] for line in text.splitlines()]


def test_quickstart_same_nanoseconds_as_cpp(tmp_path, example_bin):
    (tmp_path / "py").mkdir()
    (tmp_path / "cpp").mkdir()
    py = run_script(os.path.join(EXAMPLES, "python", "quickstart.py"), tmp_path / "py")
    cpp = run_binary(example_bin("quickstart"), tmp_path / "cpp")
    assert modeled_lines(py) == modeled_lines(cpp)
    assert (tmp_path / "py" / "trace.json").read_bytes() == (tmp_path / "cpp" / "trace.json").read_bytes()
    assert (tmp_path / "py" / "timeline.svg").read_bytes() == (tmp_path / "cpp" / "timeline.svg").read_bytes()


def test_overlap_same_nanoseconds_as_cpp(tmp_path, example_bin):
    (tmp_path / "py").mkdir()
    (tmp_path / "cpp").mkdir()
    py = run_script(os.path.join(EXAMPLES, "python", "overlap.py"), tmp_path / "py")
    cpp = run_binary(example_bin("overlap"), tmp_path / "cpp")
    assert py == cpp
    assert "chunked result equal to serial: yes" in py
    serial = float(py.split("serial ")[1].split(" us")[0])
    chunked = float(py.split("chunked (P = 4) ")[1].split(" us")[0])
    assert chunked < serial  # the later chunks' transfers hide behind the matmuls
    assert (tmp_path / "py" / "overlap.json").read_bytes() == (tmp_path / "cpp" / "overlap.json").read_bytes()
    names = {e["name"] for e in json.loads((tmp_path / "py" / "overlap.json").read_text())["traceEvents"]
             if "name" in e}
    for c in range(1, 5):
        assert f"matmul[{c}/4]" in names
        assert any(n.startswith(f"all_gather[{c}/4]") for n in names)


def test_overlap_unit_test_same_nanoseconds_as_the_cpp_one(docs_examples):
    """examples/python/test_overlap.py, the Python twin of docs/examples/overlap_test.cpp."""
    spec = importlib.util.spec_from_file_location(
        "example_test_overlap", os.path.join(EXAMPLES, "python", "test_overlap.py"))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.test_same_bits_as_serial()
    serial, chunked = example.modeled_ns(1), example.modeled_ns(4)
    assert chunked < serial
    cpp = subprocess.run([docs_examples, "--gtest_filter=ChunkedMatmulAllReduce.*"],
                         capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    assert cpp.returncode == 0, cpp.stdout + cpp.stderr
    assert f"modeled: serial {serial / 1e3:.1f} us, 4 chunks {chunked / 1e3:.1f} us" in cpp.stdout
