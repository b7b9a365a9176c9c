"""The verifier: losslessness (chi-square, with a deliberately wrong q to show the test has power) and edges."""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from dspark_trt.reference.sampling import DRAFT_SALT, gumbel_noise
from dspark_trt.reference.verify import draft_probs, sample_tokens, verify_drafts

V, N, TRIALS = 7, 2, 40000


def synthetic_round(k: int, *, greedy_draft: bool = False, seed: int = 0):
    """A context-free target (fixed p_1..p_{N+1}) and a draft distribution over k candidates per slot,
    replicated over TRIALS requests that differ only in their seed."""
    gen = torch.Generator().manual_seed(seed)
    target = 1.2 * torch.randn(1, N + 1, V, generator=gen).expand(TRIALS, N + 1, V)
    cand_ids = torch.stack([torch.randperm(V, generator=gen)[:k] for _ in range(N)]).expand(TRIALS, N, k)
    cand_logits = 1.5 * torch.randn(1, N, k, generator=gen).expand(TRIALS, N, k)
    T = torch.full((TRIALS,), 1.0)
    seeds = torch.arange(TRIALS)
    positions = torch.full((TRIALS,), 40)
    if greedy_draft:
        tokens = cand_ids.gather(-1, cand_logits.argmax(-1, keepdim=True)).squeeze(-1)
        q = draft_probs(cand_logits, cand_ids, tokens, torch.zeros(TRIALS))
    else:  # sample each slot's draft token from q with the draft stream, as the Markov walk does
        steps = torch.arange(N).view(1, N, 1)
        g = gumbel_noise(seeds.view(-1, 1, 1), positions.view(-1, 1, 1) + steps, cand_ids, DRAFT_SALT)
        tokens = cand_ids.gather(-1, (cand_logits + g).argmax(-1, keepdim=True)).squeeze(-1)
        q = draft_probs(cand_logits, cand_ids, tokens, T)
    return target, tokens, cand_ids, cand_logits, q, T, seeds, positions


def first_token_pvalue(target, emitted_first, T):
    p1 = torch.softmax(target[0, 0].double() / T[0].double(), -1)
    observed = torch.bincount(emitted_first, minlength=V).double()
    support = p1 > 1e-12
    if observed[~support].sum() > 0:  # a token the target cannot produce
        return 0.0
    expected = p1[support] / p1[support].sum() * observed.sum()
    return stats.chisquare(observed[support].numpy(), expected.numpy()).pvalue


@pytest.mark.parametrize("k, greedy_draft", [(V, False), (3, False), (1, False), (3, True)],
                         ids=["dense-q", "topk-q", "k1", "greedy-draft"])
def test_first_emitted_token_follows_the_target(k, greedy_draft):
    target, tokens, ids, _, q, T, seeds, pos = synthetic_round(k, greedy_draft=greedy_draft, seed=k)
    res = verify_drafts(target, tokens, ids, q, temperature=T, seed=seeds, positions=pos)
    assert first_token_pvalue(target, res.tokens[:, 0], T) > 1e-4
    assert 0 < float(res.num_accepted.float().mean()) < N  # both accept and reject paths were taken


def test_the_chi_square_catches_a_mishandled_q():
    """Hand the verifier the wrong q (the untruncated softmax over all candidates before top-k): rejected."""
    target, tokens, ids, logits, _, T, seeds, pos = synthetic_round(V, seed=5)
    k = 3
    top = logits.topk(k, dim=-1).indices  # the draft really samples from the top-3 only ...
    ids_k, logits_k = ids.gather(-1, top), logits.gather(-1, top)
    steps = torch.arange(N).view(1, N, 1)
    g = gumbel_noise(seeds.view(-1, 1, 1), pos.view(-1, 1, 1) + steps, ids_k, DRAFT_SALT)
    tokens = ids_k.gather(-1, (logits_k + g).argmax(-1, keepdim=True)).squeeze(-1)
    right = draft_probs(logits_k, ids_k, tokens, T)
    wrong = draft_probs(logits, ids, tokens, T)  # ... but the verifier is told the dense q
    ok = verify_drafts(target, tokens, ids_k, right, temperature=T, seed=seeds, positions=pos)
    bad = verify_drafts(target, tokens, ids, wrong, temperature=T, seed=seeds, positions=pos)
    assert first_token_pvalue(target, ok.tokens[:, 0], T) > 1e-4
    assert first_token_pvalue(target, bad.tokens[:, 0], T) < 1e-6


