"""The onnxruntime drafter backend against the reference drafter (the torch backend's oracle), on the tiny pair."""

from __future__ import annotations

import functools

import pytest
import torch

from dspark_trt.errors import DSparkTrtError

pytestmark = pytest.mark.onnx


@functools.cache
def reference(pair):
    from dspark_trt import load_drafter

    return load_drafter(pair.drafter, dtype="fp32", target_dir=pair.target)


@pytest.fixture(scope="module", params=[16, "off"], ids=["topk16", "dense"])
def backend_and_topk(request, tiny_pair, onnx_export, onnx_cache_dir):
    from dspark_trt.runtime.drafters.onnxruntime import OnnxRuntimeDrafterBackend

    onnx_export(tiny_pair, "fp32", request.param)  # the shared (pre)built export, so from_pretrained hits the cache
    backend = OnnxRuntimeDrafterBackend.from_pretrained(tiny_pair.drafter, target_dir=tiny_pair.target,
                                                        dtype="fp32", topk=request.param, cache_dir=onnx_cache_dir)
    with backend:
        yield backend, (None if request.param == "off" else request.param)


def test_registered_under_its_name():
    from dspark_trt.runtime.drafters.base import backend_class
    from dspark_trt.runtime.drafters.onnxruntime import OnnxRuntimeDrafterBackend

    assert backend_class("onnxruntime") is OnnxRuntimeDrafterBackend


@pytest.mark.parametrize("B", [1, 3])
def test_context_kv_matches_reference(backend_and_topk, tiny_pair, B):
    backend, _ = backend_and_topk
    drafter = reference(tiny_pair)
    c = drafter.config
    T = 4 + B
    taps = torch.randn(B, T, c.num_taps * c.hidden_size, generator=torch.Generator().manual_seed(B))
    positions = torch.arange(T).expand(B, T) + 3
    k, v = backend.context_kv(taps, positions)
    ref_k, ref_v = drafter.context_kv(taps, positions)
    torch.testing.assert_close(k, ref_k, atol=1e-5, rtol=1e-5)  # fp32; GEMMs summed in another order
    torch.testing.assert_close(v, ref_v, atol=1e-5, rtol=1e-5)


def simulate(drafter_like, drafter, rounds, *, B, topk, temperature, seed=0):
    """A few decode rounds: context K/V of accepted tokens appended to per-request padded caches, a draft,
    a random number of accepted tokens + a bonus token as the next anchor. Taps are random (no target);
    acceptance is drawn from a generator shared by both runs, so only the drafter differs."""
    c = drafter.config
    g = torch.Generator().manual_seed(seed)
    prompt = [int(n) for n in torch.randint(3, 9, (B,), generator=g)]
    L, H, D = c.num_hidden_layers, c.num_key_value_heads, c.head_dim
    cache_k = torch.zeros(L, B, 64, H, D)
    cache_v = torch.zeros(L, B, 64, H, D)
    lengths = torch.zeros(B, dtype=torch.int64)

    def append(new_counts):
        T = max(new_counts)
        taps = torch.randn(B, T, c.num_taps * c.hidden_size, generator=g)
        positions = lengths.view(B, 1) + torch.arange(T)
        k, v = drafter_like.context_kv(taps, positions)
        for b, n in enumerate(new_counts):
            cache_k[:, b, lengths[b]:lengths[b] + n] = k[:, b, :n]
            cache_v[:, b, lengths[b]:lengths[b] + n] = v[:, b, :n]
            lengths[b] += n

    append(prompt)
    anchor = torch.randint(0, c.vocab_size, (B,), generator=g)
    history = []
    for _ in range(rounds):
        T = int(lengths.max())
        result = drafter_like.draft(anchor, cache_k[:, :, :T], cache_v[:, :, :T], lengths.clone(), topk=topk,
                                    temperature=temperature, seed=torch.arange(B) + 1000 * seed)
        history.append(result)
        accepted = [int(n) for n in torch.randint(0, c.num_draft_tokens + 1, (B,), generator=g)]
        append([n + 1 for n in accepted])  # the anchor and the accepted drafts become context
        anchor = torch.stack([result.tokens[b, n] if n < c.num_draft_tokens else torch.tensor(7)
                              for b, n in enumerate(accepted)])
    return history


