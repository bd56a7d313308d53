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


def build_dir():
    """The build tree whose module runs (ctest sets COCEMU_BUILD_DIR)."""
    d = os.environ.get("COCEMU_BUILD_DIR")
    if not d:
        pytest.skip("COCEMU_BUILD_DIR is not set (ctest sets it)")
    return d


@pytest.fixture
def example_bin():
    """The build tree's C++ examples (examples/CMakeLists.txt)."""
    d = build_dir()
    return lambda name: os.path.join(d, "examples", f"example_{name}")


@pytest.fixture
def docs_examples():
    """The C++ examples docs/ shows, as built by tests/CMakeLists.txt."""
    path = os.path.join(build_dir(), "tests", "docs_examples")
    if not os.path.exists(path):
        pytest.skip(f"{path} is not built")
    return path
