"""torch's own distributed API tests (DistributedTest._DistTestBase of the installed torch) with
backend cocemu (R-PY-15): each passes, skips (a CUDA test, or torch's own skip for a backend other
than gloo/nccl), or fails as conformance/listed.txt says, with its reason; a listed test that
passes fails here until it is removed from the list. The harness: conformance/harness.py."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest")  # torch.testing._internal needs it (python/requirements.txt)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "conformance"))
import harness  # noqa: E402

NAMES = harness.test_names()
LISTED = harness.listed()


@pytest.fixture(scope="module")
def results():
    return harness.run_all(NAMES)


def test_every_listed_test_exists_and_has_a_reason():
    assert sorted(set(LISTED) - set(NAMES)) == []
    assert all(reason for reason in LISTED.values())


@pytest.mark.parametrize("name", NAMES)
def test_distributed_test(name, results):
    kind, detail, _ = results[name]
    if name in LISTED:
        assert kind == "fail", f"{name} is listed ({LISTED[name]}) but its outcome now is " \
                               f"{kind}: remove it from conformance/listed.txt"
        pytest.xfail(LISTED[name])
    if kind == "skip":
        pytest.skip(detail)
    assert kind == "pass", detail
