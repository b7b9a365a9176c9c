"""The SmolLM2 walk-through runs end to end with a 3-step drafter (the path, not the quality).

It runs once per test run (``smollm2_walkthrough`` in tests/conftest.py); tests/models/test_smollm2.py uses its
export, so the two share an xdist group and one worker runs them in a row instead of one waiting on the other.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.onnx, pytest.mark.xdist_group("smollm2")]


def test_smollm2_walkthrough(smollm2_walkthrough):
    assert smollm2_walkthrough.returncode == 0, smollm2_walkthrough.stderr[-3000:]
    out = smollm2_walkthrough.stdout
    assert "identical to the target alone: True" in out
    assert "greedy outputs identical: True" in out
    assert "text: " in out
