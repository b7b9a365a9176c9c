"""The Numba CPU kernels (candidate selection and walk) against the oracle: ``torch.topk`` and
``reference.markov`` (through ``contract.reference_op``), compared tie-robustly."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("numba")

from dspark_trt.errors import DSparkTrtError  # noqa: E402
from dspark_trt.plugins import cpu_walk  # noqa: E402
from dspark_trt.plugins.contract import reference_op  # noqa: E402
from dspark_trt.plugins.cpu_walk import cpu_markov_walk, cpu_select_candidates, cpu_walk_candidates  # noqa: E402
from dspark_trt.reference.markov import markov_walk  # noqa: E402
from dspark_trt.plugins.walk_compare import WalkCase, by_candidate_id, compare_walks, make_walk_inputs  # noqa: E402

FP32, BF16 = torch.float32, torch.bfloat16
TOL = dict(atol=2e-5, rtol=1e-5)  # both sides widen the same inputs exactly; only the rank-r sum order differs


def assert_is_topk(base: torch.Tensor, vals: torch.Tensor, ids: torch.Tensor) -> None:
    """Tie-robust: the k values equal torch.topk's as a multiset, the ids are distinct, in range and hold
    those values; so an id missing from torch.topk's set can only be a tie at the k-th value."""
    k = vals.shape[-1]
    want = torch.topk(base.float(), k, dim=-1).values  # [..., k] descending
    assert ids.dtype == torch.int64 and vals.dtype == torch.float32
    assert (ids >= 0).all() and (ids < base.shape[-1]).all()
    assert (ids.sort(dim=-1).values.diff(dim=-1) > 0).all(), "an id was picked twice"
    torch.testing.assert_close(vals, base.float().gather(-1, ids), rtol=0, atol=0, equal_nan=True,
                               msg="values must be the logits at the ids")
    got = vals.sort(dim=-1, descending=True).values
    assert torch.equal(got.nan_to_num(nan=1e30), want.nan_to_num(nan=1e30))


# (shape, k): odd vocabularies with a tail after the last full chunk, k ∈ {1, 16, 512} and k = V
SELECTIONS = [
    ((5, 7, 257), 1), ((5, 7, 257), 16), ((1, 7, 257), 257), ((2, 3, 4099), 16), ((2, 3, 4099), 512),
    ((1, 2, 1031), 1031), ((3, 1, 151936), 512), ((1, 1, 7), 3),
]


@pytest.fixture(params=["strided", "contiguous"])
def chunk_layout(request, monkeypatch):
    """Both chunk layouts of the selection (strided for cache-sized logits, contiguous beyond)."""
    if request.param == "contiguous":
        monkeypatch.setattr(cpu_walk, "STRIDED_CHUNKS_MAX_BYTES", -1)
    return request.param


@pytest.mark.parametrize("shape, k", SELECTIONS, ids=[f"{'x'.join(map(str, s))}-k{k}" for s, k in SELECTIONS])
def test_selection_is_the_top_k(shape, k, chunk_layout):
    base = torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape) + k)) * 3
    out = (torch.full((*shape[:-1], k), float("nan")), torch.full((*shape[:-1], k), -1))  # poisoned
    vals, ids = cpu_select_candidates(base, k, out=out)
    assert vals is out[0] and ids is out[1]
    assert_is_topk(base, vals, ids)


@pytest.mark.parametrize("layout", ["few-values", "ascending", "one-hot-chunk", "all-equal", "signed-zeros"])
def test_selection_with_ties_and_adversarial_layouts(layout, chunk_layout):
    """Heavy ties, top-k clustered in a few chunks (many survivors per chunk), ±0."""
    g = torch.Generator().manual_seed(1)
    V, k = 4099, 100
    if layout == "few-values":
        base = torch.randint(0, 4, (3, 5, V), generator=g).float()
    elif layout == "ascending":
        base = torch.arange(V, dtype=torch.float32).expand(3, 5, V) / 7
    elif layout == "one-hot-chunk":
        base = torch.randn(3, 5, V, generator=g)
        base[..., 1000:1000 + k] += 100  # the whole top-k in a few adjacent chunks
    elif layout == "all-equal":
        base = torch.full((3, 5, V), 2.5)
    else:
        base = torch.where(torch.rand(3, 5, V, generator=g) < 0.5, 0.0, -0.0)
    vals, ids = cpu_select_candidates(base, k)
    assert_is_topk(base, vals, ids)


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), float("-inf")])
def test_rows_with_nan_or_inf_follow_torch_topk(poison, chunk_layout):
    base = torch.randn(2, 3, 1031, generator=torch.Generator().manual_seed(2))
    base[0, 1, 17] = poison
    base[1, 2, 1030] = poison  # in the tail after the last full chunk
    vals, ids = cpu_select_candidates(base, 16)
    assert_is_topk(base, vals, ids)
    if poison != float("-inf"):  # NaN and +inf rank highest
        assert 17 in ids[0, 1].tolist() and 1030 in ids[1, 2].tolist()


