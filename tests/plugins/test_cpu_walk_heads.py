"""The Numba CPU walk with the gated and RNN Markov heads (``head=``) against the oracle: the contract's
``reference_gated_op`` / ``reference_rnn_op`` (``reference.markov.walk_candidates(..., head=)``), compared
tie-robustly (``walk_compare.compare_walks``, candidates matched by id)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("numba")

from dspark_trt.errors import DSparkTrtError  # noqa: E402
from dspark_trt.plugins import cpu_walk  # noqa: E402
from dspark_trt.plugins.contract import REFERENCE_OPS  # noqa: E402
from dspark_trt.plugins.cpu_walk import cpu_markov_walk, cpu_select_candidates, cpu_walk_candidates  # noqa: E402
from dspark_trt.plugins.walk_compare import WalkCase, by_candidate_id, compare_walks, make_walk_inputs  # noqa: E402
from dspark_trt.reference.markov import markov_union_table, markov_walk, walk_candidates  # noqa: E402
from dspark_trt.reference.markov_heads import HeadFeatures  # noqa: E402

FP32, BF16 = torch.float32, torch.bfloat16
TOL = dict(atol=2e-5, rtol=1e-5)  # as the vanilla walk's: the head's r-sized products differ only in sum order
HEADS = ("gated", "rnn")


def head_inputs(kind: str, B: int, N: int, r: int, *, dtype=FP32, seed: int = 0, state0: bool = True) -> tuple:
    """The gated op's (gate_hidden [B, N, r], gate_w [r, r]) or the RNN op's (joint_hidden [B, N, 3r], joint_w
    [3r, 2r], rnn_state0 [B, r]) extra inputs: random, pre-activations of unit scale (gates neither saturated
    nor constant). ``state0=False``: a zero start state (the anchor-first layout)."""
    g = torch.Generator().manual_seed(seed + 101)
    if kind == "gated":
        return torch.randn(B, N, r, generator=g), (torch.randn(r, r, generator=g) / r**0.5).to(dtype)
    state = torch.randn(B, r, generator=g).tanh() if state0 else torch.zeros(B, r)
    return (torch.randn(B, N, 3 * r, generator=g), (torch.randn(3 * r, 2 * r, generator=g) / (2 * r) ** 0.5).to(dtype),
            state)


def features(kind: str, extra: tuple, *, state0: bool = True) -> HeadFeatures:
    if kind == "gated":
        return HeadFeatures("gated", extra[0], extra[1])
    return HeadFeatures("rnn", extra[0], extra[1], extra[2] if state0 else None)


def run_walk(inputs: tuple, head: HeadFeatures, scale: float) -> tuple:
    """The CPU walk on the op's 11 inputs and a head, outputs poisoned first so unwritten elements show."""
    vals, ids, anchor, w1, w2, d2t, temp, seed, pos, conf_base, conf_w = inputs
    B, N, k = vals.shape
    out = (torch.full((B, N), -1, dtype=torch.int64), torch.full((B, N, k), float("nan")),
           torch.full((B, N), float("nan")))
    result = cpu_walk_candidates(vals, ids, anchor, w1, w2, logit_scale=scale, d2t=d2t, temperature=temp, seed=seed,
                                 positions=pos, conf_base=conf_base, conf_w_markov=conf_w, out=out, head=head)
    assert result.tokens is out[0] and result.cand_logits is out[1] and result.confidence is out[2]
    assert (out[0] >= 0).all() and not out[1].isnan().any() and not out[2].isnan().any()
    return result.tokens.to(torch.int32), result.cand_logits, result.confidence


# (V, V_d, r, k, N, B): r ∈ {8, 192}, k ∈ {1, 16, 512}, B ∈ {1, 5, 13} (13: two request blocks of the head's
# products, with a tail of 1 after the groups of 4), reduced vocabularies (d2t in the chain)
WALKS = [
    pytest.param(257, None, 8, 1, 7, 5, id="V257-r8-k1-N7-B5"),
    pytest.param(257, 101, 192, 16, 7, 5, id="V257-Vd101-r192-k16-N7-B5"),
    pytest.param(257, None, 8, 16, 7, 1, id="V257-r8-k16-N7-B1"),
    pytest.param(257, None, 192, 257, 7, 13, id="V257-r192-k257-N7-B13"),
    pytest.param(1031, 769, 192, 512, 7, 1, id="V1031-Vd769-r192-k512-N7-B1"),
    pytest.param(1031, None, 8, 512, 3, 5, id="V1031-r8-k512-N3-B5"),
]


