"""Step 6 of gpu-check: ``pytest -m "tensorrt or gpu"`` over the checkout's ``tests/`` in a child process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

__all__ = ["PYTEST_MARKERS", "PYTEST_DESELECT", "pytest_command", "parse_pytest_summary", "pytest_check",
           "tests_dir", "pytest_step"]

PYTEST_MARKERS = "tensorrt or gpu"
#: the tests pytest leaves out: this check itself (a whole ``gpu-check --quick``, TensorRT engine builds included,
#: repeated inside this run's budget; ``pytest -m gpu`` runs it, and its report assertions hold)
PYTEST_DESELECT = ("tests/tools/test_gpu_check.py::test_gpu_check_quick_passes",)
_SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)")


def checkout_root() -> Path:
    return Path(__file__).resolve().parents[3]


def tests_dir() -> Path:
    return checkout_root() / "tests"


def pytest_command(paths, markers: str = PYTEST_MARKERS) -> list[str]:
    """``python -m pytest PATHS -m MARKERS``, self-contained: the project's addopts (xdist's ``--dist``) replaced,
    so a GPU host without pytest-xdist runs it too."""
    cmd = [sys.executable, "-m", "pytest", *map(str, paths), "-m", markers, "-q", "-p", "no:cacheprovider",
           "-o", "addopts=-ra --strict-markers"]
    for test in PYTEST_DESELECT:
        cmd += ["--deselect", test]
    return cmd


def parse_pytest_summary(output: str) -> dict[str, int]:
    """The counts of pytest's last summary line (``3 passed, 1 skipped in 2.0s`` → {"passed": 3, "skipped": 1})."""
    lines = [line for line in output.splitlines() if re.search(r"\b(passed|failed|skipped|error|deselected)", line)
             and " in " in line]
    counts: dict[str, int] = {}
    for n, what in _SUMMARY.findall(lines[-1] if lines else ""):
        counts["errors" if what.startswith("error") else what] = int(n)
    return counts


def pytest_check(root: Path | None = None, paths=None, timeout: float = 300) -> tuple[str, dict]:
    """Run ``pytest -m "tensorrt or gpu"`` in a child process from the checkout ``root``; fails on a failure,
    an error, or a non-zero exit other than "nothing collected"."""
    root = Path(root) if root is not None else checkout_root()
    paths = paths or [root / "tests"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(pytest_command(paths), cwd=root, capture_output=True, text=True, timeout=timeout, env=env)
    counts = parse_pytest_summary(proc.stdout)
    failing = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    detail = ", ".join(f"{n} {what}" for what, n in counts.items()) or "no summary"
    assert proc.returncode in (0, 5) and not counts.get("failed") and not counts.get("errors"), (
        f"pytest exit {proc.returncode}: {detail}; {failing[0] if failing else proc.stdout.strip()[-200:]}")
    return detail, {"returncode": proc.returncode, "counts": counts, "failing": failing}


def pytest_step(run) -> None:
    """At most 300 s, and never past the budget."""
    timeout = max(30.0, min(300.0, run.budget_left))
    run.checks.run(f"pytest -m \"{PYTEST_MARKERS}\"", lambda: pytest_check(timeout=timeout))
