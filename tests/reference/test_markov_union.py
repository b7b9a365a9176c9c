"""The candidate union (``--markov-topm M``): S_j = top-k(U_j) ∪ table[d_j], duplicates masked with −inf."""

from __future__ import annotations

import pytest
import torch

from dspark_trt.errors import DSparkTrtError
from dspark_trt.reference.markov import draft_to_target, markov_union_table, markov_walk
from dspark_trt.reference.verify import draft_probs
from tests.helpers import assert_walk_logits_match, walk_case


def union_dense(cand_ids: torch.Tensor, cand_logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B, N, k + M] union candidates → dense rows [B, N, vocab], −inf off the set (a masked duplicate never
    overwrites its id's value)."""
    out = torch.full((*cand_ids.shape[:-1], vocab), float("-inf"), dtype=cand_logits.dtype)
    return out.scatter_reduce(-1, cand_ids.to(torch.int64), cand_logits, reduce="amax")


def predecessors(anchor, tokens):
    return torch.cat((anchor.view(-1, 1), tokens[:, :-1]), dim=1)  # [B, N] target ids


@pytest.mark.parametrize("V, Vd, r, M", [(257, 257, 8, 1), (257, 131, 8, 16), (97, 97, 192, 97)])
def test_table_rows_are_the_m_largest_bias_entries(V, Vd, r, M):
    case = walk_case(V=V, Vd=Vd, r=r, seed=M)
    table = markov_union_table(case.w1, case.w2, M, logit_scale=case.scale, rows_per_chunk=50)
    assert table.shape == (V, M) and table.dtype == torch.int32
    bias = case.scale * case.w1.double() @ case.w2.double().T  # [V, V_d]
    got = bias.gather(-1, table.to(torch.int64)).sort(-1, descending=True).values
    torch.testing.assert_close(got, bias.topk(M, dim=-1).values, rtol=0, atol=1e-9)  # tie-robust: by value
    assert all(len(set(row.tolist())) == M for row in table)


def test_table_m_out_of_range_is_a_one_line_error():
    case = walk_case(V=17, r=4)
    with pytest.raises(DSparkTrtError, match="markov-topm 18 must be in"):
        markov_union_table(case.w1, case.w2, 18)


@pytest.mark.parametrize("sampling", [False, True], ids=["greedy", "probabilistic"])
@pytest.mark.parametrize("k", [1, 16])
def test_m_zero_is_the_plain_top_k_walk_bit_for_bit(sampling, k):
    case = walk_case(B=5, N=7, V=257, Vd=131, r=8, seed=k)
    plain = markov_walk(case.base, case.anchor, case.w1, case.w2, topk=k, **case.kwargs(sampling))
    empty = markov_union_table(case.w1, case.w2, 0)
    union = markov_walk(case.base, case.anchor, case.w1, case.w2, topk=k, union_table=empty, **case.kwargs(sampling))
    for name in ("tokens", "cand_ids", "cand_logits", "confidence"):
        assert torch.equal(getattr(union, name), getattr(plain, name)), name


@pytest.mark.parametrize("sampling", [False, True], ids=["greedy", "probabilistic"])
@pytest.mark.parametrize("V, Vd, k, M", [(257, 257, 257, 8), (257, 131, 1, 131), (97, 97, 40, 97)])
def test_a_union_covering_the_vocabulary_equals_dense(sampling, V, Vd, k, M):
    case = walk_case(B=5, N=7, V=V, Vd=Vd, r=8, seed=k + M)
    dense = markov_walk(case.base, case.anchor, case.w1, case.w2, topk=None, **case.kwargs(sampling))
    table = markov_union_table(case.w1, case.w2, M, logit_scale=case.scale)
    union = markov_walk(case.base, case.anchor, case.w1, case.w2, topk=k, union_table=table, **case.kwargs(sampling))
    assert union.cand_ids.shape == (5, 7, k + M)
    assert torch.equal(union.tokens, dense.tokens)
    assert_walk_logits_match(union.cand_ids, union.cand_logits, dense.cand_logits, dense.tokens, case)
    assert int(torch.isfinite(union.cand_logits).sum(-1).min()) == Vd  # every id exactly once, the rest masked
    assert torch.equal(union.confidence, dense.confidence)


@pytest.mark.parametrize("sampling", [False, True], ids=["greedy", "probabilistic"])
def test_the_set_is_topk_union_table_of_the_predecessor_and_nothing_else(sampling):
    case = walk_case(B=5, N=7, V=257, Vd=131, r=8, seed=3)
    k, M = 16, 8
    table = markov_union_table(case.w1, case.w2, M, logit_scale=case.scale)
    res = markov_walk(case.base, case.anchor, case.w1, case.w2, topk=k, union_table=table, **case.kwargs(sampling))
    top = torch.topk(case.base, k, dim=-1).indices  # [B, N, k]
    prev = predecessors(case.anchor, res.tokens)  # [B, N]
    want = case.base.double() + case.scale * torch.einsum("vr,bnr->bnv", case.w2.double(), case.w1.double()[prev])
    got = union_dense(res.cand_ids, res.cand_logits, 131)
    for b in range(5):
        for j in range(7):
            ids = set(top[b, j].tolist()) | set(table[prev[b, j]].tolist())
            finite = torch.isfinite(got[b, j]).nonzero().flatten().tolist()
            assert set(finite) == ids
            assert int(torch.isfinite(res.cand_logits[b, j]).sum()) == len(ids)  # duplicates masked once each
            torch.testing.assert_close(got[b, j, finite].double(), want[b, j, finite], rtol=1e-6, atol=1e-5)
            drafted = int(res.tokens[b, j])
            assert drafted in draft_to_target(torch.tensor(sorted(ids)), case.d2t).tolist()


def planted_case(k: int):
    """A token x far outside the base top-k that the Markov head makes the argmax after the anchor."""
    case = walk_case(B=2, N=3, V=257, r=8, seed=11, scale=1.0)
    x = int(case.base[0, 0].argsort()[50])  # rank ≥ 200 of 257 in slot 0's base logits
    a = int(case.anchor[0])
    case.w1[a] = 0.0
    case.w1[a, 0] = 1.0
    case.w2[:, 0] = 0.0
    case.w2[x, 0] = 100.0  # bias 100 on x after a, 0 on every other token
    assert x not in torch.topk(case.base[0, 0], k).indices.tolist()
    return case, x


@pytest.mark.parametrize("sampling", [False, True], ids=["greedy", "probabilistic"])
def test_a_planted_bias_is_drafted_with_the_union_and_missed_without_it(sampling):
    k = 16
    case, x = planted_case(k)
    opts = case.kwargs(sampling)
    opts.pop("d2t")
    plain = markov_walk(case.base, case.anchor, case.w1, case.w2, topk=k, **opts)
    dense = markov_walk(case.base, case.anchor, case.w1, case.w2, topk=None, **opts)
    table = markov_union_table(case.w1, case.w2, 4)
    union = markov_walk(case.base, case.anchor, case.w1, case.w2, topk=k, union_table=table, **opts)
    assert int(dense.tokens[0, 0]) == x
    assert int(union.tokens[0, 0]) == x
    assert int(plain.tokens[0, 0]) != x


def test_draft_probs_count_a_masked_duplicate_once():
    case = walk_case(B=5, N=7, V=97, r=8, seed=5)
    table = markov_union_table(case.w1, case.w2, 24, logit_scale=case.scale)
    res = markov_walk(case.base, case.anchor, case.w1, case.w2, topk=24, union_table=table, **case.kwargs())
    assert bool((~torch.isfinite(res.cand_logits)).any())  # the case has duplicates
    q = draft_probs(res.cand_logits, res.cand_ids, res.tokens, case.temperature)  # [B, N, k + M]
    torch.testing.assert_close(q.sum(-1), torch.ones(5, 7))
    assert bool((q[~torch.isfinite(res.cand_logits)] == 0).all())
    greedy = draft_probs(res.cand_logits, res.cand_ids, res.tokens, None)
    assert torch.equal(greedy.sum(-1), torch.ones(5, 7))  # one-hot at the drawable copy only


def test_union_errors_are_one_line():
    case = walk_case(V=17, r=4)
    table = markov_union_table(case.w1, case.w2, 2)
    with pytest.raises(DSparkTrtError, match="needs a top-k head"):
        markov_walk(case.base, case.anchor, case.w1, case.w2, topk=None, union_table=table)