@pytest.mark.parametrize("kind", HEADS)
@pytest.mark.parametrize("V, Vd, r, k, N, B", WALKS)
@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("mode, scale", [("greedy", 1.0), ("mixed", 0.5)])
@pytest.mark.parametrize("threads", [1, 8], ids=["request-per-task", "candidates-split"])
def test_head_walk_matches_the_reference_op(kind, V, Vd, r, k, N, B, dtype, mode, scale, threads, monkeypatch):
    monkeypatch.setattr(cpu_walk, "_threads", lambda: threads)  # splits of the candidates and of the head's rows
    case = WalkCase(batch=B, steps=N, vocab=V, draft_vocab=Vd, rank=r, topk=k, logits_dtype=dtype,
                    weights_dtype=dtype, logit_scale=scale, mode=mode, seed=V + r + k + N + B)
    inputs = make_walk_inputs(case)
    extra = head_inputs(kind, B, N, r, dtype=dtype, seed=case.seed)
    got = run_walk(inputs, features(kind, extra), scale)
    report = compare_walks(got, REFERENCE_OPS[kind](*inputs, *extra, logit_scale=scale), inputs, **TOL)
    assert report["near_ties"] <= 1, report  # random fp32-scale data: near-ties are rare


@pytest.mark.parametrize("kind", HEADS)
def test_the_head_is_applied_not_ignored(kind):
    """The comparison above can fail: the same inputs walked as a vanilla head give other logits, and so does
    the RNN walk from another start state."""
    case = WalkCase(batch=5, steps=7, vocab=257, rank=8, topk=16, mode="mixed", seed=9)
    inputs = make_walk_inputs(case)
    extra = head_inputs(kind, 5, 7, 8, seed=9)
    got = run_walk(inputs, features(kind, extra), 1.0)
    vanilla = cpu_walk_candidates(*inputs[:5], d2t=inputs[5], temperature=inputs[6], seed=inputs[7],
                                  positions=inputs[8], conf_base=inputs[9], conf_w_markov=inputs[10])
    assert (got[1][:, 0] - vanilla.cand_logits[:, 0]).abs().max() > 0.1  # slot 0: the same predecessor
    torch.testing.assert_close(got[2][:, 0], vanilla.confidence[:, 0], **TOL)  # it reads e_j, whatever the head
    if kind == "rnn":
        zero = run_walk(inputs, features(kind, extra, state0=False), 1.0)
        assert (zero[1][:, 0] - got[1][:, 0]).abs().max() > 0.1


@pytest.mark.parametrize("kind, w1_dtype, w2_dtype", [("gated", FP32, BF16), ("rnn", BF16, FP32)],
                         ids=["gated-fp32-bf16", "rnn-bf16-fp32"])
def test_mixed_weight_dtypes(kind, w1_dtype, w2_dtype):
    case = WalkCase(batch=5, steps=7, vocab=257, rank=192, topk=16, mode="sampled", seed=3)
    inputs = list(make_walk_inputs(case))
    inputs[3], inputs[4] = inputs[3].to(w1_dtype), inputs[4].to(w2_dtype)
    extra = head_inputs(kind, 5, 7, 192, dtype=w2_dtype, seed=3)
    compare_walks(run_walk(tuple(inputs), features(kind, extra), 1.0),
                  REFERENCE_OPS[kind](*inputs, *extra, logit_scale=1.0), tuple(inputs), **TOL)


@pytest.mark.parametrize("kind", HEADS)
@pytest.mark.parametrize("mode", ["greedy", "sampled"])
@pytest.mark.parametrize("B", [1, 5])
def test_full_vocabulary_equals_dense_walk(kind, mode, B):
    """k = V_d through the whole native round (selection + walk) equals the dense reference walk with the head
    (the RNN from a zero start state: ``HeadFeatures.state0`` None)."""
    g = torch.Generator().manual_seed(11 + B)
    N, V, r = 7, 257, 8
    base, anchor = torch.randn(B, N, V, generator=g) * 3, torch.randint(0, V, (B,), generator=g)
    w1, w2 = torch.randn(V, r, generator=g) / r**0.5, torch.randn(V, r, generator=g)
    head = features(kind, head_inputs(kind, B, N, r, seed=B), state0=False)
    kw = dict(logit_scale=0.5, conf_base=torch.randn(B, N, generator=g), conf_w_markov=torch.randn(r, generator=g),
              head=head)
    if mode == "sampled":
        kw.update(temperature=torch.tensor([0.0, 0.7, 1e-5, 1.3, 5e-6])[:B] if B > 1 else torch.tensor([0.9]),
                  seed=torch.arange(B) * 7, positions=torch.arange(B) + 40)
    got = by_candidate_id(cpu_markov_walk(base, anchor, w1, w2, topk=V, **kw))
    want = markov_walk(base, anchor, w1, w2, topk=None, **kw)
    assert torch.equal(got.cand_ids, want.cand_ids)
    assert torch.equal(got.tokens, want.tokens)
    torch.testing.assert_close(got.cand_logits, want.cand_logits, **TOL)
    torch.testing.assert_close(got.confidence, want.confidence, **TOL)


