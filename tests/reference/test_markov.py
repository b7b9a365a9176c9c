"""The Markov walk, dense and top-k: docs/dspark.md §10 items 1–6 and the odd-shape / dtype matrix."""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from dspark_trt.errors import DSparkTrtError
from dspark_trt.reference.markov import draft_to_target, markov_walk, walk_candidates
from dspark_trt.reference.verify import draft_probs
from tests.helpers import assert_walk_logits_match, index_overlap, scatter_dense, walk_case


def predecessors(case, tokens):
    """d_0 = anchor, d_j = tokens[:, j-1]: [B, N] target ids."""
    return torch.cat((case.anchor.view(-1, 1), tokens[:, :-1]), dim=1)


@pytest.mark.parametrize("sampling", [False, True], ids=["greedy", "probabilistic"])
@pytest.mark.parametrize("V, Vd, r, N", [(257, 257, 8, 7), (257, 131, 8, 1), (97, 97, 192, 4)])
def test_topk_at_full_vocab_equals_dense(sampling, V, Vd, r, N):
    """k = V_d drafts the dense walk's tokens exactly; the corrected logits agree up to the summation order of
    the bias (dense: one GEMM over V_d; top-k: a batched GEMV over the gathered rows — BLAS sums them in
    machine-dependent orders), which ``assert_walk_logits_match`` bounds from the fp32 unit roundoff."""
    case = walk_case(B=5, N=N, V=V, Vd=Vd, r=r, seed=V + r + N)
    dense = markov_walk(case.base, case.anchor, case.w1, case.w2, topk=None, **case.kwargs(sampling))
    full = markov_walk(case.base, case.anchor, case.w1, case.w2, topk=Vd, **case.kwargs(sampling))
    assert torch.equal(full.tokens, dense.tokens)
    assert sorted(full.cand_ids[0, 0].tolist()) == list(range(Vd))  # every draft id once
    assert_walk_logits_match(full.cand_ids, full.cand_logits, dense.cand_logits, dense.tokens, case)
    assert torch.equal(full.confidence, dense.confidence)  # same [B, r] @ [r] on both paths


@pytest.mark.parametrize("V, Vd, r, N", [(257, 257, 8, 7), (97, 97, 192, 4)])
def test_the_full_vocab_comparison_catches_one_dropped_bias(V, Vd, r, N):
    """The tolerance above is tight enough to see a real bug: one candidate scored without its Markov bias."""
    case = walk_case(B=5, N=N, V=V, Vd=Vd, r=r, seed=V + r + N)
    dense = markov_walk(case.base, case.anchor, case.w1, case.w2, topk=None, **case.kwargs(False))
    full = markov_walk(case.base, case.anchor, case.w1, case.w2, topk=Vd, **case.kwargs(False))
    b, j, i = 2, N - 1, 5
    dropped = full.cand_logits.clone()
    dropped[b, j, i] = case.base[b, j, full.cand_ids[b, j, i]]  # U only: the bias s · W2[id] · W1[d_j] lost
    assert abs(float(dropped[b, j, i] - full.cand_logits[b, j, i])) > 1e-3  # construction: a bias that matters
    with pytest.raises(AssertionError, match="1 of .* differ by more than fp32 summation order allows"):
        assert_walk_logits_match(full.cand_ids, dropped, dense.cand_logits, dense.tokens, case)


@pytest.mark.parametrize("k", [1, 16, 100])
@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_candidates_are_base_plus_scaled_bias_and_nothing_else(k, scale):
    case = walk_case(B=3, N=7, V=257, r=8, seed=k, scale=scale)
    res = markov_walk(case.base, case.anchor, case.w1, case.w2, topk=k, **case.kwargs())
    # the candidates are the top-k of the base logits (tie-robust: values at the returned ids)
    ref_vals, ref_ids = torch.topk(case.base, k, dim=-1)
    assert index_overlap(res.cand_ids, ref_ids) == 1.0
    # each step: base + s · W2[idx] · W1[prev], prev = the previous drafted target id
    prev = predecessors(case, res.tokens)  # [B, N]
    want = case.base.gather(-1, res.cand_ids).double() + scale * torch.einsum(
        "bnkr,bnr->bnk", case.w2.double()[res.cand_ids], case.w1.double()[prev]
    )
    torch.testing.assert_close(res.cand_logits.double(), want, rtol=1e-6, atol=1e-5)
    dense_row = scatter_dense(res.cand_ids, res.cand_logits, 257)
    assert int(torch.isfinite(dense_row).sum(-1).min()) == k == int(torch.isfinite(dense_row).sum(-1).max())


