"""What one ``generate`` call reports: acceptance statistics and the time split.

Per request-round the verifier accepts ``acc`` of the ``n ≤ N`` drafts it was shown and emits one more
token, so a round yields ``acc + 1`` tokens::

    mean_acceptance_length   = (accepted + rounds) / rounds              ∈ [1, N + 1]
    per_position_acceptance[j] = accepted_at[j] / drafted_at[j]          slot j accepted, among rounds that verified it
    generated_tokens         ≤ requests + accepted + rounds              (= when nothing is cut by EOS / max_new_tokens;
                                                                           the +requests is the token from the prefill)
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import torch

__all__ = ["GenerationStats", "GenerationResult", "Stopwatch"]


@dataclass
class GenerationStats:
    speculative: bool
    num_draft_tokens: int  # N
    requests: int = 0
    rounds: int = 0  # request-rounds: target verifications summed over requests
    steps: int = 0  # batched decoder iterations
    drafted: int = 0  # drafts shown to the verifier (after confidence truncation)
    accepted: int = 0
    generated_tokens: int = 0  # tokens returned, after EOS / max_new_tokens cuts
    drafted_at: list[int] = field(default_factory=list)  # [N] per slot
    accepted_at: list[int] = field(default_factory=list)  # [N] per slot
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0  # drafter: context K/V + draft rounds
    verify_seconds: float = 0.0  # target forward + rejection sampling
    other_seconds: float = 0.0  # bookkeeping, cache rollback, batch compaction
    total_seconds: float = 0.0

    def __post_init__(self) -> None:
        if not self.drafted_at:
            self.drafted_at = [0] * self.num_draft_tokens
            self.accepted_at = [0] * self.num_draft_tokens

    @property
    def mean_acceptance_length(self) -> float:
        return (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)]

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.total_seconds if self.total_seconds > 0 else 0.0

    def record_round(self, num_drafted: torch.Tensor, num_accepted: torch.Tensor) -> None:
        """num_drafted, num_accepted: [B] int64 for the requests verified this step."""
        N = self.num_draft_tokens
        slots = torch.arange(N, device=num_drafted.device).view(1, N)
        self.drafted_at = [a + int(b) for a, b in zip(self.drafted_at, (slots < num_drafted.view(-1, 1)).sum(0))]
        self.accepted_at = [a + int(b) for a, b in zip(self.accepted_at, (slots < num_accepted.view(-1, 1)).sum(0))]
        self.rounds += int(num_drafted.numel())
        self.drafted += int(num_drafted.sum())
        self.accepted += int(num_accepted.sum())
        self.steps += 1

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(mean_acceptance_length=self.mean_acceptance_length,
                   per_position_acceptance=self.per_position_acceptance,
                   tokens_per_second=self.tokens_per_second)
        return out

    def summary(self) -> str:
        """One line for humans."""
        t = self.total_seconds or 1.0
        if not self.speculative:
            spec = f"no drafter, {self.rounds} rounds"
        elif self.rounds == 0:  # e.g. --max-new-tokens 1: the prefill's token is all there is
            spec = "no draft rounds (every token came from the prefill)"
        else:
            spec = (f"acceptance {self.mean_acceptance_length:.2f} tok/round ({self.accepted}/{self.drafted} drafts), "
                    f"{self.rounds} rounds")
        return (f"{self.generated_tokens} tokens for {self.requests} request(s) in {self.total_seconds:.2f}s "
                f"({self.tokens_per_second:.1f} tok/s), {spec}; time: prefill "
                f"{self.prefill_seconds / t:.0%}, draft {self.draft_seconds / t:.0%}, verify "
                f"{self.verify_seconds / t:.0%}, other {self.other_seconds / t:.0%}")


@dataclass
class GenerationResult:
    tokens: list[list[int]]  # new tokens per request (prompt excluded)
    stats: GenerationStats
    texts: list[str] | None = None  # decoded new tokens, when a tokenizer is available

    @classmethod
    def merge(cls, results: list["GenerationResult"]) -> "GenerationResult":
        """One result for several consecutive batches: tokens concatenated, counts and times summed."""
        first = results[0].stats
        stats = GenerationStats(speculative=first.speculative, num_draft_tokens=first.num_draft_tokens)
        for r in results:
            for name in ("requests", "rounds", "steps", "drafted", "accepted", "generated_tokens", "prefill_seconds",
                         "draft_seconds", "verify_seconds", "other_seconds", "total_seconds"):
                setattr(stats, name, getattr(stats, name) + getattr(r.stats, name))
            stats.drafted_at = [a + b for a, b in zip(stats.drafted_at, r.stats.drafted_at)]
            stats.accepted_at = [a + b for a, b in zip(stats.accepted_at, r.stats.accepted_at)]
        texts = None if any(r.texts is None for r in results) else [t for r in results for t in r.texts]
        return cls(tokens=[t for r in results for t in r.tokens], stats=stats, texts=texts)

    def to_dict(self) -> dict:
        out = {"tokens": self.tokens, "stats": self.stats.to_dict()}
        if self.texts is not None:
            out["texts"] = self.texts
        return out


class Stopwatch:
    """Accumulates wall time into ``GenerationStats`` fields; synchronises CUDA so GPU work is attributed."""

    def __init__(self, stats: GenerationStats, device: torch.device):
        self.stats = stats
        self.cuda = device.type == "cuda"

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    @contextmanager
    def __call__(self, name: str):
        self._sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            key = f"{name}_seconds"
            setattr(self.stats, key, getattr(self.stats, key) + time.perf_counter() - start)
