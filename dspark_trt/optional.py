"""Packages a command may need beyond torch: which install brings each, and the one-line hint when one is
missing (``MissingDependency``, exit 1) instead of a ``ModuleNotFoundError`` traceback.

``require`` checks up front (before any slow work); the CLI maps any late ``ModuleNotFoundError`` of a package
listed here to the same hint (``cli/common.run_guarded``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from .errors import MissingDependency

__all__ = ["PACKAGES", "available", "install_hint", "missing_dependency", "pip_install", "require", "source_tree"]

#: top-level module → (distribution on PyPI, the dspark-trt extra that installs it; None: a core dependency)
PACKAGES: dict[str, tuple[str, str | None]] = {
    "numpy": ("numpy", None),
    "safetensors": ("safetensors", None),
    "transformers": ("transformers", None),
    "tokenizers": ("tokenizers", None),
    "tqdm": ("tqdm", None),
    "filelock": ("filelock", None),
    "onnx": ("onnx", None),
    "onnxscript": ("onnxscript", None),
    "onnx_ir": ("onnx-ir", None),
    "onnxruntime": ("onnxruntime", None),
    "polygraphy": ("polygraphy", "onnx"),
    "triton": ("triton", "kernels"),
    "numba": ("numba", "cpu"),
    "llvmlite": ("numba", "cpu"),
    "tensorrt_rtx": ("tensorrt-rtx", "rtx"),
    "matplotlib": ("matplotlib", "bench"),
    "cryptography": ("cryptography", "bench"),
    "tritonclient": ("tritonclient", "serve"),
    "grpc": ("grpcio", "serve"),
    "starlette": ("starlette", "serve"),
    "uvicorn": ("uvicorn", "serve"),
    "sse_starlette": ("sse-starlette", "serve"),
    "pydantic": ("pydantic", "serve"),
    "pydantic_core": ("pydantic", "serve"),
    "aiohttp": ("aiohttp", "serve"),
    "prometheus_client": ("prometheus-client", "serve"),
}


def available(module: str) -> bool:
    """Whether ``module`` can be found (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def source_tree() -> Path | None:
    """The clone this ``dspark_trt`` is imported from (its ``pyproject.toml`` beside the package: an editable
    install, or the checkout on PYTHONPATH); None for a copy installed into site-packages."""
    root = Path(__file__).resolve().parents[1]
    try:
        project = (root / "pyproject.toml").read_text()
    except OSError:
        return None
    return root if 'name = "dspark-trt"' in project else None


def pip_install(extra: str) -> str:
    """The command that adds dspark-trt's optional ``extra`` to this environment. dspark-trt is not published
    on PyPI, so it names the clone: this package's own checkout when it runs from one."""
    root = source_tree()
    if root is None:
        return f"pip install '<your dspark-trt clone>[{extra}]'"
    return f"pip install -e '{root}[{extra}]'"


def install_hint(module: str) -> str:
    dist, extra = PACKAGES.get(module.split(".")[0], (module.split(".")[0], None))
    if extra is None:
        return f"pip install {dist} (a dependency of dspark-trt: reinstalling dspark-trt brings it)"
    return pip_install(extra)


def missing_dependency(module: str, purpose: str) -> MissingDependency:
    dist = PACKAGES.get(module.split(".")[0], (module.split(".")[0], None))[0]
    return MissingDependency(f"{purpose} needs the Python package {dist}, which is not installed: {install_hint(module)}")


def require(module: str, purpose: str) -> None:
    """Raise ``MissingDependency`` now when ``module`` is not installed (``purpose``: what needs it)."""
    if not available(module):
        raise missing_dependency(module, purpose)


def from_import_error(error: ModuleNotFoundError, purpose: str = "this command") -> MissingDependency | None:
    """The hint for a ``ModuleNotFoundError`` of a package listed in ``PACKAGES`` (None for any other module:
    that one is a bug and keeps its traceback)."""
    top = (error.name or "").split(".")[0]
    return missing_dependency(top, purpose) if top in PACKAGES else None