def test_greedy_picks_the_argmax_within_the_candidates():
    case = walk_case(B=4, N=7, V=257, r=8, seed=7)
    res = markov_walk(case.base, case.anchor, case.w1, case.w2, topk=16, logit_scale=case.scale)
    best = res.cand_ids.gather(-1, res.cand_logits.argmax(-1, keepdim=True)).squeeze(-1)
    assert torch.equal(res.tokens, best)


def test_greedy_topk_equals_dense_when_the_dense_winner_is_a_candidate():
    case = walk_case(B=5, N=7, V=257, r=8, seed=8, scale=0.1)  # small bias: winners stay in the top-k
    dense = markov_walk(case.base, case.anchor, case.w1, case.w2, logit_scale=case.scale)
    topk = markov_walk(case.base, case.anchor, case.w1, case.w2, topk=32, logit_scale=case.scale)
    in_set = (topk.cand_ids == dense.tokens.unsqueeze(-1)).any(-1)  # [B, N]
    first_miss = (~in_set).to(torch.int64).cumsum(1) == 0  # slots before any miss share their prefix
    assert bool(first_miss[:, 0].all()), "construction: the first slot's dense winner must be a candidate"
    assert torch.equal(topk.tokens[first_miss], dense.tokens[first_miss])


def test_bias_promoted_token_outside_the_topk_is_never_picked():
    """Caveat §8.3.1, documented as a test: top-k cannot pick a token the bias promotes from outside S_j."""
    case = walk_case(B=1, N=1, V=257, r=8, seed=9, scale=1.0)
    outside = int(case.base[0, 0].argsort()[0])  # the lowest base logit: never in the top-k
    case.w2[outside] = 100.0 * case.w1[case.anchor[0]]  # its bias dwarfs every base logit
    dense = markov_walk(case.base, case.anchor, case.w1, case.w2)
    topk = markov_walk(case.base, case.anchor, case.w1, case.w2, topk=16)
    assert int(dense.tokens[0, 0]) == outside
    assert int(topk.tokens[0, 0]) != outside and outside not in topk.cand_ids[0, 0].tolist()


@pytest.mark.parametrize("k", [1, 5, 257])
def test_zero_bias_reduces_to_argmax_of_base_logits(k):
    case = walk_case(B=3, N=7, V=257, r=8, seed=10)
    w2 = torch.zeros_like(case.w2)
    res = markov_walk(case.base, case.anchor, case.w1, w2, topk=k, logit_scale=case.scale)
    assert torch.equal(res.tokens, case.base.argmax(-1))


def test_predecessor_alignment():
    """Slot 0 reads W1[anchor]; slot j reads W1[d_j]; unrelated W1 rows change nothing (docs/dspark.md §10.5)."""
    case = walk_case(B=1, N=4, V=257, r=8, seed=11)
    base = markov_walk(case.base, case.anchor, case.w1, case.w2, topk=16, logit_scale=case.scale)
    used = set(case.anchor.tolist()) | set(base.tokens[0, :-1].tolist())
    unrelated = next(t for t in range(257) if t not in used)
    w1 = case.w1.clone()
    w1[unrelated] += 10.0
    same = markov_walk(case.base, case.anchor, w1, case.w2, topk=16, logit_scale=case.scale)
    assert torch.equal(same.cand_logits, base.cand_logits) and torch.equal(same.tokens, base.tokens)
    w1 = case.w1.clone()
    w1[case.anchor[0]] += 1.0
    moved = markov_walk(case.base, case.anchor, w1, case.w2, topk=16, logit_scale=case.scale)
    assert not torch.allclose(moved.cand_logits[0, 0], base.cand_logits[0, 0])


