"""The load both serve benchmarks send and how they summarise it: the request prompts and latency percentiles.

``dspark bench serve`` (Triton's HTTP generate) and ``--openai`` (the OpenAI front end against Triton's gRPC
endpoint) send the same prompts, cut from the embedded demo text, and report the same percentiles.
"""

from __future__ import annotations

__all__ = ["prompts", "percentile"]


def prompts(n: int) -> list[str]:
    """``n`` prompts of 2–10 words cut from the embedded demo text (the same ones on every run)."""
    from ..demo.pair import EMBEDDED_TEXT

    words = EMBEDDED_TEXT.split()
    return [" ".join(words[(7 * i) % (len(words) - 12): (7 * i) % (len(words) - 12) + 2 + i % 9]) for i in range(n)]


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank)."""
    values = sorted(values)
    k = min(len(values) - 1, max(0, round(q * (len(values) - 1))))
    return values[k]
