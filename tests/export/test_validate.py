"""The comparison rules of export validation: they pass on agreement and fail on each kind of disagreement."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dspark_trt.export.validate import TOLERANCES, compare_context, compare_draft
from dspark_trt.reference.markov import markov_walk


def walk(seed=0, B=3, N=5, V=257, r=8, k=16, temperature=None, bias_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(B, N, V, generator=g) * 3
    w1, w2 = torch.randn(V, r, generator=g), torch.randn(V, r, generator=g) * bias_scale
    anchor = torch.randint(0, V, (B,), generator=g)
    seeds, positions = torch.arange(B) + 11, torch.arange(B) * 7 + 1
    result = markov_walk(base, anchor, w1, w2, topk=k, temperature=temperature, seed=seeds, positions=positions,
                         conf_base=torch.randn(B, N, generator=g), conf_w_markov=torch.randn(r, generator=g))
    return result, dict(temperature=temperature, seed=seeds, positions=positions)


def copy(result, **changes):
    return dataclasses.replace(result, **{k: v.clone() for k, v in changes.items()})


def failed(checks):
    return [c.name.split()[-1] for c in checks if not c.ok]


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_agreement_passes_even_with_permuted_candidates(dtype):
    ref, noise = walk(temperature=torch.tensor([0.0, 1.0, 0.5]))
    perm = torch.randperm(16)
    got = copy(ref, cand_ids=ref.cand_ids[..., perm], cand_logits=ref.cand_logits[..., perm])
    assert failed(compare_draft(got, ref, TOLERANCES[dtype], vocab=257, **noise)) == []


def test_poisoned_logits_fail():
    ref, noise = walk()
    logits = ref.cand_logits.clone()
    logits[1, 2, 3] = float("nan")
    assert failed(compare_draft(copy(ref, cand_logits=logits), ref, TOLERANCES["fp32"], vocab=257)) == ["cand_logits"]
    logits[1, 2, 3] = ref.cand_logits[1, 2, 3] + 1e-3  # above fp32's tolerance, below bf16's
    assert failed(compare_draft(copy(ref, cand_logits=logits), ref, TOLERANCES["fp32"], vocab=257)) == ["cand_logits"]
    assert failed(compare_draft(copy(ref, cand_logits=logits), ref, TOLERANCES["bf16"], vocab=257)) == []


def test_neg_inf_compares_equal():
    ref, _ = walk()
    logits = ref.cand_logits.clone()
    logits[0, 0, 0] = float("-inf")
    same = copy(ref, cand_logits=logits)
    assert failed(compare_draft(same, same, TOLERANCES["fp32"], vocab=257)) == []
    checks = compare_context(torch.tensor([float("-inf"), 1.0]), torch.ones(2), torch.tensor([float("-inf"), 1.0]),
                             torch.ones(2), TOLERANCES["fp32"])
    assert all(c.ok for c in checks)
    checks = compare_context(torch.tensor([float("inf"), 1.0]), torch.ones(2), torch.tensor([float("-inf"), 1.0]),
                             torch.ones(2), TOLERANCES["fp32"])
    assert not checks[0].ok


def test_candidate_sets_must_match():
    ref, _ = walk()
    ids = ref.cand_ids.clone()
    unused = next(v for v in range(257) if v not in set(ids[0, 0].tolist()))
    ids[0, 0, 5] = unused
    assert "ids" in failed(compare_draft(copy(ref, cand_ids=ids), ref, TOLERANCES["fp32"], vocab=257))
    # low precision tolerates a rare boundary flip (≥ 97 % overlap), not a different set
    assert "ids" not in failed(compare_draft(copy(ref, cand_ids=ids), ref, TOLERANCES["bf16"], vocab=257))
    assert "ids" in failed(compare_draft(copy(ref, cand_ids=torch.roll(ref.cand_ids, 1, 0)), ref, TOLERANCES["bf16"],
                                         vocab=257))


def second_best(result, b, j):
    """The target id of the runner-up candidate at (b, j) and its gap to the winner (greedy)."""
    top2 = result.cand_logits[b, j].topk(2)
    return int(result.cand_ids[b, j, top2.indices[1]]), float(top2.values[0] - top2.values[1])


def test_token_flips():
    """fp32 demands equal tokens; low precision accepts a flip only at a near-tie of the reference's scores."""
    ref, _ = walk(seed=4, bias_scale=0.1)
    runner_up, gap = second_best(ref, 1, 2)
    tokens = ref.tokens.clone()
    tokens[1, 2] = runner_up  # a different pick at (1, 2): later slots of row 1 are not compared
    tokens[1, 3:] = -7
    flipped = copy(ref, tokens=tokens)
    assert failed(compare_draft(flipped, ref, TOLERANCES["fp32"], vocab=257)) == ["tokens"]
    loose = dataclasses.replace(TOLERANCES["bf16"], atol=gap + 1e-3, rtol=0.0)
    tight = dataclasses.replace(TOLERANCES["bf16"], atol=gap / 2, rtol=0.0)
    assert failed(compare_draft(flipped, ref, loose, vocab=257)) == []
    assert failed(compare_draft(flipped, ref, tight, vocab=257)) == ["tokens"]
    tokens[1, 2] = 100000  # not a candidate at all
    assert "tokens" in failed(compare_draft(copy(ref, tokens=tokens), ref, loose, vocab=257))


