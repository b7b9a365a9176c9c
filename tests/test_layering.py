"""The package's layering: lower layers never import upper ones (read from the source, no imports run).

Order, bottom to top: reference → plugins → artifact → runtime → export → testing/serving/bench → cli. ``errors``,
``config``, ``atomic`` and the other top-level modules sit below all of them. A test helper (``testing/``)
builds checkpoints and must not depend on the runtime; a GPU check or benchmark is a tool, not part of the op;
a benchmark builds on the library, never on the CLI (what ``dspark generate`` and ``dspark bench e2e`` share
— their options, the decoder built from them — is ``runtime/options.py``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import dspark_trt

ROOT = Path(dspark_trt.__file__).resolve().parent

FORBIDDEN = {
    "reference": {"plugins", "artifact", "export", "runtime", "testing", "bench", "cli"},
    "plugins": {"artifact", "export", "runtime", "testing", "bench", "cli"},
    "artifact": {"export", "runtime", "testing", "serving", "bench", "cli"},
    "runtime": {"export", "testing", "bench", "cli"},
    "export": {"testing", "bench", "cli"},
    "testing": {"runtime", "bench", "cli"},
    "serving": {"bench", "cli"},
    "bench": {"cli"},
}
# Known, tracked exceptions (remove an entry when its import goes).
KNOWN: set[tuple[str, str]] = set()


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


def test_no_benchmark_imports_the_cli():
    """Not even through a known exception: every module under bench/ is free of dspark_trt.cli."""
    assert not [p.name for p in sorted((ROOT / "bench").rglob("*.py")) if "cli" in _imported_subpackages(p)]


def test_the_checker_sees_relative_imports():
    assert {"errors", "reference"} <= _imported_subpackages(ROOT / "export" / "validate.py")
    assert "artifact" in _imported_subpackages(ROOT / "runtime" / "drafters" / "onnxruntime.py")
