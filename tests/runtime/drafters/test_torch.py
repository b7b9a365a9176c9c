"""TorchDrafterBackend: equals the reference DSparkDrafter; the Markov walk is a replaceable attribute."""

from __future__ import annotations

import pytest
import torch

from dspark_trt import load_drafter
from dspark_trt.reference.markov import walk_candidates
from dspark_trt.runtime.drafters.base import backend_class
from dspark_trt.runtime.drafters.torch import TorchDrafterBackend
from dspark_trt.plugins.walk_compare import by_candidate_id
from tests.reference.test_markov_union import union_dense


@pytest.fixture(scope="module")
def drafter(random_pair):
    return load_drafter(random_pair.drafter, target_dir=random_pair.target)


def inputs(drafter, B=3, T=9, seed=0):
    c = drafter.config
    g = torch.Generator().manual_seed(seed)
    taps = torch.randn(B, T, c.num_taps * c.hidden_size, generator=g)
    ctx_len = torch.tensor([T, 4, 1][:B])
    anchor = torch.randint(0, c.vocab_size - 1, (B,), generator=g)
    return taps, ctx_len, anchor


@pytest.mark.parametrize("topk", [None, 16])
@pytest.mark.parametrize("sampling", [False, True])
def test_backend_equals_reference_draft(drafter, topk, sampling):
    backend = TorchDrafterBackend(drafter)
    taps, ctx_len, anchor = inputs(drafter)
    positions = torch.arange(taps.shape[1]).expand(3, -1)
    k, v = backend.context_kv(taps, positions)
    rk, rv = drafter.context_kv(taps, positions)
    assert torch.equal(k, rk) and torch.equal(v, rv)
    kw = dict(topk=topk, temperature=torch.tensor([0.0, 1.0, 0.7]) if sampling else None,
              seed=torch.tensor([1, 2, 3]) if sampling else None)
    got = by_candidate_id(backend.draft(anchor, k, v, ctx_len, **kw))  # CPU kernels: candidates unordered
    want = by_candidate_id(drafter.draft(anchor, k, v, ctx_len, **kw))
    assert torch.equal(got.tokens, want.tokens)
    assert torch.equal(got.cand_ids, want.cand_ids if topk else torch.arange(drafter.config.draft_vocab_size).expand_as(got.cand_ids))
    torch.testing.assert_close(got.cand_logits, want.cand_logits, rtol=1e-5, atol=1e-5)  # fp32, other sum order
    torch.testing.assert_close(got.confidence, want.confidence, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("graphs", ["off", "eager"])
def test_backend_with_the_candidate_union_equals_the_reference_draft(drafter, graphs, caplog):
    backend = TorchDrafterBackend(drafter, graphs=graphs)
    taps, ctx_len, anchor = inputs(drafter)
    k, v = backend.context_kv(taps, torch.arange(taps.shape[1]).expand(3, -1))
    kw = dict(topk=8, temperature=torch.tensor([0.0, 1.0, 0.7]), seed=torch.tensor([1, 2, 3]))
    with caplog.at_level("INFO", logger="dspark.plugins"):
        got = backend.draft(anchor, k, v, ctx_len, markov_topm=4, **kw)
    want = drafter.draft(anchor, k, v, ctx_len, markov_topm=4, **kw)
    assert got.cand_ids.shape == (3, drafter.config.num_draft_tokens, 12) and got.union_width == 4
    assert torch.equal(got.tokens, want.tokens)
    assert torch.equal(got.cand_ids[..., 8:], want.cand_ids[..., 8:])  # the table part, in table order
    Vd = drafter.config.draft_vocab_size  # CPU kernels: top-k part unordered; compare by id
    torch.testing.assert_close(union_dense(got.cand_ids, got.cand_logits, Vd),
                               union_dense(want.cand_ids, want.cand_logits, Vd), rtol=1e-5, atol=1e-5)
    assert int(torch.isfinite(got.cand_logits).sum()) == int(torch.isfinite(want.cand_logits).sum())
    assert bool(torch.isfinite(want.cand_logits[..., 8:]).any())  # the union added candidates
    from dspark_trt.plugins.dispatch import fallback_reason

    # on CUDA the fused union kernel walks it (plugins/union_kernel.py; tests/plugins/test_dispatch.py)
    reason = fallback_reason("cuda", topk=8, rank=8, num_draft_tokens=7, markov_topm=4,
                             logits_dtype=torch.float32, weights_dtype=torch.float32)
    assert reason is None or "Triton is not installed" in reason


def test_walk_fn_is_replaceable(drafter):
    calls = []

    def spy_walk(*args, **kwargs):
        calls.append(kwargs["positions"].clone())
        result = walk_candidates(*args, **kwargs)
        result.tokens = torch.zeros_like(result.tokens)  # visibly different
        return result

    backend = TorchDrafterBackend(drafter)
    taps, ctx_len, anchor = inputs(drafter)
    k, v = backend.context_kv(taps, torch.arange(taps.shape[1]).expand(3, -1))
    backend.walk_fn = spy_walk
    out = backend.draft(anchor, k, v, ctx_len, topk=8, temperature=None, seed=None)
    assert len(calls) == 1 and calls[0].tolist() == (ctx_len + 1).tolist()  # d_1 sits after the anchor
    assert int(out.tokens.abs().sum()) == 0


def test_registry_and_context_manager(random_pair):
    assert backend_class("torch") is TorchDrafterBackend
    with TorchDrafterBackend.from_pretrained(random_pair.drafter, target_dir=random_pair.target, device="cpu") as b:
        assert b.name == "torch" and b.device.type == "cpu" and b.config.num_draft_tokens == 7


def test_default_on_cpu_is_the_numba_kernels_else_the_reference(drafter, monkeypatch):
    pytest.importorskip("numba")
    from dspark_trt.plugins import dispatch
    from dspark_trt.plugins.cpu_walk import cpu_select_candidates, cpu_walk_candidates

    backend = TorchDrafterBackend(drafter)
    assert backend.walk_fn is None  # chosen per round by plugins.dispatch
    c = drafter.config
    assert c.draft_vocab_size * c.markov_rank < dispatch.CPU_KERNEL_MIN_HEAD
    assert backend._auto_impl(16) is dispatch.REFERENCE  # a tiny head: the PyTorch walk, no kernel loading
    monkeypatch.setattr(dispatch, "CPU_KERNEL_MIN_HEAD", 0)  # as if the head were large
    impl = backend._auto_impl(16)
    assert impl.select is cpu_select_candidates and impl.walk is cpu_walk_candidates
    assert backend._auto_impl(None) is dispatch.REFERENCE  # dense: the GEMM is already the fast path
    assert backend._auto_impl(16, 4).walk is cpu_walk_candidates  # the candidate union too
    real_find_spec = dispatch.importlib.util.find_spec
    monkeypatch.setattr(dispatch.importlib.util, "find_spec", lambda n: None if n == "numba" else real_find_spec(n))
    assert backend._auto_impl(16) is dispatch.REFERENCE


@pytest.mark.triton
@pytest.mark.parametrize("sampling", [False, True])
def test_fused_kernel_plugged_into_the_backend_matches_the_reference(drafter, sampling):
    """The wiring CUDA uses (fused_walk_candidates as the backend's walk), run in Triton's CPU interpreter."""
    from dspark_trt.plugins.dispatch import fused_walk_candidates

    backend = TorchDrafterBackend(drafter, walk_fn=fused_walk_candidates)
    taps, ctx_len, anchor = inputs(drafter, B=2)
    k, v = backend.context_kv(taps, torch.arange(taps.shape[1]).expand(2, -1))
    kw = dict(topk=16, temperature=torch.tensor([0.0, 1.0]) if sampling else None,
              seed=torch.tensor([5, 6]) if sampling else None)
    got = backend.draft(anchor, k, v, ctx_len, **kw)
    want = drafter.draft(anchor, k, v, ctx_len, **kw)
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.cand_ids, want.cand_ids)
    torch.testing.assert_close(got.cand_logits, want.cand_logits, rtol=1e-5, atol=1e-5)  # fp32, other sum order
    torch.testing.assert_close(got.confidence, want.confidence, rtol=1e-5, atol=1e-6)
