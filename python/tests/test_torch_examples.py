"""docs/pytorch.md's example (examples/python/test_torch_overlap.py) runs and is the file the
page shows; cocemu.torch without torch, and with a torch older than 2.1, fails clearly."""
import importlib.util
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
import cocemu.torch as ct  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
EXAMPLE = os.path.join(ROOT, "examples", "python", "test_torch_overlap.py")


def test_docs_example_runs():
    spec = importlib.util.spec_from_file_location("example_torch_overlap", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.test_same_bits_as_serial()
    example.test_four_chunks_hide_communication()


def test_docs_page_shows_the_example_file():
    page = open(os.path.join(ROOT, "docs", "pytorch.md")).read()
    code = open(EXAMPLE).read()
    assert code.strip() in page


def test_without_torch_cocemu_torch_fails_at_import_and_cocemu_works():
    script = ("import sys; sys.modules['torch'] = None\n"
              "import cocemu\n"
              "try:\n"
              "    import cocemu.torch\n"
              "except ImportError as e:\n"
              "    print('ImportError:', e)\n")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert "cocemu.torch needs PyTorch" in p.stdout and "python3-torch" in p.stdout


def test_torch_older_than_2_1_is_refused():
    from cocemu.torch import _torch2
    for old in ("1.13.0a0", "2.0.1"):
        with pytest.raises(ImportError, match=f"torch {old} is not supported .*>= 2.1"):
            _torch2.check_version(old)
    for ok in ("2.1.0", "2.13.0+cpu", "3.0.0"):
        _torch2.check_version(ok)
    with pytest.raises(ImportError, match="cannot read the torch version 'x.y'"):
        _torch2.check_version("x.y")


def test_schedule_seed_does_not_change_bits_or_times():
    import torch.distributed as dist

    def fn():
        x = torch.full((64, 32), float(dist.get_rank() % 3))
        w = dist.all_reduce(x, async_op=True)
        y = torch.ones(32, 32) @ torch.ones(32, 32)
        w.wait()
        return x @ y
    a, b = ct.run(fn, world_size=4), ct.run(fn, world_size=4, schedule_seed=11)
    assert all(torch.equal(p, q) for p, q in zip(a.returns, b.returns))
    assert a.makespan_ns == b.makespan_ns


TORCHRUN_EXAMPLE = os.path.join(ROOT, "examples", "python", "test_torchrun_tp.py")


def test_torchrun_example_passes_on_every_rank_process_and_is_on_the_page():
    page = open(os.path.join(ROOT, "docs", "pytorch.md")).read()
    assert open(TORCHRUN_EXAMPLE).read().strip() in page
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "4", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        TORCHRUN_EXAMPLE], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert p.stdout.count("2 passed") == 4
