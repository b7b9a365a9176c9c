"""The SmolLM2 walk-through runs end to end with a 3-step drafter (the path, not the quality)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.onnx
def test_smollm2_walkthrough(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "smollm2_walkthrough.py"), str(tmp_path / "ex"),
                           "--steps", "3", "--new-tokens", "8", "--bank-prompts", "0"], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "identical to the target alone: True" in out
    assert "greedy outputs identical: True" in out
    assert "text: " in out