def test_sampled_token_flip_uses_the_same_gumbel_noise():
    """Probabilistic: the near-tie is judged on z/T + g with the walk's own noise, not on z."""
    temperature = torch.tensor([3.0, 3.0, 3.0])
    ref, noise = walk(seed=6, temperature=temperature)
    z_best = ref.cand_ids.gather(-1, ref.cand_logits.argmax(-1, keepdim=True)).squeeze(-1)  # [B, N]
    moved = (z_best != ref.tokens).nonzero()
    assert len(moved)  # precondition: at T = 3 the noise moved some pick away from the best logit
    b, j = (int(i) for i in moved[0])
    tokens = ref.tokens.clone()
    tokens[b, j] = z_best[b, j]  # the best *logit*, not the best *score*: a real disagreement under noise
    tight = dataclasses.replace(TOLERANCES["bf16"], atol=1e-3, rtol=0.0)
    assert failed(compare_draft(copy(ref, tokens=tokens), ref, tight, vocab=257, **noise)) == ["tokens"]


def test_context_tolerance_is_per_dtype():
    ref = torch.randn(2, 1, 5, 2, 4)
    off = ref + 1e-2
    assert not all(c.ok for c in compare_context(off, ref, ref, ref, TOLERANCES["fp32"]))
    assert all(c.ok for c in compare_context(off, ref, ref, ref, TOLERANCES["bf16"]))
    for t in TOLERANCES.values():
        assert t.reason and t.atol > 0  # every tolerance says why


def test_a_pick_the_other_side_could_not_make_is_judged_as_a_boundary_tie():
    """Flat logits (a random drafter, sampled): the reference may pick an id that sits at the top-k boundary and
    is missing from onnxruntime's set. That divergence is the candidate-set rule's to judge, not the near-tie's."""
    g = torch.Generator().manual_seed(3)
    B, N, V, r, k = 2, 4, 257, 8, 16
    base = torch.randn(B, N, V, generator=g) * 1e-3  # every id within bf16's tolerance of the k-th
    ref = markov_walk(base, torch.tensor([3, 9]), torch.randn(V, r, generator=g), torch.randn(V, r, generator=g),
                      topk=k)
    b, j = 1, 2
    pick = int(ref.tokens[b, j])
    outside = next(v for v in base[b, j].argsort(descending=True).tolist() if v not in set(ref.cand_ids[b, j].tolist()))
    ids = ref.cand_ids.clone()
    ids[b, j][ids[b, j] == pick] = outside  # onnxruntime's set: the reference's pick swapped for a boundary id
    tokens = ref.tokens.clone()
    tokens[b, j], tokens[b, j + 1:] = outside, -7
    logits = ref.cand_logits.clone()
    logits[b, j][ids[b, j] == outside] -= 1.0  # its own logit, well below the reference's pick
    got = copy(ref, cand_ids=ids, tokens=tokens, cand_logits=logits)
    assert failed(compare_draft(got, ref, TOLERANCES["bf16"], vocab=V, base_logits=base)) == []
    far = base.clone()
    far[b, j, outside] = -10.0  # not a tie at all: the candidate-set rule fails it
    assert failed(compare_draft(got, ref, TOLERANCES["bf16"], vocab=V, base_logits=far)) == ["ids"]


def test_a_failed_report_raises_with_every_line_of_it():
    """The exception names the first failure in one line and carries the whole report (each check, passed or not):
    a caller such as ``dspark bench releases`` keeps every failure, not only the first."""
    from dspark_trt.errors import ValidationMismatch
    from dspark_trt.export.validate import Check, ValidationReport

    report = ValidationReport("fp32", TOLERANCES["fp32"], [Check("a", True, "fine"), Check("b", False, "off by 3"),
                                                           Check("c", False, "off by 9")])
    with pytest.raises(ValidationMismatch) as e:
        report.raise_on_failure()
    assert "\n" not in str(e.value) and "b: off by 3" in str(e.value) and "(2 of 3 checks)" in str(e.value)
    assert e.value.report == report.lines() and sum("FAIL" in line for line in e.value.report) == 2
