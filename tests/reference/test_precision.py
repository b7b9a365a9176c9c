"""Mixed precision (issue #16): an fp16 drafter fuses its context in fp32, so massive activations stay finite."""

from __future__ import annotations

import pytest
import torch

from dspark_trt import load_drafter
from dspark_trt.export.validate import TOLERANCES, compare_context, compare_draft
from dspark_trt.reference.precision import (
    MASSIVE_ACTIVATION, context_fusion_dtype, keep_context_fusion_fp32, massive_channels, massive_taps, model_dtype,
)
from dspark_trt.testing.massive import massive_case


def _round(drafter, case, temperature=None, seed=None):
    k, v = drafter.context_kv(case.taps, case.positions)
    result = drafter.draft(case.anchor, k, v, case.ctx_len, topk=None, temperature=temperature, seed=seed)
    return k, v, result


def _load(pair, dtype):
    return load_drafter(pair.drafter, dtype=dtype, target_dir=pair.target)


def test_context_fusion_dtype_rule():
    assert context_fusion_dtype(torch.float16) == torch.float32
    assert context_fusion_dtype(torch.bfloat16) == torch.bfloat16
    assert context_fusion_dtype(torch.float32) == torch.float32


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_loader_keeps_only_the_context_fusion_out_of_fp16(tiny_pair, dtype):
    drafter = _load(tiny_pair, dtype)
    want = model_dtype(drafter)
    fusion = context_fusion_dtype(want)
    for name, p in drafter.named_parameters():
        expect = fusion if name.split(".")[0] in ("fc", "hidden_norm") else want
        assert p.dtype == expect, name
    k, _ = drafter.context_kv(torch.randn(1, 3, drafter.fc.in_features), torch.arange(3).view(1, 3))
    assert k.dtype == want  # K/V (and the cache) stay in the model dtype


def test_massive_channels_are_distinct_and_spread_over_taps():
    ch = massive_channels(3, 64, count=4, seed=1)
    assert ch.numel() == 4 and len(set(ch.tolist())) == 4
    assert set((ch // 64).tolist()) == {0, 1, 2}
    taps = massive_taps(torch.zeros(2, 5, 192), ch)
    assert taps[..., ch].abs().min() >= 0.9 * MASSIVE_ACTIVATION - 1
    assert taps.abs().sum() == taps[..., ch].abs().sum()  # nothing else touched


def test_all_fp16_drafter_overflows_on_massive_activations(tiny_pair):
    """The failure of issue #16, kept as the proof that the case bites: fc in fp16 → inf → NaN context,
    every slot drafts the same garbage token, and nothing raises."""
    drafter = _load(tiny_pair, "fp16").half()  # fc and hidden_norm in fp16 too
    case = massive_case(drafter)
    k, v, result = _round(drafter, case)
    assert not bool(torch.isfinite(k).all())
    assert len(set(result.tokens.flatten().tolist())) == 1
    ref = _round(_load(tiny_pair, "fp32"), massive_case(_load(tiny_pair, "fp32")))[2]
    assert not torch.equal(result.tokens, ref.tokens)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_reduced_precision_drafts_what_fp32_drafts_on_massive_activations(tiny_pair, dtype):
    ref_drafter = _load(tiny_pair, "fp32")
    ref_case = massive_case(ref_drafter)
    drafter = _load(tiny_pair, dtype)
    case = massive_case(drafter)
    tol = TOLERANCES[dtype]
    c = drafter.config
    seeds = torch.tensor([3, 11])
    for temperature in (None, torch.tensor([0.0, 0.9])):
        ref_k, ref_v, ref = _round(ref_drafter, ref_case, temperature, seeds)
        k, v, got = _round(drafter, case, temperature, seeds)
        assert bool(torch.isfinite(k).all() and torch.isfinite(v).all())
        checks = compare_context(k, v, ref_k, ref_v, tol)
        checks += compare_draft(got, ref, tol, vocab=c.draft_vocab_size, temperature=temperature, seed=seeds,
                                positions=case.ctx_len + 1)
        assert all(ch.ok for ch in checks), [ch.line() for ch in checks if not ch.ok]
        if temperature is None:
            assert torch.equal(got.tokens, ref.tokens)  # the tiny case has no near-ties: the very same drafts


def test_keep_context_fusion_fp32_repairs_a_cast_drafter(tiny_pair):
    drafter = keep_context_fusion_fp32(_load(tiny_pair, "fp32").half())
    assert drafter.fc.weight.dtype == drafter.hidden_norm.weight.dtype == torch.float32
    assert drafter.layers[0].self_attn.k_proj.weight.dtype == torch.float16
    k, _, _ = _round(drafter, massive_case(drafter))
    assert k.dtype == torch.float16 and bool(torch.isfinite(k).all())
