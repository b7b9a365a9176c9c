"""The onnxruntime drafter backend over gated and RNN exports (issue 42): decoding a mixed batch through the
DSparkTopKMarkovGated / RNN graph (top-k) or the inlined walk (dense), every round drafts the torch backend's tokens
and hands the verifier its q; greedy output is the target's own."""

from __future__ import annotations

import functools

import pytest
import torch

pytestmark = pytest.mark.onnx

PAIRS = {"gated": "gated_pair", "rnn": "rnn_pair"}


@functools.cache
def reference(pair):
    from dspark_trt import load_drafter

    return load_drafter(pair.drafter, dtype="fp32", target_dir=pair.target)


def dense_q(result, temperature, vocab: int) -> torch.Tensor:
    """The verifier's q [B, N, V_d] by draft id, from a draft round."""
    from dspark_trt.reference.verify import draft_probs

    q = draft_probs(result.cand_logits, result.cand_ids, result.tokens, temperature)
    return torch.zeros(*q.shape[:2], vocab).scatter_add(-1, result.cand_ids, q)


@pytest.mark.parametrize("topk", [16, "off"], ids=["topk16", "dense"])
@pytest.mark.parametrize("head", list(PAIRS))
def test_head_export_decodes_with_the_torch_backends_drafts(head, topk, request, onnx_export, monkeypatch):
    from dspark_trt.runtime import HFTarget, SpeculativeDecoder
    from dspark_trt.runtime.drafters.onnxruntime import OnnxRuntimeDrafterBackend
    from dspark_trt.runtime.drafters.torch import TorchDrafterBackend

    pair = request.getfixturevalue(PAIRS[head])
    drafter = reference(pair)
    assert drafter.config.markov_head_type == head
    backend = OnnxRuntimeDrafterBackend(onnx_export(pair, "fp32", topk))
    torch_backend = TorchDrafterBackend(drafter, graphs="off")
    target = HFTarget.from_pretrained(pair.target, dtype="fp32", device="cpu")
    dec = SpeculativeDecoder(target, backend)
    rounds = []
    original = backend.draft

    def recording_draft(anchor, ctx_k, ctx_v, ctx_len, **kw):
        result = original(anchor, ctx_k, ctx_v, ctx_len, **kw)
        rounds.append(((anchor, ctx_k, ctx_v, ctx_len), kw, result))
        return result

    monkeypatch.setattr(backend, "draft", recording_draft)
    prompts = [[1, 2, 3, 4], [5, 6], [7, 8, 9]]
    k = None if topk == "off" else topk
    vd = drafter.config.draft_vocab_size
    for temperature in (0.0, 1.0):
        rounds.clear()
        out = dec.generate(prompts, max_new_tokens=10, temperature=temperature, seed=[3, 4, 5], eos_token_id=[],
                           topk=k)
        assert rounds and out.stats.drafted > 0
        for args, kw, got in rounds:
            ref = torch_backend.draft(*args, **kw)
            assert torch.equal(got.tokens, ref.tokens)
            torch.testing.assert_close(dense_q(got, kw["temperature"], vd), dense_q(ref, kw["temperature"], vd),
                                       atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(got.confidence, ref.confidence, atol=1e-5, rtol=1e-5)
        if temperature == 0.0:
            alone = dec.generate(prompts, max_new_tokens=10, eos_token_id=[], draft=False)
            assert out.tokens == alone.tokens
