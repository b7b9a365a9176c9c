"""The Numba CPU walk with the candidate union (``union_table``) against ``reference.markov``."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("numba")

from dspark_trt.errors import DSparkTrtError  # noqa: E402
from dspark_trt.plugins.cpu_walk import cpu_markov_walk, cpu_walk_candidates  # noqa: E402
from dspark_trt.reference.markov import markov_union_table, markov_walk, select_candidates  # noqa: E402
from dspark_trt.reference.sampling import DRAFT_SALT, gumbel_noise, noise_prefix  # noqa: E402
from tests.helpers import walk_case  # noqa: E402

TOL = dict(atol=2e-5, rtol=1e-5)


def test_the_kernels_gumbel_hash_is_the_references():
    from dspark_trt.plugins.cpu_walk import _gumbel

    seed, pos, tok = torch.tensor([0, 7, 2**40]), torch.tensor([0, 5, 123456]), torch.tensor([0, 151935, 3])
    want = gumbel_noise(seed, pos, tok, DRAFT_SALT)
    prefix = noise_prefix(seed, pos, DRAFT_SALT)
    got = torch.tensor([float(_gumbel(int(p), int(t))) for p, t in zip(prefix, tok)])
    torch.testing.assert_close(got, want, rtol=2e-7, atol=2e-7)


@pytest.mark.parametrize("sampling", [False, True], ids=["greedy", "probabilistic"])
@pytest.mark.parametrize("V, Vd, r, k, M, B", [(257, 257, 8, 1, 16, 5), (257, 131, 8, 16, 8, 5),
                                               (97, 97, 192, 16, 97, 1), (4099, 4099, 16, 512, 32, 2)])
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_cpu_union_walk_equals_the_reference(sampling, V, Vd, r, k, M, B, bf16):
    case = walk_case(B=B, N=7, V=V, Vd=Vd, r=r, seed=k + M)
    w1, w2 = (case.w1.bfloat16(), case.w2.bfloat16()) if bf16 else (case.w1, case.w2)
    table = markov_union_table(w1, w2, M, logit_scale=case.scale)
    opts = case.kwargs(sampling)
    vals, ids = select_candidates(case.base, k)  # the same candidate order on both sides
    want = markov_walk(case.base, case.anchor, w1, w2, topk=k, union_table=table, **opts)
    got = cpu_walk_candidates(vals, ids, case.anchor, w1, w2, union_table=table, base_logits=case.base, **opts)
    assert got.union_width == M and got.cand_ids.shape == want.cand_ids.shape
    assert torch.equal(got.tokens, want.tokens)
    assert torch.equal(got.cand_ids, want.cand_ids)
    torch.testing.assert_close(got.cand_logits, want.cand_logits, **TOL)  # −inf at the same masked duplicates
    torch.testing.assert_close(got.confidence, want.confidence, **TOL)


def test_cpu_markov_walk_with_the_union_drafts_a_planted_bias():
    from tests.reference.test_markov_union import planted_case

    case, x = planted_case(16)
    table = markov_union_table(case.w1, case.w2, 4)
    plain = cpu_markov_walk(case.base, case.anchor, case.w1, case.w2, topk=16)
    union = cpu_markov_walk(case.base, case.anchor, case.w1, case.w2, topk=16, union_table=table)
    assert int(union.tokens[0, 0]) == x and int(plain.tokens[0, 0]) != x


def test_union_inputs_are_checked():
    case = walk_case(V=17, r=4)
    vals, ids = select_candidates(case.base, 4)
    bad = torch.full((17, 2), 99, dtype=torch.int32)
    with pytest.raises(DSparkTrtError, match=r"union_table holds ids outside \[0, 17\)"):
        cpu_walk_candidates(vals, ids, case.anchor, case.w1, case.w2, union_table=bad, base_logits=case.base)
    with pytest.raises(DSparkTrtError, match="needs the base logits"):
        cpu_walk_candidates(vals, ids, case.anchor, case.w1, case.w2, union_table=bad.clamp(max=3))