class ReferenceRunner:
    """The reference drafter behind the backend's two calls (what the torch backend runs)."""

    def __init__(self, drafter):
        self.drafter = drafter

    def context_kv(self, taps, positions):
        return self.drafter.context_kv(taps, positions)

    def draft(self, anchor, ctx_k, ctx_v, ctx_len, *, topk, temperature, seed):
        return self.drafter.draft(anchor, ctx_k, ctx_v, ctx_len, topk=topk, temperature=temperature, seed=seed)


@pytest.mark.parametrize("temperature", [None, torch.tensor([0.0, 1.0, 0.6])], ids=["greedy", "sampled"])
def test_decode_rounds_match_reference(backend_and_topk, tiny_pair, temperature):
    backend, topk = backend_and_topk
    drafter = reference(tiny_pair)
    got = simulate(backend, drafter, 4, B=3, topk=topk, temperature=temperature)
    ref = simulate(ReferenceRunner(drafter), drafter, 4, B=3, topk=topk, temperature=temperature)
    for round_got, round_ref in zip(got, ref):
        assert torch.equal(round_got.tokens, round_ref.tokens)  # identical drafts, round after round
        assert round_got.tokens.dtype == torch.int64 and round_got.cand_ids.dtype == torch.int64
        assert torch.equal(round_got.cand_ids.sort(-1).values, round_ref.cand_ids.sort(-1).values)
        order_got, order_ref = round_got.cand_ids.argsort(-1), round_ref.cand_ids.argsort(-1)
        torch.testing.assert_close(round_got.cand_logits.gather(-1, order_got),
                                   round_ref.cand_logits.gather(-1, order_ref), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(round_got.confidence, round_ref.confidence, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("pair_name, pattern", [("tiny_causal_pair", (4, True)), ("tiny_windowed_pair", (4, False))],
                         ids=["causal", "bidirectional"])
def test_windowed_drafter_decodes_like_the_reference(pair_name, pattern, onnx_export, onnx_cache_dir, request):
    """Sliding-window layers through the backend — speculators' causal one, and the recipe's context window
    (bidirectional in the block) — over rounds whose contexts outgrow the window."""
    from dspark_trt.runtime.drafters.onnxruntime import OnnxRuntimeDrafterBackend

    pair = request.getfixturevalue(pair_name)
    onnx_export(pair, "fp32", 16)  # cache hit below
    drafter = reference(pair)
    assert drafter.config.layer_attention(0) == pattern
    with OnnxRuntimeDrafterBackend.from_pretrained(pair.drafter, target_dir=pair.target,
                                                   dtype="fp32", topk=16, cache_dir=onnx_cache_dir) as backend:
        temperature = torch.tensor([0.0, 1.0, 0.6])
        got = simulate(backend, drafter, 4, B=3, topk=16, temperature=temperature)
    ref = simulate(ReferenceRunner(drafter), drafter, 4, B=3, topk=16, temperature=temperature)
    for round_got, round_ref in zip(got, ref):
        assert torch.equal(round_got.tokens, round_ref.tokens)
        order_got, order_ref = round_got.cand_ids.argsort(-1), round_ref.cand_ids.argsort(-1)
        torch.testing.assert_close(round_got.cand_logits.gather(-1, order_got),
                                   round_ref.cand_logits.gather(-1, order_ref), atol=1e-5, rtol=1e-5)


def test_export_dir_backend_refuses_other_topk_and_long_context(tiny_pair, onnx_export):
    from dspark_trt.runtime.drafters.onnxruntime import OnnxRuntimeDrafterBackend

    c = reference(tiny_pair).config
    kv = torch.zeros(c.num_hidden_layers, 1, 4, c.num_key_value_heads, c.head_dim)
    with OnnxRuntimeDrafterBackend(onnx_export(tiny_pair, "fp32", 16)) as backend:
        assert backend.topk == 16 and backend.dtype == torch.float32
        with pytest.raises(DSparkTrtError, match="export drafts with top-k 16 but top-k off"):
            backend.draft(torch.tensor([1]), kv, kv, torch.tensor([4]), topk=None, temperature=None, seed=None)
        long = torch.zeros(1, backend.max_context + 1, c.num_taps * c.hidden_size)
        with pytest.raises(DSparkTrtError, match="--max-context"):
            backend.context_kv(long, torch.arange(backend.max_context + 1).view(1, -1))
    with pytest.raises(DSparkTrtError, match="runs on the CPU"):
        OnnxRuntimeDrafterBackend(onnx_export(tiny_pair, "fp32", 16), device="cuda")


def test_from_pretrained_backend_switches_topk(tiny_pair, onnx_export, onnx_cache_dir):
    """Built from a checkpoint, the backend loads (exporting on a miss) the graphs for a requested top-k."""
    from dspark_trt.runtime.drafters.onnxruntime import OnnxRuntimeDrafterBackend

    onnx_export(tiny_pair, "fp32", 16), onnx_export(tiny_pair, "fp32", "off")  # both cached: no export here
    drafter = reference(tiny_pair)
    backend = OnnxRuntimeDrafterBackend.from_pretrained(tiny_pair.drafter, target_dir=tiny_pair.target, topk=16,
                                                        cache_dir=onnx_cache_dir, device="cpu")
    g = torch.Generator().manual_seed(9)
    c = drafter.config
    taps = torch.randn(2, 6, c.num_taps * c.hidden_size, generator=g)
    with backend:
        k, v = backend.context_kv(taps, torch.arange(6).expand(2, 6))
        anchor, ctx_len = torch.tensor([3, 1999]), torch.tensor([6, 2])
        dense = backend.draft(anchor, k, v, ctx_len, topk=None, temperature=None, seed=None)
        assert backend.topk is None
        top16 = backend.draft(anchor, k, v, ctx_len, topk=16, temperature=None, seed=None)
    ref_k, ref_v = drafter.context_kv(taps, torch.arange(6).expand(2, 6))
    assert torch.equal(dense.tokens, drafter.draft(anchor, ref_k, ref_v, ctx_len, topk=None).tokens)
    assert torch.equal(top16.tokens, drafter.draft(anchor, ref_k, ref_v, ctx_len, topk=16).tokens)
    assert dense.cand_logits.shape[-1] == c.draft_vocab_size and top16.cand_logits.shape[-1] == 16


def test_not_an_export_directory(tmp_path):
    from dspark_trt.runtime.drafters.onnxruntime import OnnxRuntimeDrafterBackend

    with pytest.raises(DSparkTrtError, match="not an ONNX export directory"):
        OnnxRuntimeDrafterBackend(tmp_path)


def test_reduced_draft_vocabulary_carries_d2t_and_decodes_losslessly(small_vocab_reduced_pair, tmp_path):
    """A reduced draft vocabulary: the export records d2t, the backend exposes it, greedy output is the target's."""
    from dspark_trt.runtime import SpeculativeDecoder

    ref = reference(small_vocab_reduced_pair)
    dec = SpeculativeDecoder.from_pretrained(small_vocab_reduced_pair.drafter, small_vocab_reduced_pair.target,
                                             backend="onnxruntime", device="cpu", topk=8, cache_dir=tmp_path)
    assert torch.equal(dec.backend.d2t, ref.d2t)
    prompts = [[1, 2, 3], [4, 5]]
    spec = dec.generate(prompts, max_new_tokens=10, topk=8, eos_token_id=[])
    alone = dec.generate(prompts, max_new_tokens=10, eos_token_id=[], draft=False)
    assert spec.tokens == alone.tokens and spec.stats.drafted > 0


def test_low_memory_sessions_draft_what_the_default_sessions_draft(tiny_pair, onnx_export):
    """``low_memory=True`` (no arena, no prepacked weights, no constant folding: a bf16 export's weights cast per run)
    drafts the same tokens and candidate logits as the default sessions, round after round, on the bf16 export."""
    from dspark_trt.runtime.drafters.onnxruntime import OnnxRuntimeDrafterBackend

    export = onnx_export(tiny_pair, "bf16", 16)
    drafter = reference(tiny_pair)
    temperature = torch.tensor([0.0, 1.0, 0.6])
    runs = []
    for low_memory in (False, True):
        with OnnxRuntimeDrafterBackend(export, low_memory=low_memory) as backend:
            assert backend.dtype == torch.bfloat16
            assert all(g.emulated_bf16 for g in backend._graphs.values())
            runs.append(simulate(backend, drafter, 3, B=3, topk=16, temperature=temperature))
    for default, low in zip(*runs):
        assert torch.equal(default.tokens, low.tokens)
        torch.testing.assert_close(default.cand_logits, low.cand_logits, atol=0, rtol=0)
