"""runtime/stats: the one-line summary."""

from __future__ import annotations

import torch

from dspark_trt.runtime.stats import GenerationStats


def test_summary_without_draft_rounds_claims_no_acceptance():
    """--max-new-tokens 1 used to report "0.00 tok/round ... 0 rounds"."""
    stats = GenerationStats(speculative=True, num_draft_tokens=7, requests=1, generated_tokens=1, total_seconds=0.1)
    line = stats.summary()
    assert "no draft rounds" in line and "tok/round" not in line and "0 rounds" not in line


def test_summary_with_rounds():
    stats = GenerationStats(speculative=True, num_draft_tokens=3, requests=2, generated_tokens=9, total_seconds=0.5)
    stats.record_round(torch.tensor([3, 3]), torch.tensor([2, 0]))
    line = stats.summary()
    assert "acceptance 2.00 tok/round (2/6 drafts), 2 rounds; time:" in line
    baseline = GenerationStats(speculative=False, num_draft_tokens=3, requests=1, rounds=4, generated_tokens=4,
                               total_seconds=0.5)
    assert "no drafter, 4 rounds; time:" in baseline.summary()
