"""Install instructions that work from a clone: dspark-trt is not published on PyPI, so no document or message
tells a user to ``pip install dspark-trt``; each job has its extra (export, serve, bench; all for development),
every extra a document names exists, and a missing package's hint names the clone this package runs from."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from dspark_trt import optional

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]

#: ``pip install`` whose first requirement is the package by name (what only a published package allows)
BY_NAME = re.compile(r"pip install\s+(?:-\S+\s+)*['\"]?dspark-trt\b")


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def sources() -> list[Path]:
    return sorted((ROOT / "dspark_trt").rglob("*.py")) + sorted((ROOT / "examples").rglob("*.py"))


def test_nothing_installs_the_unpublished_package_by_name():
    found = [f"{path.relative_to(ROOT)}: {m.group(0)}" for path in documents() + sources()
             for m in BY_NAME.finditer(path.read_text())]
    assert not found, f"{found} (install from the clone: pip install -e '.[EXTRA]')"


def test_each_job_has_its_extra_and_every_extra_named_exists():
    extras = lambda name: set(re.findall(r"dspark-trt\[([a-z0-9_,]+)\]", " ".join(EXTRAS[name]))[0].split(","))  # noqa: E731
    assert extras("export") == {"kernels", "rtx"}  # the README's export: PTX and TensorRT-RTX engines
    assert any(r.startswith("matplotlib") for r in EXTRAS["bench"]) and "cpu" in extras("bench")
    assert any(r.startswith("tritonclient") for r in EXTRAS["serve"])
    assert extras("all") == set(EXTRAS) - {"all", "interop"}  # interop pins an older transformers (tests/interop)
    named = set()
    for path in documents():
        for group in re.findall(r"\.\[([a-z0-9_,]+)\]", path.read_text()):
            named.update(group.split(","))
    for path in sources():
        named.update(re.findall(r"pip_install\(['\"]([a-z0-9_]+)['\"]\)", path.read_text()))
    assert named and named <= set(EXTRAS), sorted(named - set(EXTRAS))


def test_the_readme_names_an_install_for_each_job():
    readme = (ROOT / "README.md").read_text()
    for extra in ("export", "serve", "bench", "all"):
        assert f"pip install -c constraints.txt -e '.[{extra}]'" in readme, extra
    assert "not published on PyPI" in readme


def test_a_missing_package_names_this_clone(monkeypatch):
    assert optional.source_tree() == ROOT  # the tests run from the checkout
    assert optional.install_hint("starlette") == f"pip install -e '{ROOT}[serve]'"
    assert optional.install_hint("matplotlib.pyplot") == f"pip install -e '{ROOT}[bench]'"
    assert optional.install_hint("onnx").startswith("pip install onnx ")  # a core dependency: by its own name
    monkeypatch.setattr(optional, "source_tree", lambda: None)  # a copy installed into site-packages
    assert optional.install_hint("starlette") == "pip install '<your dspark-trt clone>[serve]'"
