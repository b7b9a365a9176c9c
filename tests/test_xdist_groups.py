"""The suite runs under pytest-xdist with ``--dist loadgroup`` (pyproject.toml): every test marked
``xdist_group("tritonserver")`` runs on one worker, in order, so that one real tritonserver runs at a time and the
two-step ``dspark serve`` test (tests/serving/test_dspark_serve.py) keeps its order. A pytest / pytest-xdist pair
that drops the grouping silently (pytest 9.2 with xdist 3.8: pytest-dev/pytest-xdist#1386; constraints.txt pins
pytest below 9.2) must fail here, not as a flaky server test elsewhere.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.xdist_group("tritonserver")


def test_loadgroup_keeps_a_group_on_one_worker(request):
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run by pytest-xdist with --dist loadgroup")
    # xdist's worker tags a grouped test's node id with its group; the scheduler keeps one tag on one worker
    assert request.node.nodeid.endswith("@tritonserver"), (
        f"pytest-xdist --dist loadgroup did not group {request.node.nodeid!r}: this pytest "
        f"({pytest.__version__}) and pytest-xdist do not work together; install with -c constraints.txt")
