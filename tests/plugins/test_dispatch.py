"""Choosing the Markov walk for the runtime, and the fused walk's drop-in equivalence with the reference."""

from __future__ import annotations

import logging

import pytest
import torch

from dspark_trt.plugins.dispatch import (REFERENCE, fallback_reason, fused_markov_walk, select_markov_impl,
                                         select_markov_walk)
from dspark_trt.reference.markov import markov_walk
from dspark_trt.plugins.walk_compare import by_candidate_id, compare_walks

CASE = dict(topk=16, rank=8, num_draft_tokens=7, logits_dtype=torch.bfloat16, weights_dtype=torch.bfloat16)


def test_cpu_without_numba_falls_back_to_the_reference_and_says_why(caplog, monkeypatch):
    from dspark_trt.plugins import dispatch

    real_find_spec = dispatch.importlib.util.find_spec
    monkeypatch.setattr(dispatch.importlib.util, "find_spec", lambda n: None if n == "numba" else real_find_spec(n))
    dispatch._log_choice.cache_clear()  # the choice is logged once per distinct case and process
    with caplog.at_level(logging.INFO, logger="dspark.plugins"):
        walk = select_markov_walk("cpu", **{**CASE, "topk": 17})
    assert walk is markov_walk
    assert "reference PyTorch walk" in caplog.text and "Numba is not installed" in caplog.text


def test_cpu_kernels_are_chosen_on_cpu_when_supported():
    pytest.importorskip("numba")
    from dspark_trt.plugins.cpu_walk import cpu_markov_walk, cpu_select_candidates, cpu_walk_candidates

    assert fallback_reason("cpu", **CASE) is None
    assert fallback_reason("cpu", **{**CASE, "draft_vocab_size": 151936, "rank": 256}) is None  # Qwen3-8B's head
    assert select_markov_walk("cpu", **CASE) is cpu_markov_walk
    impl = select_markov_impl("cpu", **CASE)
    assert (impl.select, impl.walk) == (cpu_select_candidates, cpu_walk_candidates)
    assert select_markov_walk("cpu", **CASE, use_kernel=False) is markov_walk
    assert select_markov_impl("mps", **CASE) is REFERENCE