def test_selection_takes_low_precision_logits_and_rejects_bad_k():
    base = (torch.randn(2, 7, 257, generator=torch.Generator().manual_seed(3)) * 3).to(BF16)
    vals, ids = cpu_select_candidates(base, 16)
    assert_is_topk(base, vals, ids)
    for k in (0, 258):
        with pytest.raises(DSparkTrtError, match="top-k"):
            cpu_select_candidates(base, k)
    empty_vals, empty_ids = cpu_select_candidates(torch.randn(0, 7, 257), 4)
    assert empty_vals.shape == empty_ids.shape == (0, 7, 4)
    with pytest.raises(DSparkTrtError, match="out buffers"):
        cpu_select_candidates(base, 16, out=(torch.empty(2, 7, 16), torch.empty(2, 7, 16)))  # ids must be int64


def run_walk(inputs, scale, *, splits_from_threads=None, monkeypatch=None):
    """The CPU walk on the op's inputs (contract order), outputs poisoned first so unwritten elements show."""
    vals, ids, anchor, w1, w2, d2t, temp, seed, pos, conf_base, conf_w = inputs
    B, N, k = vals.shape
    if splits_from_threads is not None:
        monkeypatch.setattr(cpu_walk, "_threads", lambda: splits_from_threads)
    out = (torch.full((B, N), -1, dtype=torch.int64), torch.full((B, N, k), float("nan")),
           torch.full((B, N), float("nan")))
    result = cpu_walk_candidates(vals, ids, anchor, w1, w2, logit_scale=scale, d2t=d2t, temperature=temp, seed=seed,
                                 positions=pos, conf_base=conf_base, conf_w_markov=conf_w, out=out)
    assert result.tokens is out[0] and result.cand_logits is out[1] and result.confidence is out[2]
    assert (out[0] >= 0).all() and not out[1].isnan().any() and not out[2].isnan().any()
    return result.tokens.to(torch.int32), result.cand_logits, result.confidence


# (V, V_d, r, k, N, B): odd vocabularies, r ∈ {8, 192}, k ∈ {1, 16, 512}, N ∈ {1, 7}, B ∈ {1, 5}
WALKS = [
    pytest.param(257, None, 8, 1, 7, 5, id="V257-r8-k1-N7-B5"),
    pytest.param(257, 101, 192, 16, 7, 5, id="V257-Vd101-r192-k16-N7-B5"),  # reduced vocab: d2t in the chain
    pytest.param(257, None, 8, 16, 1, 1, id="V257-r8-k16-N1-B1"),
    pytest.param(1031, 769, 192, 512, 7, 1, id="V1031-Vd769-r192-k512-N7-B1"),
    pytest.param(1031, None, 8, 512, 1, 5, id="V1031-r8-k512-N1-B5"),
]


@pytest.mark.parametrize("V, Vd, r, k, N, B", WALKS)
@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("mode, scale", [("greedy", 1.0), ("mixed", 0.5)])
@pytest.mark.parametrize("threads", [1, 8], ids=["request-per-task", "candidates-split"])
def test_walk_matches_reference(V, Vd, r, k, N, B, dtype, mode, scale, threads, monkeypatch):
    case = WalkCase(batch=B, steps=N, vocab=V, draft_vocab=Vd, rank=r, topk=k, logits_dtype=dtype,
                    weights_dtype=dtype, logit_scale=scale, mode=mode, seed=V + r + k + N + B)
    inputs = make_walk_inputs(case)
    got = run_walk(inputs, scale, splits_from_threads=threads, monkeypatch=monkeypatch)
    report = compare_walks(got, reference_op(*inputs, logit_scale=scale), inputs, **TOL)
    assert report["near_ties"] <= 1, report  # random fp32-scale data: near-ties are rare


