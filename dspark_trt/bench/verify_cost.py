"""What one verification round costs the target, against one target-only step (batch 1).

    c(n) = median seconds of ``target.verify`` of n tokens after a held-out prompt, rolled back after each call
           (the sizes take turns, repeat after repeat, so the machine's drift falls on all of them alike)

A target-only step is c(1) without taps; a speculative round verifies the anchor and its N drafts, c(N + 1),
and also drafts (d seconds). Speculation breaks even at an acceptance length of (c(N + 1) + d) / c(1) and reaches
a speed-up S at S times that — the figure that says how good a drafter must be on a given machine.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import torch

__all__ = ["verify_cost", "needed_acceptance"]


def verify_cost(target, prompt: Sequence[int], sizes: Sequence[int], *, repeats: int = 9) -> dict[int, float]:
    """{n: median seconds of one verify of n tokens (n = 1: without taps, a target-only step)} after ``prompt``
    (``runtime.verify_policy.measure_verify_costs`` at batch 1)."""
    from ..runtime.verify_policy import measure_verify_costs

    target.prefill([torch.tensor(list(prompt), dtype=torch.int64)])
    return measure_verify_costs(target, sizes, repeats=repeats, statistic=statistics.median)


def needed_acceptance(cost: dict[int, float], verified: int, draft_seconds: float, speedup: float = 1.0) -> float:
    """The acceptance length at which rounds verifying ``verified`` tokens (plus ``draft_seconds`` of drafting
    and other work per round) give ``speedup`` × target-only tokens/s."""
    return speedup * (cost[verified] + draft_seconds) / cost[1]
