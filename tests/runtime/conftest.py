"""Fixtures for the runtime tests: distilled tiny pairs built once per test run (shared by xdist workers)."""

from __future__ import annotations

import os

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models under ``pytest -n 2`` on 2 cores: a second torch thread only waits on a busy core."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def shared_dir(tmp_path_factory):
    """A directory shared by all xdist workers of this run (never across runs)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def build_once(tmp_path_factory, name: str, build):
    """Build ``name`` once per run under a file lock; later callers (other workers) reuse it."""
    from filelock import FileLock

    from dspark_trt.testing import TinyCheckpoint

    root = shared_dir(tmp_path_factory)
    out = root / name
    with FileLock(str(root / f"{name}.lock")):
        if not (out / "drafter" / "config.json").is_file():
            torch.set_num_threads(1)
            build(out)
    return TinyCheckpoint(drafter=out / "drafter", target=out / "target")


@pytest.fixture(scope="session")
def distilled_pair(tmp_path_factory):
    """Anchor-first drafter distilled from a bigram-like tiny target, vocabulary 257 (see write_distilled_pair)."""
    from dspark_trt.testing import write_distilled_pair

    return build_once(tmp_path_factory, "distilled-anchor-first", lambda out: write_distilled_pair(out, seed=0))


@pytest.fixture(scope="session")
def distilled_bonus_pair(tmp_path_factory):
    """The same recipe with the bonus-anchor layout (sample_from_anchor=false)."""
    from dspark_trt.testing import write_distilled_pair

    return build_once(tmp_path_factory, "distilled-bonus-anchor",
                      lambda out: write_distilled_pair(out, seed=1, sample_from_anchor=False))


@pytest.fixture(scope="session")
def random_pair(tmp_path_factory):
    """The default tiny pair (vocabulary 2500, random drafter)."""
    from dspark_trt.testing import write_tiny_checkpoint

    return build_once(tmp_path_factory, "random-qwen3", lambda out: write_tiny_checkpoint(out, seed=0))


def make_decoder(pair, **target_options):
    from dspark_trt.runtime import HFTarget, SpeculativeDecoder
    from dspark_trt.runtime.backends.torch_backend import TorchDrafterBackend

    target = HFTarget.from_pretrained(pair.target, dtype="fp32", device="cpu", **target_options)
    backend = TorchDrafterBackend.from_pretrained(pair.drafter, target_dir=pair.target, dtype="fp32", device="cpu")
    return SpeculativeDecoder(target, backend)


@pytest.fixture(scope="session")
def distilled_decoder(distilled_pair):
    return make_decoder(distilled_pair)


def random_prompts(n: int, vocab: int, *, seed: int, min_len: int = 2, max_len: int = 12, avoid=()) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    allowed = torch.tensor([t for t in range(vocab) if t not in set(avoid)])
    out = []
    for _ in range(n):
        length = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
        out.append(allowed[torch.randint(0, len(allowed), (length,), generator=g)].tolist())
    return out


@pytest.fixture(scope="session")
def small_vocab_pair(tmp_path_factory):
    """Vocabulary 37 (mask 36), a peaky target at T = 1, block 4, distilled drafter: for chi-square tests."""
    from dspark_trt.testing import write_distilled_pair

    return build_once(tmp_path_factory, "distilled-vocab37", lambda out: write_distilled_pair(
        out, seed=2, vocab_size=37, head_scale=6.0, block_size=4))