@pytest.mark.parametrize("kind", HEADS)
def test_native_round_matches_the_reference_round_at_qwen3_vocabulary(kind):
    """The benchmark's shapes: V = 151936, k = 512, a batch of 3 with sampling mixed in."""
    g = torch.Generator().manual_seed(5)
    B, N, V, r, k = 3, 7, 151936, 64, 512
    base, anchor = torch.randn(B, N, V, generator=g) * 3, torch.randint(0, V, (B,), generator=g)
    w1, w2 = torch.randn(V, r, generator=g) / r**0.5, torch.randn(V, r, generator=g)
    kw = dict(temperature=torch.tensor([0.0, 0.9, 1.1]), seed=torch.tensor([1, 2, 3]),
              positions=torch.tensor([5, 6, 7]), head=features(kind, head_inputs(kind, B, N, r, seed=5)))
    got = by_candidate_id(cpu_markov_walk(base, anchor, w1, w2, topk=k, **kw))
    want = by_candidate_id(markov_walk(base, anchor, w1, w2, topk=k, **kw))
    assert torch.equal(got.cand_ids, want.cand_ids) and torch.equal(got.tokens, want.tokens)
    torch.testing.assert_close(got.cand_logits, want.cand_logits, **TOL)


@pytest.mark.parametrize("kind", HEADS)
def test_the_drafter_round_with_the_native_kernels_equals_the_reference(kind, tmp_path):
    """A tiny gated / RNN checkpoint drafted end to end (backbone, head features, selection, walk) with the CPU
    kernels swapped in: the reference drafter's tokens and logits, per candidate id."""
    from dspark_trt import load_drafter
    from dspark_trt.synthetic import write_tiny_checkpoint

    V = 257
    for anchor_first in (True, False):  # the RNN's start state: zeros, or after the anchor slot
        ck = write_tiny_checkpoint(tmp_path / f"{kind}-{anchor_first}", seed=5, markov_head_type=kind, vocab_size=V,
                                   markov_rank=8, block_size=5, sample_from_anchor=anchor_first)
        drafter = load_drafter(ck.drafter)
        c = drafter.config
        g = torch.Generator().manual_seed(0)
        B, T = 3, 11
        taps = torch.randn(B, T, c.num_taps * c.hidden_size, generator=g)
        k, v = drafter.context_kv(taps, torch.arange(T).expand(B, T))
        anchor, ctx_len = torch.randint(0, V, (B,), generator=g), torch.tensor([T, 4, 7])
        opts = dict(topk=16, temperature=torch.tensor([0.0, 0.8, 1.2]), seed=torch.tensor([1, 2, 3]))
        with torch.no_grad():
            want = by_candidate_id(drafter.draft(anchor, k, v, ctx_len, **opts))
            got = by_candidate_id(drafter.draft(anchor, k, v, ctx_len, select=cpu_select_candidates,
                                                walk=cpu_walk_candidates, **opts))
        assert torch.equal(got.tokens, want.tokens) and torch.equal(got.cand_ids, want.cand_ids)
        torch.testing.assert_close(got.cand_logits, want.cand_logits, **TOL)
        torch.testing.assert_close(got.confidence, want.confidence, **TOL)


def test_bad_head_inputs_and_a_union_are_refused():
    case = WalkCase(batch=2, steps=3, vocab=257, rank=8, topk=16, seed=4)
    vals, ids, anchor, w1, w2, *_ = make_walk_inputs(case)
    gated = features("gated", head_inputs("gated", 2, 3, 8))
    table = markov_union_table(w1, w2, 4)
    for walk in (cpu_walk_candidates, walk_candidates):  # the same one line as the reference's
        with pytest.raises(DSparkTrtError, match="defined for the vanilla Markov head only: a gated head"):
            walk(vals, ids, anchor, w1, w2, head=gated, union_table=table, base_logits=torch.randn(2, 3, 257))
    wrong_n = features("rnn", head_inputs("rnn", 2, 5, 8))  # 5 slots for a 3-step walk
    with pytest.raises(DSparkTrtError, match=r"rnn head's hidden part has shape \[2, 5, 24\]; this walk needs "
                                             r"\[2, 3, 24\]"):
        cpu_walk_candidates(vals, ids, anchor, w1, w2, head=wrong_n)
    wrong_r = features("gated", head_inputs("gated", 2, 3, 4))  # rank 4 for rank-8 weights
    with pytest.raises(DSparkTrtError, match=r"\[2, 3, 8\] \(B, N, rank r\)"):
        cpu_walk_candidates(vals, ids, anchor, w1, w2, head=wrong_r)


@pytest.mark.parametrize("kind", HEADS)
def test_the_runtime_chooses_the_cpu_kernels_for_the_head(kind):
    from dspark_trt.plugins.dispatch import fallback_reason, select_markov_impl, select_markov_walk

    case = dict(topk=512, rank=256, num_draft_tokens=7, logits_dtype=torch.float32, weights_dtype=torch.bfloat16,
                draft_vocab_size=151936, markov_head_type=kind)
    assert fallback_reason("cpu", **case) is None
    impl = select_markov_impl("cpu", **case)
    assert (impl.select, impl.walk) == (cpu_select_candidates, cpu_walk_candidates)
    assert select_markov_walk("cpu", **case) is cpu_markov_walk
    assert "dense Markov head" in fallback_reason("cpu", **{**case, "topk": None})  # dense: the reference GEMMs
