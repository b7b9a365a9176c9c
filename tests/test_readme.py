"""The README's two commands are the contract with a new user: keep them true."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_ci_runs_the_readme_test_command():
    test_command = readme_commands()[1]
    assert "pytest" in test_command
    ci_lines = [line for line in (ROOT / ".ci/run").read_text().splitlines() if line and not line.startswith("#")]
    assert test_command in ci_lines


def test_readme_main_command_pins_torch_through_the_constraints():
    main_command = readme_commands()[0]
    assert "-c constraints.txt" in main_command
    assert "torch==2.13.0" in (ROOT / "constraints.txt").read_text()


def test_readme_main_command_is_the_export_of_the_embedded_pair():
    assert "dspark-export --topk 512" in readme_commands()[0]


@pytest.mark.parametrize("script, expect", [("draft_one_round.py", "top-k  tokens:"),
                                            ("speculative_generate.py", "identical to the target alone: True")])
def test_examples_run(tmp_path, script, expect):
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / script), str(tmp_path / "ex")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert expect in proc.stdout