def test_draft_equal_to_target_is_always_accepted():
    target, tokens, ids, logits, q, T, seeds, pos = synthetic_round(V, seed=6)
    same = torch.full_like(target, -1e9)
    same[:, :N].scatter_(-1, ids, logits)  # p_j == q_j exactly
    same[:, N] = target[:, N]
    res = verify_drafts(same, tokens, ids, q, temperature=T, seed=seeds, positions=pos)
    assert bool((res.num_accepted == N).all())
    assert torch.equal(res.tokens[:, :N], tokens)


def test_disjoint_supports_reject_at_slot_one_and_emit_from_p1():
    target, tokens, ids, logits, q, T, seeds, pos = synthetic_round(2, seed=7)
    disjoint = target.clone()
    disjoint[:, 0].scatter_(-1, ids[:, 0], -1e9)  # p_1 is zero on the draft's support
    res = verify_drafts(disjoint, tokens, ids, q, temperature=T, seed=seeds, positions=pos)
    assert bool((res.num_accepted == 0).all())
    assert not bool((res.tokens[:, :1] == ids[:, 0]).any())  # never a token p_1 cannot produce
    assert bool((res.tokens[:, 1:] == -1).all())
    assert first_token_pvalue(disjoint, res.tokens[:, 0], T) > 1e-4


def test_greedy_verification_accepts_the_argmax_prefix():
    gen = torch.Generator().manual_seed(8)
    B, n = 4, 5
    target = torch.randn(B, n + 1, 50, generator=gen)
    argmax = target.argmax(-1)
    drafts = argmax[:, :n].clone()
    drafts[0, 0] = (drafts[0, 0] + 1) % 50  # reject at once
    drafts[1, 3] = (drafts[1, 3] + 1) % 50  # partial
    drafts[3, 1] = (drafts[3, 1] + 1) % 50  # partial; row 2 accepts all
    ids = drafts.unsqueeze(-1)
    res = verify_drafts(target, drafts, ids, torch.ones(B, n, 1), temperature=None)
    assert res.num_accepted.tolist() == [0, 3, n, 1]
    for b, a in enumerate(res.num_accepted.tolist()):
        assert res.tokens[b, :a].tolist() == drafts[b, :a].tolist()
        assert int(res.tokens[b, a]) == int(argmax[b, a])  # correction or bonus = target argmax
        assert bool((res.tokens[b, a + 1:] == -1).all())


def test_bonus_token_is_what_the_target_alone_would_sample():
    target, tokens, ids, logits, q, T, seeds, pos = synthetic_round(V, seed=9)
    same = torch.full_like(target, -1e9)
    same[:, :N].scatter_(-1, ids, logits)
    same[:, N] = target[:, N]
    res = verify_drafts(same, tokens, ids, q, temperature=T, seed=seeds, positions=pos)
    alone = sample_tokens(target[:, N], T, seeds, pos + N)
    assert torch.equal(res.tokens[:, N], alone)


def test_sample_tokens_greedy_rows_take_the_argmax():
    logits = torch.randn(3, 11, generator=torch.Generator().manual_seed(10))
    T = torch.tensor([0.0, 1.0, 0.0])
    out = sample_tokens(logits, T, torch.tensor([1, 2, 3]), torch.tensor([5, 5, 5]))
    assert out[0] == logits[0].argmax() and out[2] == logits[2].argmax()


