"""The package's layers, as import contracts (pyproject.toml ``[tool.importlinter]``, docs/architecture.md).

``lint-imports`` (import-linter) reads every import in the package, lazy ones inside functions included, and
checks two contracts: the one-way house (each layer imports only the layers below it; ``testing/`` sits on top,
so nothing in the package imports it) and no import circle between sibling modules or packages at any depth.
CI runs ``lint-imports`` on its own too; here the contracts are run on the package and shown to fail on a copy of
the package with one import that breaks each.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import dspark_trt

ROOT = Path(dspark_trt.__file__).resolve().parent
REPO = ROOT.parent
LINT = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT.is_file(), reason="import-linter not installed (pip install -e '.[test]')")


def lint(repo: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(repo)}  # this tree's dspark_trt, ahead of the installed one
    return subprocess.run([str(LINT), "--no-cache", str(repo / "pyproject.toml")], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_package_keeps_its_import_contracts():
    run = lint(REPO)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Contracts: 2 kept, 0 broken" in run.stdout


def _copy_with(tmp_path: Path, module: str, line: str) -> Path:
    """A copy of the package and its pyproject.toml with ``line`` added inside a function of ``module``."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT, repo / "dspark_trt", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", repo / "pyproject.toml")
    path = repo / "dspark_trt" / module
    path.write_text(path.read_text() + f"\n\ndef _injected():\n    {line}\n")
    return repo


@pytest.mark.parametrize("module, line, broken", [
    ("runtime/decoder.py", "from ..export import pipeline  # noqa: F401", "dspark_trt.runtime.decoder -> dspark_trt.export.pipeline"),
    ("serving/repository.py", "from ..testing import massive  # noqa: F401", "dspark_trt.serving.repository -> dspark_trt.testing.massive"),
    ("plugins/ptx_isa.py", "from . import aot  # noqa: F401", "- .ptx_isa -> .aot"),
])
def test_one_wrong_import_breaks_a_contract(tmp_path, module, line, broken):
    run = lint(_copy_with(tmp_path, module, line))
    assert run.returncode != 0 and "BROKEN" in run.stdout, run.stdout + run.stderr
    assert broken in run.stdout, run.stdout
