"""Shared fixtures and capability gates (markers are declared in pyproject.toml).

Tests marked ``gpu``, ``tensorrt``, ``rtx``, ``triton`` or ``onnx`` are skipped automatically when the
capability is missing, so the CPU suite passes on a machine without a GPU or TensorRT.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import pytest
import torch

# Without CUDA, Triton kernels run in Triton's CPU interpreter. `triton.jit` reads TRITON_INTERPRET when a
# kernel module is imported, so it is set here, before any test module can import triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@functools.cache
def have_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


@functools.cache
def have_tensorrt() -> bool:
    try:
        import tensorrt  # noqa: F401
    except Exception:  # the PyPI stub fails in many ways
        return False
    return True


GATES = {
    "gpu": (lambda: torch.cuda.is_available(), "no CUDA device"),
    "tensorrt": (have_tensorrt, "TensorRT not importable"),
    "rtx": (lambda: have_module("tensorrt_rtx"), "TensorRT-RTX not installed"),
    "triton": (lambda: have_module("triton"), "OpenAI Triton not installed"),
    "onnx": (lambda: have_module("onnx") and have_module("onnxruntime"), "onnx/onnxruntime not installed"),
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        for marker, (available, reason) in GATES.items():
            if marker in item.keywords and not available():
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """The default tiny DeepSeek-format drafter + Qwen3 target (written once per session)."""
    from dspark_trt.testing import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "pair", seed=0)
