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


@pytest.fixture
def one_thread():
    """Tiny models under ``pytest -n 2`` on 2 cores: a second torch thread mostly waits on a busy core."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def build_once(tmp_path_factory, name: str, build):
    """Build a checkpoint pair ``name`` once per test run, shared by all xdist workers (file lock)."""
    from filelock import FileLock

    from dspark_trt.testing import TinyCheckpoint

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # this run's workers, never older runs
    out = root / name
    with FileLock(str(root / f"{name}.lock")):
        if not (out / "drafter" / "config.json").is_file():
            before = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                build(out)
            finally:
                torch.set_num_threads(before)
    return TinyCheckpoint(drafter=out / "drafter", target=out / "target")


@pytest.fixture(scope="session")
def random_pair(tmp_path_factory):
    """The default tiny pair (vocabulary 2500, random drafter), shared by xdist workers."""
    from dspark_trt.testing import write_tiny_checkpoint

    return build_once(tmp_path_factory, "random-qwen3", lambda out: write_tiny_checkpoint(out, seed=0))


@pytest.fixture(scope="session")
def distilled_pair(tmp_path_factory):
    """Anchor-first drafter distilled from a bigram-like tiny target, vocabulary 257 (``write_distilled_pair``)."""
    from dspark_trt.testing import write_distilled_pair

    return build_once(tmp_path_factory, "distilled-anchor-first", lambda out: write_distilled_pair(out, seed=0))


@pytest.fixture(scope="session")
def distilled_bonus_pair(tmp_path_factory):
    """The same recipe in the bonus-anchor layout (sample_from_anchor=false, N = block_size - 1)."""
    from dspark_trt.testing import write_distilled_pair

    return build_once(tmp_path_factory, "distilled-bonus-anchor",
                      lambda out: write_distilled_pair(out, seed=1, sample_from_anchor=False))


@pytest.fixture(scope="session")
def small_vocab_pair(tmp_path_factory):
    """Vocabulary 37 (mask 36), a peaky target at T = 1, block 4, distilled drafter: for chi-square tests."""
    from dspark_trt.testing import write_distilled_pair

    return build_once(tmp_path_factory, "distilled-vocab37", lambda out: write_distilled_pair(
        out, seed=2, vocab_size=37, head_scale=6.0, block_size=4))


@pytest.fixture(scope="session")
def small_vocab_reduced_pair(tmp_path_factory):
    """As ``small_vocab_pair`` with a reduced draft vocabulary (29 of 37 ids, d2t table)."""
    from dspark_trt.testing import write_distilled_pair

    return build_once(tmp_path_factory, "distilled-vocab37-reduced", lambda out: write_distilled_pair(
        out, seed=3, vocab_size=37, draft_vocab_size=29, head_scale=6.0, block_size=4))