def test_reduced_vocab_maps_tokens_and_feeds_target_ids_to_w1():
    case = walk_case(B=4, N=7, V=257, Vd=100, r=8, seed=12)
    res = markov_walk(case.base, case.anchor, case.w1, case.w2, topk=16, **case.kwargs())
    chosen_draft = res.cand_ids.gather(-1, res.cand_logits.argmax(-1, keepdim=True)).squeeze(-1)
    greedy = case.temperature < 1e-5
    assert torch.equal(res.tokens[greedy], draft_to_target(chosen_draft, case.d2t)[greedy])
    allowed = set(draft_to_target(torch.arange(100), case.d2t).tolist())
    assert set(res.tokens.flatten().tolist()) <= allowed
    prev = predecessors(case, res.tokens)
    want = case.base.gather(-1, res.cand_ids) + case.scale * torch.einsum(
        "bnkr,bnr->bnk", case.w2[res.cand_ids], case.w1[prev]
    )
    torch.testing.assert_close(res.cand_logits, want, rtol=1e-5, atol=1e-5)


def test_confidence_uses_the_step_predecessor():
    case = walk_case(B=3, N=7, V=257, r=8, seed=13)
    res = markov_walk(case.base, case.anchor, case.w1, case.w2, topk=16, **case.kwargs())
    prev = predecessors(case, res.tokens)
    want = torch.sigmoid(case.conf_base + case.w1[prev] @ case.conf_w)
    torch.testing.assert_close(res.confidence, want)


def test_topk_q_is_the_dense_q_restricted_and_renormalised():
    """§8.2: softmax over the candidates = dense corrected softmax restricted to S_j, renormalised."""
    case = walk_case(B=1, N=1, V=257, r=8, seed=14)
    T = torch.tensor([0.8])
    kw = dict(logit_scale=case.scale, temperature=T, seed=case.seed[:1], positions=case.positions[:1])
    dense = markov_walk(case.base, case.anchor, case.w1, case.w2, **kw)
    topk = markov_walk(case.base, case.anchor, case.w1, case.w2, topk=16, **kw)
    q_dense = torch.softmax(dense.cand_logits / 0.8, -1)[0, 0]  # [V_d]
    restricted = q_dense[topk.cand_ids[0, 0]]
    q_topk = draft_probs(topk.cand_logits, topk.cand_ids, topk.tokens, T)[0, 0]
    torch.testing.assert_close(q_topk, restricted / restricted.sum())


def test_probabilistic_draft_samples_its_q():
    """Across seeds, slot 0's token follows q̃ = softmax(Z/T) over the candidates (chi-square)."""
    n, k = 20000, 8
    case = walk_case(B=1, N=1, V=97, r=8, seed=15)
    base = case.base.expand(n, 1, 97)
    T = torch.full((n,), 1.3)
    res = markov_walk(base, case.anchor.expand(n), case.w1, case.w2, topk=k, logit_scale=case.scale,
                      temperature=T, seed=torch.arange(n), positions=torch.full((n,), 77))
    q = draft_probs(res.cand_logits[:1], res.cand_ids[:1], res.tokens[:1], T[:1])[0, 0].double()
    q = q / q.sum()
    ids = res.cand_ids[0, 0].tolist()
    observed = torch.tensor([(res.tokens[:, 0] == i).sum().item() for i in ids], dtype=torch.float64)
    assert observed.sum() == n  # every sample is a candidate
    assert stats.chisquare(observed.numpy(), (q * n).numpy()).pvalue > 1e-4


def test_same_seed_same_tokens_different_seed_different_samples():
    case = walk_case(B=4, N=7, V=257, r=8, seed=16)
    T = torch.ones(4)
    run = lambda s: markov_walk(case.base, case.anchor, case.w1, case.w2, topk=64, logit_scale=case.scale,
                                temperature=T, seed=s, positions=case.positions).tokens
    assert torch.equal(run(case.seed), run(case.seed.clone()))
    assert not torch.equal(run(case.seed), run(case.seed + 1))


def test_greedy_requests_ignore_noise_in_a_mixed_batch():
    case = walk_case(B=5, N=7, V=257, r=8, seed=17)
    mixed = markov_walk(case.base, case.anchor, case.w1, case.w2, topk=16, **case.kwargs())
    greedy = markov_walk(case.base, case.anchor, case.w1, case.w2, topk=16, logit_scale=case.scale, d2t=case.d2t)
    rows = case.temperature < 1e-5
    assert torch.equal(mixed.tokens[rows], greedy.tokens[rows])


