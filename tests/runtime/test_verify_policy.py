"""``verify_drafts="auto"``: the policy's choice, what it learns, its cost measurement, and lossless decoding."""

from __future__ import annotations

import random

import pytest
import torch

from tests.runtime.runtime_helpers import make_decoder
from dspark_trt.runtime import SpeculativeDecoder
from tests.runtime.scripted_drafter import ScriptedDrafterBackend
from dspark_trt.runtime.verify_policy import VerifyPolicy, batch_bucket, measure_verify_costs

N = 7
FLAT = {w: 0.010 for w in range(2, N + 2)}  # a GPU-like verify: as dear for 8 tokens as for 2
STEEP = {w: 0.010 * (1 + 0.5 * (w - 1)) for w in range(2, N + 2)}  # a CPU-like one


def learnt(cost, rates, rounds=400, seed=0, other=0.002):
    """A policy after ``rounds`` simulated rounds whose slot j is accepted with probability rates[j] (given the
    slots before it), and the tokens per second it achieved over them."""
    rng = random.Random(seed)
    policy, tokens, seconds = VerifyPolicy(N), 0, 0.0
    policy.set_cost(1, cost)
    for _ in range(rounds):
        L = policy.choose()
        a = 0
        while a < L and rng.random() < rates[a]:
            a += 1
        tokens += a + 1
        seconds += cost[L + 1] + other
        policy.observe(torch.tensor([L]), torch.tensor([a]), cost[L + 1] + other, L + 1)
    return policy, tokens / seconds


def best_fixed(cost, rates, other=0.002):
    """tokens/s of the best fixed verify length, in expectation."""
    def expected(L):
        total, p = 1.0, 1.0
        for a in rates[:L]:
            p *= a
            total += p
        return total / (cost[L + 1] + other)
    return max((expected(L), L) for L in range(1, N + 1))


@pytest.mark.parametrize("cost, rates", [(FLAT, [0.8] * N), (STEEP, [0.8] * N), (STEEP, [0.35, 0.3, 0.4] + [0.1] * 4),
                                         (FLAT, [0.35, 0.3, 0.4] + [0.1] * 4), (STEEP, [0.95] * 3 + [0.05] * 4)])
def test_learnt_choice_is_as_fast_as_the_best_fixed_length(cost, rates):
    best, best_L = best_fixed(cost, rates)
    policy, achieved = learnt(cost, rates)
    assert achieved >= 0.9 * best, (achieved, best, best_L, policy.rates())
    assert abs(policy.choose() - best_L) <= 1  # ends at (or next to) the best length


def test_flat_cost_verifies_everything_and_steep_cost_with_weak_drafts_verifies_one():
    assert learnt(FLAT, [0.8] * N)[0].choose() == N
    assert learnt(STEEP, [0.2] * N)[0].choose() == 1


def test_batch_buckets_keep_their_own_cost_and_round_time():
    assert [batch_bucket(b) for b in (1, 2, 3, 4, 5, 64, 65)] == [1, 2, 4, 4, 8, 64, 128]
    p = VerifyPolicy(N)
    p.set_cost(1, FLAT)
    p.set_cost(64, STEEP)
    assert not p.needs_cost(1) and not p.needs_cost(40) and p.needs_cost(2)
    p.tried, p.accepted = [100.0] * N, [80.0] * N  # slots accepted ~80 % of the time
    assert p.choose(1) == N and p.choose(64) < N  # the same drafts, verified fully only where it is cheap
    p.observe(torch.tensor([1] * 64), torch.tensor([0] * 64), 0.5, 2)
    assert p.other[64] == pytest.approx(0.5 - STEEP[2]) and 1 not in p.other


def test_counts_and_the_estimate_of_slots_never_verified():
    p = VerifyPolicy(4)
    p.set_cost(3, {w: 1.0 for w in range(2, 6)})
    p.observe(torch.tensor([3, 2, 4]), torch.tensor([1, 2, 0]), 1.0, 5)
    # row 0: slots 0, 1 verified (0 accepted, 1 rejected); row 1: slots 0, 1 accepted; row 2: slot 0 rejected
    assert [round(t, 6) for t in p.tried] == [3, 2, 0, 0] and [round(a, 6) for a in p.accepted] == [2, 1, 0, 0]
    r = p.rates()
    assert r[0] == pytest.approx(3 / 5) and r[1] == pytest.approx(2 / 4) and r[2] == r[3] == r[1]


def test_measuring_the_cost_rolls_every_verify_back(distilled_pair):
    decoder = make_decoder(distilled_pair)
    target = decoder.target
    prompts = [torch.tensor([3, 4, 5, 6]), torch.tensor([7, 8])]
    target.prefill(prompts)
    lengths = target.lengths.clone()
    probe = torch.tensor([[9, 10], [11, 12]])
    before = target.verify(probe).logits
    target.commit(torch.zeros(2, dtype=torch.int64))
    cost = measure_verify_costs(target, range(2, 7))
    assert sorted(cost) == [2, 3, 4, 5, 6] and all(c > 0 for c in cost.values())
    assert torch.equal(target.lengths, lengths)
    torch.testing.assert_close(target.verify(probe).logits, before)  # the caches are as they were


def test_auto_is_lossless_and_learns_on_the_decoder(distilled_pair, monkeypatch):
    sizes, observe = set(), VerifyPolicy.observe
    monkeypatch.setattr(VerifyPolicy, "observe", lambda self, n, *a: sizes.add(len(n)) or observe(self, n, *a))
    decoder = make_decoder(distilled_pair)
    prompts = [[3, 4, 5], [6, 7, 8, 9], [10, 11]]
    reference = decoder.generate(prompts, 30, draft=False).tokens
    Nd = decoder.config.num_draft_tokens
    full = [p + r + [0] * (Nd + 1) for p, r in zip(prompts, reference)]
    scripted = SpeculativeDecoder(decoder.target, ScriptedDrafterBackend(decoder.config, full,
                                                                          wrong=lambda r, pos: pos % 3 == 2))
    out = scripted.generate(prompts, 30, verify_drafts="auto")
    assert out.tokens == reference
    policy = scripted.verify_policy()
    assert 3 in sizes and set(policy.costs) == {batch_bucket(b) for b in sizes}  # a cost per bucket the run met
    assert all(sorted(c) == list(range(2, Nd + 2)) for c in policy.costs.values())
    assert policy.rounds == out.stats.steps  # one observation per batched round
    assert sum(policy.tried) > 0 and out.stats.drafted <= out.stats.rounds * Nd
    again = scripted.generate(prompts, 30, verify_drafts="AUTO")  # kept, not measured again
    assert again.tokens == reference and scripted.verify_policy() is policy
    assert policy.rounds == out.stats.steps + again.stats.steps
