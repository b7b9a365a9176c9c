"""``verify_drafts="auto"``: how many drafts a round verifies, from what a verify costs on this machine and how
often each draft slot is accepted.

    E(L) = 1 + Σ_{j=1..L} Π_{i≤j} a_i     tokens a round verifying L drafts emits, in expectation
    T(L) = c(L + 1) + d                    its seconds: one target verify of L + 1 tokens, plus drafting and the rest
    L*   = argmax_{1 ≤ L ≤ N} E(L) / T(L)  tokens per second

c(w): seconds of one target verify of w tokens (the anchor and w - 1 drafts) at the round's batch, measured once
per decoder and batch bucket (1, 2, 4, …) the first time a round of that size runs (``measure_verify_costs``:
widths 2 … N + 1, the fastest of two tries each, rolled back; ``dspark bench report`` times its table with it). On a GPU, where a
step is bound by reading the weights, c is nearly flat and L* = N whenever the drafts are any good; on a CPU it
rises steeply (docs/benchmarks.md) and L* is small.

a_j: draft j's acceptance given that drafts < j were accepted, counted over the rounds that verified it, with a
Beta(1, 1) prior; the counts decay by 1 % a round, so they follow the text being decoded. A slot not yet
verified takes the estimate of the one before it, so verifying further is tried whenever the earlier slots say
it pays, and counted from then on. d: seconds per round outside the verify forward, a running mean per bucket. Every L is lossless (the output does not depend on it); only the speed does.
"""

from __future__ import annotations

import time

import torch

__all__ = ["VerifyPolicy", "measure_verify_costs", "batch_bucket"]


def measure_verify_costs(target, widths, *, repeats: int = 2, statistic=min) -> dict[int, float]:
    """{w: ``statistic`` of the seconds of one ``target.verify`` of w tokens (w = 1: without taps, a target-only
    step)} at the target's current batch. The widths take turns, repeat after repeat (after one warm-up pass), so
    a machine's drift falls on all of them alike; each verify is rolled back (``commit(0)``), so the target's
    caches end as they began."""
    B = int(target.lengths.shape[0])
    device = target.device
    zeros = torch.zeros(B, dtype=torch.int64, device=device)
    times: dict[int, list[float]] = {int(w): [] for w in widths}
    for r in range(repeats + 1):  # pass 0 warms up (lazy allocations)
        for w in times:
            tokens = torch.zeros(B, w, dtype=torch.int64, device=device)  # [B, w] any valid ids
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            target.verify(tokens, with_taps=w > 1)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if r:
                times[w].append(time.perf_counter() - start)
            target.commit(zeros)  # roll back
    return {w: statistic(t) for w, t in times.items()}


def batch_bucket(batch: int) -> int:
    """The power of two ≥ ``batch``: batches sharing a bucket share a measured verify cost."""
    return 1 << max(0, int(batch) - 1).bit_length()


class VerifyPolicy:
    """Chooses each round's verify length L* (module docstring) and learns from the rounds it sees.

    The verify cost and the round's other seconds depend on the batch (on a GPU a verify of 8 tokens × 64
    requests is compute-bound, × 1 is not), so both are kept per batch bucket (``batch_bucket``); the
    acceptance counts are shared.
    """

    DECAY = 0.99  # per round: the counts follow the text being decoded (its last ~100 rounds)

    def __init__(self, num_drafts: int):
        self.N = num_drafts
        self.costs: dict[int, dict[int, float]] = {}  # bucket → {w: seconds}, w = 2 … N + 1
        self.other: dict[int, float] = {}  # bucket → running mean of a round's seconds outside the verify forward
        self.tried = [0.0] * num_drafts  # rounds that verified slot j with slots < j accepted (decayed)
        self.accepted = [0.0] * num_drafts  # ... and accepted it
        self.rounds_in: dict[int, int] = {}  # bucket → rounds observed

    @property
    def rounds(self) -> int:
        return sum(self.rounds_in.values())

    def needs_cost(self, batch: int) -> bool:
        return batch_bucket(batch) not in self.costs

    def set_cost(self, batch: int, cost: dict[int, float]) -> None:
        """The verify cost measured at ``batch`` (``measure_verify_costs``), kept for its bucket."""
        self.costs[batch_bucket(batch)] = dict(cost)

    def rates(self) -> list[float]:
        """a_j, j = 0 … N - 1 (module docstring)."""
        out, last = [], 0.5
        for t, a in zip(self.tried, self.accepted):
            last = (a + 1) / (t + 2) if t else last
            out.append(last)
        return out

    def expected_tokens(self) -> list[float]:
        """E(L), L = 0 … N (module docstring)."""
        out, p = [1.0], 1.0
        for a in self.rates():
            p *= a
            out.append(out[-1] + p)
        return out

    def choose(self, batch: int = 1) -> int:
        """L* in 1 … N for a round of ``batch`` requests (its bucket's cost must be set)."""
        b = batch_bucket(batch)
        cost, other, E = self.costs[b], self.other.get(b, 0.0), self.expected_tokens()
        return max(range(1, self.N + 1), key=lambda L: E[L] / (cost[L + 1] + other))

    def observe(self, n: torch.Tensor, accepted: torch.Tensor, round_seconds: float, width: int) -> None:
        """One round: ``n`` [B] drafts verified and ``accepted`` [B] accepted per row; the round took
        ``round_seconds`` with a verify of ``width`` tokens."""
        self.tried = [t * self.DECAY for t in self.tried]  # recent rounds count most (~1 / (1 - DECAY) of them)
        self.accepted = [a * self.DECAY for a in self.accepted]
        for nr, ar in zip(n.tolist(), accepted.tolist()):
            for j in range(min(nr, ar + 1)):  # slot j verified with all earlier slots accepted
                self.tried[j] += 1
                self.accepted[j] += int(j < ar)
        b = batch_bucket(len(n))
        k = self.rounds_in[b] = self.rounds_in.get(b, 0) + 1
        outside = max(0.0, round_seconds - self.costs.get(b, {}).get(width, 0.0))
        self.other[b] = self.other.get(b, 0.0) + (outside - self.other.get(b, 0.0)) / min(k, 32)  # then a moving average
