"""``bench/verify_cost.py``: the target's verification cost, measured without disturbing its cache."""

from __future__ import annotations

import random

import pytest
import torch

from dspark_trt.bench.report import _cost_table
from dspark_trt.bench.verify_cost import needed_acceptance, verify_cost

pytestmark = pytest.mark.usefixtures("one_thread")


def test_measuring_leaves_the_cache_as_the_prompt_left_it(distilled_pair):
    from dspark_trt.config import DSparkConfig
    from dspark_trt.runtime.targets.hf import HFTarget

    prompt = [5, 9, 2, 7, 11]
    taps = DSparkConfig.from_pretrained(distilled_pair.drafter).target_layer_ids

    def new_target():
        t = HFTarget.from_pretrained(distilled_pair.target, device="cpu")
        t.set_taps(taps)
        return t

    target, fresh = new_target(), new_target()
    cost = verify_cost(target, prompt, [1, 3, 5], repeats=2)
    assert list(cost) == [1, 3, 5] and all(sec > 0 for sec in cost.values())
    assert target.lengths.tolist() == [len(prompt)]  # every measured verify was rolled back
    probe = torch.tensor([[4, 8, 15]])
    after = target.verify(probe).logits  # [1, 3, V]
    fresh.prefill([torch.tensor(prompt)])
    torch.testing.assert_close(after, fresh.verify(probe).logits, rtol=1e-5, atol=1e-5)


def test_needed_acceptance_gives_the_speedup_it_names():
    rng = random.Random(3)
    for _ in range(20):
        cost = {1: rng.uniform(0.01, 0.05), 8: rng.uniform(0.05, 0.4)}
        draft, speedup = rng.uniform(0, 0.02), rng.uniform(0.5, 3)
        accept = needed_acceptance(cost, 8, draft, speedup)
        spec_tokens_per_s = accept / (cost[8] + draft)  # tokens per round / seconds per round
        assert spec_tokens_per_s / (1 / cost[1]) == pytest.approx(speedup)


def test_cost_table_uses_the_measured_drafting_time():
    r = {"verify_cost": {"1": 0.04, "2": 0.05, "3": 0.06},
         "matrix": [{"path": "torch", "temperature": 0.0, "batch": 1,
                     "seconds_per_round": {"draft": 0.006, "verify": 0.06, "other": 0.002}}]}
    table = "\n".join(_cost_table(r))
    assert "8.0 ms drafting" in table
    row3 = next(line for line in table.splitlines() if line.startswith("| 3 |"))
    assert f"{(0.06 + 0.008) / 0.04:.2f}" in row3 and f"{1.5 * (0.06 + 0.008) / 0.04:.2f}" in row3
    assert "not measured" in "\n".join(_cost_table({**r, "matrix": []}))
