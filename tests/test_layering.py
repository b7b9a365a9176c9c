"""The package's layering: lower layers never import upper ones (read from the source, no imports run).

Order, bottom to top: reference → plugins → export → runtime → synthetic → training → demo → models/serving →
args → bench/tools → cli. ``errors``, ``config``, ``atomic`` and the other top-level modules sit below all of them.
The synthetic checkpoints write files and run no model; the demo pair is built from them and the quick
distiller (``training/quick.py``). ``testing/`` holds helpers for tests only: nothing in the package imports
it, and it must not depend on the runtime. A GPU check or benchmark is a tool, not part of the op; a benchmark
builds on the library, never on the CLI (what ``dspark generate`` and ``dspark bench e2e`` share — their
options, the decoder built from them — is ``args/decoding.py``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import dspark_trt

ROOT = Path(dspark_trt.__file__).resolve().parent

FORBIDDEN = {
    "reference": {"plugins", "export", "runtime", "testing", "bench", "args", "cli"},
    "plugins": {"export", "runtime", "testing", "bench", "args", "cli"},
    "export": {"runtime", "testing", "bench", "args", "cli"},
    "runtime": {"testing", "bench", "args", "cli"},
    "testing": {"runtime", "bench", "args", "cli"},
    "synthetic": {"export", "runtime", "testing", "training", "demo", "models", "serving", "bench", "tools", "args", "cli"},
    "training": {"testing", "demo", "models", "serving", "bench", "tools", "args", "cli"},
    "demo": {"export", "runtime", "testing", "models", "serving", "bench", "tools", "args", "cli"},
    "serving": {"testing", "bench", "args", "cli"},
    "args": {"testing", "bench", "tools", "cli"},
    "bench": {"testing", "cli"},
    "tools": {"testing", "cli"},
    "models": {"testing", "args", "cli"},
    "cli": {"testing"},
}
# Known, tracked exceptions (remove an entry when its import goes): the target graph's validation runs the
# runtime's own targets side by side (transformers' HFTarget vs OnnxRuntimeTarget through a prefill, verifies
# and a rollback), so it checks the graph with the code that will execute it.
KNOWN = {("export/validate_target.py", "runtime")}


def _imported_subpackages(path: Path) -> set[str]:
    """The ``dspark_trt.<name>`` first components that ``path`` imports (absolute or relative)."""
    package = ["dspark_trt", *path.relative_to(ROOT).parent.parts]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            names = ".".join(base + ([node.module] if node.module else [])).split(".")
            if names[0] == "dspark_trt" and len(names) > 1:
                found.add(names[1])
            elif names == ["dspark_trt"]:
                found.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("dspark_trt."))
    return found


def test_no_layer_imports_a_layer_above_it():
    violations = []
    for layer, forbidden in FORBIDDEN.items():
        for path in sorted((ROOT / layer).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for name in sorted(_imported_subpackages(path) & forbidden):
                if (rel, name) not in KNOWN:
                    violations.append(f"{rel} imports dspark_trt.{name}")
    assert not violations, violations


def test_nothing_in_the_product_imports_the_test_helpers():
    """``testing/`` is for tests only: no module outside it imports it, not even through a known exception."""
    assert not [p.relative_to(ROOT).as_posix() for p in sorted(ROOT.rglob("*.py"))
                if p.relative_to(ROOT).parts[0] != "testing" and "testing" in _imported_subpackages(p)]


def test_no_benchmark_imports_the_cli():
    """Not even through a known exception: every module under bench/ is free of dspark_trt.cli."""
    assert not [p.name for p in sorted((ROOT / "bench").rglob("*.py")) if "cli" in _imported_subpackages(p)]


def test_the_checker_sees_relative_imports():
    assert {"errors", "reference"} <= _imported_subpackages(ROOT / "export" / "validate.py")
    assert "base" not in _imported_subpackages(ROOT / "runtime" / "backends" / "scripted.py")