@pytest.mark.parametrize("change, why", [
    (dict(topk=None), "dense Markov head"),
    (dict(weights_dtype=torch.float16), "float16"),
    (dict(draft_vocab_size=2560, rank=16), "small Markov head (V_d·r = 40960 < 1048576)"),  # the demo pair
])
def test_cpu_fallback_reasons(change, why):
    pytest.importorskip("numba")
    reason = fallback_reason("cpu", **{**CASE, **change})
    assert reason is not None and why in reason


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_a_markov_impl_runs_a_whole_round_like_markov_walk(sampled):
    pytest.importorskip("numba")
    g = torch.Generator().manual_seed(9)
    B, N, V, r, k = 3, 7, 1031, 16, 64
    base, anchor = torch.randn(B, N, V, generator=g) * 3, torch.randint(0, V, (B,), generator=g)
    w1, w2 = torch.randn(V, r, generator=g) / r**0.5, torch.randn(V, r, generator=g)
    kw = dict(topk=k, logit_scale=0.5, conf_base=torch.randn(B, N, generator=g),
              conf_w_markov=torch.randn(r, generator=g))
    if sampled:
        kw.update(temperature=torch.tensor([0.0, 0.8, 1.3]), seed=torch.tensor([3, 4, 5]),
                  positions=torch.tensor([9, 0, 77]))
    got = by_candidate_id(select_markov_impl("cpu", **CASE)(base, anchor, w1, w2, **kw))
    want = by_candidate_id(REFERENCE(base, anchor, w1, w2, **kw))
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.cand_ids, want.cand_ids)
    torch.testing.assert_close(got.cand_logits, want.cand_logits, rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(got.confidence, want.confidence, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("change, why", [
    (dict(topk=None), "dense Markov head"),
    (dict(topk=4000), "3840"),
    (dict(rank=2048), "1024"),
    (dict(weights_dtype=torch.float64), "float64"),
])
def test_cuda_fallback_reasons(change, why):
    reason = fallback_reason("cuda", **{**CASE, **change})
    assert reason is not None and why in reason


def test_kernel_is_chosen_on_cuda_when_supported():
    pytest.importorskip("triton")
    assert fallback_reason("cuda", **CASE) is None
    assert select_markov_walk("cuda", **CASE) is fused_markov_walk
    assert select_markov_walk("cuda", **CASE, use_kernel=False) is markov_walk


def _device():
    from dspark_trt.plugins.kernel import interpreting

    return torch.device("cpu") if interpreting() else torch.device("cuda")


@pytest.mark.triton
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_fused_walk_is_a_drop_in_for_markov_walk(sampled):
    """Same arguments, same MarkovWalkResult: int64 seeds/positions above 2^31 (reduced mod 2^31 - 1 without
    changing the noise), a reduced vocabulary, confidence on; and confidence None without conf_base."""
    dev = _device()
    g = torch.Generator().manual_seed(4)
    B, N, V, Vd, r, k = 3, 7, 257, 101, 8, 16
    base = (torch.randn(B, N, Vd, generator=g) * 3).to(dev)
    anchor = torch.randint(0, V, (B,), generator=g).to(dev)
    w1, w2 = (torch.randn(V, r, generator=g) / r**0.5).to(dev), torch.randn(Vd, r, generator=g).to(dev)
    d2t = (torch.sort(torch.randperm(V, generator=g)[:Vd]).values - torch.arange(Vd)).to(dev)
    opts = dict(topk=k, logit_scale=0.5, d2t=d2t, conf_base=torch.randn(B, N, generator=g).to(dev),
                conf_w_markov=torch.randn(r, generator=g).to(dev))
    if sampled:
        opts.update(temperature=torch.tensor([0.7, 0.0, 1.2]).to(dev),
                    seed=torch.tensor([2**40 + 3, 5, 2**33]).to(dev), positions=torch.tensor([7, 2**31 + 9, 100]).to(dev))
    got = fused_markov_walk(base, anchor, w1, w2, **opts)
    cpu = {key: (v.cpu() if isinstance(v, torch.Tensor) else v) for key, v in opts.items()}
    want = markov_walk(base.cpu(), anchor.cpu(), w1.cpu(), w2.cpu(), **cpu)
    assert got.tokens.dtype == want.tokens.dtype == torch.int64
    assert torch.equal(got.cand_ids.cpu(), want.cand_ids)
    ids32 = want.cand_ids.to(torch.int32)
    inputs = (None, ids32, None, None, None, d2t.cpu().to(torch.int32),
              cpu.get("temperature", torch.zeros(B)), (cpu["seed"] % (2**31 - 1)) if sampled else torch.zeros(B),
              (cpu["positions"] % (2**31 - 1)) if sampled else torch.zeros(B))
    compare_walks((got.tokens.cpu(), got.cand_logits.cpu(), got.confidence.cpu()),
                  (want.tokens, want.cand_logits, want.confidence), inputs, atol=2e-5, rtol=1e-5)
    no_conf = fused_markov_walk(base, anchor, w1, w2, topk=k)
    assert no_conf.confidence is None
    assert torch.equal(no_conf.tokens.cpu(), markov_walk(base.cpu(), anchor.cpu(), w1.cpu(), w2.cpu(), topk=k).tokens)


def test_the_union_kernel_is_chosen_on_cuda_when_supported():
    pytest.importorskip("triton")
    assert fallback_reason("cuda", **CASE, markov_topm=32) is None
    assert select_markov_walk("cuda", **CASE, markov_topm=32) is fused_markov_walk
    assert select_markov_impl("cuda", **CASE, markov_topm=5).name == "fused Triton kernel"
    reason = fallback_reason("cuda", **CASE, markov_topm=4000)
    assert reason is not None and "markov_topm 4000" in reason
    assert "dense Markov head" in fallback_reason("cuda", **{**CASE, "topk": None}, markov_topm=32)


@pytest.mark.triton
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_fused_union_walk_is_a_drop_in_for_markov_walk(sampled):
    """The candidate union through ``fused_markov_walk`` (bf16 logits and weights, a reduced vocabulary, int64
    keys): the same MarkovWalkResult as the reference, cand_ids [B, N, k + M] and −inf duplicates included."""
    from dspark_trt.reference.markov import markov_union_table
    from dspark_trt.plugins.walk_compare import compare_union_walks

    dev = _device()
    g = torch.Generator().manual_seed(6)
    B, N, V, Vd, r, k, M = 3, 7, 257, 101, 8, 16, 5
    base = (torch.randn(B, N, Vd, generator=g) * 3).bfloat16()
    anchor = torch.randint(0, V, (B,), generator=g)
    w1, w2 = (torch.randn(V, r, generator=g) / r**0.5).bfloat16(), torch.randn(Vd, r, generator=g).bfloat16()
    d2t = torch.sort(torch.randperm(V, generator=g)[:Vd]).values - torch.arange(Vd)
    table = markov_union_table(w1, w2, M, logit_scale=0.5)
    table[anchor] = torch.topk(base[:, 0].float(), M, dim=-1).indices.int()  # slot 0: all duplicates
    opts = dict(topk=k, logit_scale=0.5, d2t=d2t, conf_base=torch.randn(B, N, generator=g),
                conf_w_markov=torch.randn(r, generator=g), union_table=table)
    if sampled:
        opts.update(temperature=torch.tensor([0.7, 0.0, 1.0]), seed=torch.tensor([2**40 + 3, 5, 2**33]),
                    positions=torch.tensor([7, 2**31 + 9, 100]))
    on_dev = {key: (v.to(dev) if isinstance(v, torch.Tensor) else v) for key, v in opts.items()}
    got = fused_markov_walk(base.to(dev), anchor.to(dev), w1.to(dev), w2.to(dev), **on_dev)
    want = markov_walk(base, anchor, w1, w2, **opts)
    assert got.union_width == want.union_width == M and got.cand_ids.shape == want.cand_ids.shape == (B, N, k + M)
    assert (want.cand_logits[:, 0, k:] == float("-inf")).all()
    assert torch.equal(got.cand_ids[..., :k].cpu(), want.cand_ids[..., :k])
    ids32 = want.cand_ids[..., :k].to(torch.int32)
    inputs = (None, ids32, None, None, None, d2t.to(torch.int32), opts.get("temperature", torch.zeros(B)),
              (opts["seed"] % (2**31 - 1)) if sampled else torch.zeros(B),
              (opts["positions"] % (2**31 - 1)) if sampled else torch.zeros(B))
    compare_union_walks((got.tokens.cpu(), got.cand_logits.cpu(), got.confidence.cpu(), got.cand_ids[..., k:].cpu()),
                        (want.tokens, want.cand_logits, want.confidence, want.cand_ids[..., k:]), inputs,
                        atol=2e-5, rtol=1e-5)


# --------------------------------------------------------------------- the gated and RNN heads on CUDA
@pytest.mark.parametrize("head", ["gated", "rnn"])
def test_the_head_kernels_are_chosen_on_cuda_when_supported(head):
    pytest.importorskip("triton")
    assert fallback_reason("cuda", **CASE, markov_head_type=head) is None
    assert select_markov_walk("cuda", **CASE, markov_head_type=head) is fused_markov_walk
    assert select_markov_impl("cuda", **CASE, markov_head_type=head).name == "fused Triton kernel"
    assert "[1, 1024]" in fallback_reason("cuda", **{**CASE, "rank": 2048}, markov_head_type=head)
    assert "vanilla Markov head only" in fallback_reason("cuda", **CASE, markov_topm=8, markov_head_type=head)
    assert "dense Markov head" in fallback_reason("cuda", **{**CASE, "topk": None}, markov_head_type=head)


@pytest.mark.triton
@pytest.mark.parametrize("head", ["gated", "rnn"])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_fused_head_walk_is_a_drop_in_for_markov_walk(head, sampled):
    """``fused_markov_walk(..., head=HeadFeatures)`` is ``markov_walk(..., head=)``: bf16 W1 / W2 with the head's
    fp32 split weight (``head_features``), a reduced vocabulary, int64 keys, an RNN start state."""
    from dspark_trt.reference.markov_heads import head_features

    dev = _device()
    g = torch.Generator().manual_seed(12)
    B, N, V, Vd, r, k, d = 3, 7, 257, 101, 8, 16, 24
    base = torch.randn(B, N, Vd, generator=g) * 3
    anchor = torch.randint(0, V, (B,), generator=g)
    w1, w2 = (torch.randn(V, r, generator=g) / r**0.5).bfloat16(), torch.randn(Vd, r, generator=g).bfloat16()
    d2t = torch.sort(torch.randperm(V, generator=g)[:Vd]).values - torch.arange(Vd)
    hidden = torch.randn(B, N, d, generator=g)
    width, fan_in = (r, d + r) if head == "gated" else (3 * r, 2 * r + d)
    feats = head_features(head, hidden, torch.randn(width, fan_in, generator=g) / fan_in**0.5,
                          torch.randn(width, generator=g) * 0.1,
                          state0=torch.rand(B, r, generator=g) - 0.5 if head == "rnn" else None)
    opts = dict(topk=k, logit_scale=0.5, d2t=d2t, conf_base=torch.randn(B, N, generator=g),
                conf_w_markov=torch.randn(r, generator=g), head=feats)
    if sampled:
        opts.update(temperature=torch.tensor([0.7, 0.0, 1.2]), seed=torch.tensor([2**40 + 3, 5, 2**33]),
                    positions=torch.tensor([7, 2**31 + 9, 100]))
    on_dev = {key: (v.to(dev) if isinstance(v, torch.Tensor) else v) for key, v in opts.items()}
    on_dev["head"] = type(feats)(feats.kind, feats.hidden_part.to(dev), feats.weight.to(dev),
                                 None if feats.state0 is None else feats.state0.to(dev))
    got = fused_markov_walk(base.to(dev), anchor.to(dev), w1.to(dev), w2.to(dev), **on_dev)
    want = markov_walk(base, anchor, w1, w2, **opts)
    assert got.tokens.dtype == torch.int64 and torch.equal(got.cand_ids.cpu(), want.cand_ids)
    inputs = (None, want.cand_ids.to(torch.int32), None, None, None, d2t.to(torch.int32),
              opts.get("temperature", torch.zeros(B)), (opts["seed"] % (2**31 - 1)) if sampled else torch.zeros(B),
              (opts["positions"] % (2**31 - 1)) if sampled else torch.zeros(B))
    compare_walks((got.tokens.cpu(), got.cand_logits.cpu(), got.confidence.cpu()),
                  (want.tokens, want.cand_logits, want.confidence), inputs, atol=2e-5, rtol=1e-5)
    vanilla = markov_walk(base, anchor, w1, w2, **{**opts, "head": None})
    assert not torch.allclose(got.cand_logits.cpu(), vanilla.cand_logits)  # the head is really used
