"""Shared helpers of the Python tests (run by ctest with PYTHONPATH=build/python)."""
import os
import subprocess
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLES = os.path.join(REPO, "examples")


def run_script(path, cwd, timeout=300, env=None):
    """Runs a Python file with this interpreter in `cwd`; returns its stdout (fails on error)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    p = subprocess.run([sys.executable, path], cwd=cwd, capture_output=True, text=True,
                       timeout=timeout, env=full_env)
    assert p.returncode == 0, f"{path} failed:\n{p.stdout}\n{p.stderr}"
    return p.stdout


def run_binary(path, cwd, timeout=300):
    p = subprocess.run([path], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{path} failed:\n{p.stdout}\n{p.stderr}"
    return p.stdout


@pytest.fixture
def example_bin():
    """The build tree's C++ examples (examples/CMakeLists.txt), given by ctest."""
    d = os.environ.get("COCEMU_EXAMPLE_BIN_DIR")
    if not d:
        pytest.skip("COCEMU_EXAMPLE_BIN_DIR is not set (ctest sets it)")
    return lambda name: os.path.join(d, f"example_{name}")