# Per-dtype tolerances for walks over bf16 weights/logits, each with its reason.
DTYPE_TOL = {
    torch.float32: (1e-6, 1e-5),  # fp32 in, fp32 accumulate: only summation order differs
    torch.bfloat16: (0.0, 0.0),  # the walk upcasts bf16 inputs to fp32 first: exact vs fp32 on rounded inputs
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [1, 16, 257])
@pytest.mark.parametrize("N", [1, 7])
def test_odd_shapes_and_dtypes(dtype, k, N):
    case = walk_case(B=3, N=N, V=257, r=8, seed=k * N, dtype=dtype)
    rtol, atol = DTYPE_TOL[dtype]
    res = markov_walk(case.base, case.anchor, case.w1, case.w2, topk=k, **case.kwargs())
    f32 = markov_walk(case.base.float(), case.anchor, case.w1.float(), case.w2.float(), topk=k, **case.kwargs())
    assert res.cand_logits.dtype == torch.float32 and res.tokens.shape == (3, N) and res.cand_ids.shape == (3, N, k)
    torch.testing.assert_close(res.cand_logits, f32.cand_logits, rtol=rtol, atol=atol)
    assert torch.equal(res.tokens, f32.tokens)


def test_walk_candidates_accepts_int32_candidates_like_tensorrt_topk():
    case = walk_case(B=2, N=7, V=257, r=8, seed=18)
    vals, ids = torch.topk(case.base, 16, dim=-1)
    a = walk_candidates(vals, ids, case.anchor, case.w1, case.w2, **case.kwargs())
    b = walk_candidates(vals, ids.to(torch.int32), case.anchor.to(torch.int32), case.w1, case.w2, **case.kwargs())
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.cand_logits, b.cand_logits)


def test_candidate_order_is_irrelevant():
    case = walk_case(B=3, N=7, V=257, r=8, seed=19)
    vals, ids = torch.topk(case.base, 16, dim=-1)
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(0))
    a = walk_candidates(vals, ids, case.anchor, case.w1, case.w2, **case.kwargs())
    b = walk_candidates(vals[..., perm], ids[..., perm], case.anchor, case.w1, case.w2, **case.kwargs())
    assert torch.equal(a.tokens, b.tokens)
    torch.testing.assert_close(scatter_dense(a.cand_ids, a.cand_logits, 257), scatter_dense(b.cand_ids, b.cand_logits, 257))


@pytest.mark.parametrize("k", [0, 258])
def test_topk_outside_the_draft_vocabulary_is_refused(k):
    case = walk_case(B=1, N=2, V=257, r=8)
    with pytest.raises(DSparkTrtError, match="top-k .* must be in"):
        markov_walk(case.base, case.anchor, case.w1, case.w2, topk=k)


def test_temperature_without_noise_key_is_refused():
    case = walk_case(B=1, N=2, V=257, r=8)
    with pytest.raises(DSparkTrtError, match="seed and positions"):
        markov_walk(case.base, case.anchor, case.w1, case.w2, topk=4, temperature=torch.ones(1))


def test_noise_key_is_seed_position_of_the_drafted_token_and_draft_id():
    """Step j draws Gumbel noise keyed by (seed, position of d_{j+1} = positions + j, candidate draft id)."""
    from dspark_trt.reference.sampling import DRAFT_SALT, gumbel_noise

    case = walk_case(B=4, N=7, V=257, Vd=100, r=8, seed=20)
    T = torch.tensor([0.5, 1.0, 2.0, 1.0])
    res = markov_walk(case.base, case.anchor, case.w1, case.w2, topk=32, logit_scale=case.scale, d2t=case.d2t,
                      temperature=T, seed=case.seed, positions=case.positions)
    steps = torch.arange(7).view(1, 7, 1)
    g = gumbel_noise(case.seed.view(4, 1, 1), case.positions.view(4, 1, 1) + steps, res.cand_ids, DRAFT_SALT)
    pick = (res.cand_logits / T.view(4, 1, 1) + g).argmax(-1, keepdim=True)
    assert torch.equal(res.tokens, draft_to_target(res.cand_ids.gather(-1, pick).squeeze(-1), case.d2t))