@pytest.mark.parametrize("w1_dtype, w2_dtype", [(FP32, BF16), (BF16, FP32)], ids=["fp32-bf16", "bf16-fp32"])
def test_mixed_weight_dtypes(w1_dtype, w2_dtype):
    case = WalkCase(batch=5, steps=7, vocab=257, rank=192, topk=16, mode="sampled", seed=3)
    inputs = list(make_walk_inputs(case))
    inputs[3], inputs[4] = inputs[3].to(w1_dtype), inputs[4].to(w2_dtype)
    compare_walks(run_walk(inputs, 1.0), reference_op(*inputs, logit_scale=1.0), inputs, **TOL)


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_full_vocabulary_equals_dense_walk(mode):
    """k = V_d through the whole native round (selection + walk) equals the dense reference walk."""
    g = torch.Generator().manual_seed(11)
    B, N, V, r = 5, 7, 257, 8
    base, anchor = torch.randn(B, N, V, generator=g) * 3, torch.randint(0, V, (B,), generator=g)
    w1, w2 = torch.randn(V, r, generator=g) / r**0.5, torch.randn(V, r, generator=g)
    kw = dict(logit_scale=0.5, conf_base=torch.randn(B, N, generator=g), conf_w_markov=torch.randn(r, generator=g))
    if mode == "sampled":
        kw.update(temperature=torch.tensor([0.0, 0.7, 1e-5, 1.3, 5e-6]), seed=torch.arange(B) * 7,
                  positions=torch.arange(B) + 40)
    got = by_candidate_id(cpu_markov_walk(base, anchor, w1, w2, topk=V, **kw))
    want = markov_walk(base, anchor, w1, w2, topk=None, **kw)
    assert torch.equal(got.cand_ids, want.cand_ids)
    assert torch.equal(got.tokens, want.tokens)
    torch.testing.assert_close(got.cand_logits, want.cand_logits, **TOL)
    torch.testing.assert_close(got.confidence, want.confidence, **TOL)


def test_native_round_matches_the_reference_round_at_qwen3_vocabulary():
    """The shapes the runtime and the benchmark use: V = 151936, k = 512, a batch of 3, sampling mixed in."""
    g = torch.Generator().manual_seed(5)
    B, N, V, r, k = 3, 7, 151936, 64, 512
    base, anchor = torch.randn(B, N, V, generator=g) * 3, torch.randint(0, V, (B,), generator=g)
    w1, w2 = torch.randn(V, r, generator=g) / r**0.5, torch.randn(V, r, generator=g)
    kw = dict(temperature=torch.tensor([0.0, 0.9, 1.1]), seed=torch.tensor([1, 2, 3]),
              positions=torch.tensor([5, 6, 7]))
    got = by_candidate_id(cpu_markov_walk(base, anchor, w1, w2, topk=k, **kw))
    want = by_candidate_id(markov_walk(base, anchor, w1, w2, topk=k, **kw))
    assert torch.equal(got.cand_ids, want.cand_ids) and torch.equal(got.tokens, want.tokens)
    torch.testing.assert_close(got.cand_logits, want.cand_logits, **TOL)
    assert got.confidence is None


def test_tensors_that_require_grad_are_read_like_any_other():
    """A module's parameters (requires_grad) can be handed over directly, outside inference mode."""
    g = torch.Generator().manual_seed(8)
    B, N, V, r, k = 2, 3, 257, 8, 16
    base = (torch.randn(B, N, V, generator=g) * 3).requires_grad_()
    w1 = torch.nn.Parameter(torch.randn(V, r, generator=g) / r**0.5)
    w2 = torch.nn.Parameter(torch.randn(V, r, generator=g))
    anchor = torch.randint(0, V, (B,), generator=g)
    kw = dict(conf_base=torch.randn(B, N, generator=g, requires_grad=True), conf_w_markov=torch.randn(r, generator=g))
    got = by_candidate_id(cpu_markov_walk(base, anchor, w1, w2, topk=k, **kw))
    with torch.no_grad():
        want = by_candidate_id(markov_walk(base, anchor, w1, w2, topk=k, **kw))
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.cand_ids, want.cand_ids)
    torch.testing.assert_close(got.cand_logits, want.cand_logits, **TOL)


def test_bad_ids_and_d2t_are_refused_not_read():
    case = WalkCase(batch=2, steps=3, vocab=257, draft_vocab=101, rank=8, topk=16, seed=4)
    vals, ids, anchor, w1, w2, d2t, *_ = make_walk_inputs(case)
    with pytest.raises(DSparkTrtError, match=r"cand_ids must lie in \[0, 101\)"):
        cpu_walk_candidates(vals, ids.clone().fill_(101), anchor, w1, w2)
    with pytest.raises(DSparkTrtError, match=r"anchor must lie in \[0, 257\)"):
        cpu_walk_candidates(vals, ids, anchor - 1000, w1, w2)
    with pytest.raises(DSparkTrtError, match="d2t"):
        cpu_walk_candidates(vals, ids, anchor, w1, w2, d2t=d2t + 1000)
    with pytest.raises(DSparkTrtError, match="out buffers"):
        wrong_tokens = torch.empty(2, 3)  # must be int64
        cpu_walk_candidates(vals, ids, anchor, w1, w2, out=(wrong_tokens, torch.empty(2, 3, 16), torch.empty(2, 3)))
    with pytest.raises(DSparkTrtError, match="top-k candidates"):
        cpu_walk_candidates(vals, None, anchor, w1, w2)
    with pytest.raises(DSparkTrtError, match="seed and positions"):
        cpu_walk_candidates(vals, ids, anchor, w1, w2, temperature=torch.ones(2))