def truncated_first_token_pvalue(target, emitted_first, T, top_k, top_p):
    """As first_token_pvalue, against p_1 truncated by top-k / top-p (the reference definition)."""
    from dspark_trt.reference.sampling import truncation_mask

    z = target[:1, 0] / T[0]
    keep = truncation_mask(z, torch.tensor([top_k]), torch.tensor([top_p]))[0]
    cut = torch.where(keep, z, float("-inf"))
    if int(keep.sum()) == 1:  # one token left: a chi-square has no degrees of freedom
        return float(bool((emitted_first == int(keep.nonzero())).all()))
    return first_token_pvalue(cut.view(1, 1, V).expand(1, N + 1, V), emitted_first, torch.ones(1))


TRUNCATIONS = [(3, 1.0), (0, 0.7), (4, 0.8), (1, 1.0)]


@pytest.mark.parametrize("k, top_k, top_p", [(V, 3, 1.0), (3, 0, 0.7), (V, 4, 0.8), (3, 1, 1.0)],
                         ids=["dense-q-top3", "topk-q-p0.7", "dense-q-top4-p0.8", "topk-q-top1"])
def test_first_emitted_token_follows_the_truncated_target(k, top_k, top_p):
    target, tokens, ids, _, q, T, seeds, pos = synthetic_round(k, seed=20 + k)
    tk, tp = torch.full((TRIALS,), top_k), torch.full((TRIALS,), top_p)
    res = verify_drafts(target, tokens, ids, q, temperature=T, seed=seeds, positions=pos, top_k=tk, top_p=tp)
    assert truncated_first_token_pvalue(target, res.tokens[:, 0], T, top_k, top_p) > 1e-4
    if top_k != 1:
        assert 0 < float(res.num_accepted.float().mean())  # drafts inside the truncated support are accepted
    # the untruncated verifier on the same round: its tokens leave the truncated support, and the test sees it
    plain = verify_drafts(target, tokens, ids, q, temperature=T, seed=seeds, positions=pos)
    assert truncated_first_token_pvalue(target, plain.tokens[:, 0], T, top_k, top_p) < 1e-6


def test_truncated_bonus_token_is_what_the_truncated_target_alone_would_sample():
    target, tokens, ids, logits, q, T, seeds, pos = synthetic_round(V, seed=9)
    same = torch.full_like(target, -1e9)
    same[:, :N].scatter_(-1, ids, logits)
    same[:, N] = target[:, N]
    tk, tp = torch.full((TRIALS,), V), torch.full((TRIALS,), 0.6)  # k = V: only top-p truncates
    res = verify_drafts(same, tokens, ids, q, temperature=T, seed=seeds, positions=pos, top_k=tk, top_p=tp)
    accepted_all = res.num_accepted == N
    assert int(accepted_all.sum()) > 1000
    alone = sample_tokens(target[:, N], T, seeds, pos + N, top_k=tk, top_p=tp)
    assert torch.equal(res.tokens[accepted_all, N], alone[accepted_all])
    assert not torch.equal(alone, sample_tokens(target[:, N], T, seeds, pos + N))  # truncation did something


@pytest.mark.parametrize("top_k, top_p", TRUNCATIONS, ids=["top3", "p0.7", "top4-p0.8", "top1"])
def test_sample_tokens_follows_the_truncated_softmax(top_k, top_p):
    target = synthetic_round(V, seed=30)[0]
    T, seeds, pos = torch.full((TRIALS,), 1.0), torch.arange(TRIALS), torch.full((TRIALS,), 3)
    out = sample_tokens(target[:, 0], T, seeds, pos, top_k=torch.full((TRIALS,), top_k),
                        top_p=torch.full((TRIALS,), top_p))
    assert truncated_first_token_pvalue(target, out, T, top_k, top_p) > 1e-4
    mixed = torch.tensor([0.0, 1.0])  # a greedy row ignores truncation: its argmax is always kept
    two = sample_tokens(target[:2, 0], mixed, seeds[:2], pos[:2], top_k=torch.tensor([2, 2]),
                        top_p=torch.tensor([0.5, 0.5]))
    assert int(two[0]) == int(target[0, 0].argmax())
