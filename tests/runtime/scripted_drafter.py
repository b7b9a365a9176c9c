"""A scripted drafter backend for tests: it proposes the target's own continuation, with planted errors.

Given each request's reference sequence (prompt + the target's greedy continuation, e.g. from
``SpeculativeDecoder.generate(..., draft=False)``), the draft for a round with anchor position p is
``ref[p+1 … p+N]``, except at positions where ``wrong(request, position)`` is true: there it proposes a
different token. A greedy verifier must then accept exactly the drafts before the first planted error, so
tests can force accept-all, accept-none and partial rounds and check the runtime's bookkeeping against it.

Each draft is a single candidate (k = 1) with probability 1, a valid draft distribution at any temperature.
The backend checks that every anchor it is handed equals the reference token at that position — a target
cache that failed to roll back would drift off the reference and trip this check.

It is a test double for the *drafter*, never for an executor: it runs no model.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from dspark_trt.errors import DSparkTrtInternalError
from dspark_trt.reference.markov import MarkovWalkResult
from dspark_trt.runtime.drafters.base import DrafterBackend

__all__ = ["ScriptedDrafterBackend"]


class ScriptedDrafterBackend(DrafterBackend):
    """Drafts ``reference[request][p+1 … p+N]`` with planted errors (see the module docstring).

    Args:
        config: the ``DSparkConfig`` to impersonate (N, vocabulary, cache shapes). Full vocabulary only.
        references: per request, the full reference sequence (prompt + continuation) as token ids.
        wrong (*optional*): ``wrong(request, position) -> bool``: plant an error at that draft position.
        confidence (*optional*): ``confidence(request, position) -> float`` reported per slot (default 1).
    """

    name = "scripted"

    def __init__(self, config, references: Sequence[Sequence[int]], *,
                 wrong: Callable[[int, int], bool] | None = None,
                 confidence: Callable[[int, int], float] | None = None, device="cpu"):
        if config.has_reduced_vocab:
            raise ValueError("ScriptedDrafterBackend impersonates full-vocabulary drafters only")
        self.config = config
        self.device = torch.device(device)
        self.references = [list(map(int, r)) for r in references]
        self.wrong = wrong or (lambda request, position: False)
        self.confidence = confidence
        self.active = list(range(len(self.references)))
        self.rounds: list[dict] = []  # one entry per (request, round): request, position, expected_accepted

    def set_active_requests(self, requests: list[int]) -> None:
        """Decoder hook: the request index of every batch row, in order."""
        self.active = list(requests)

    def context_kv(self, taps: torch.Tensor, positions: torch.Tensor):
        c = self.config
        B, T = positions.shape
        shape = (c.num_hidden_layers, B, T, c.num_key_value_heads, c.head_dim)
        return torch.zeros(shape, device=self.device), torch.zeros(shape, device=self.device)

    def draft(self, anchor, ctx_k, ctx_v, ctx_len, *, topk, temperature, seed, ctx_start=None) -> MarkovWalkResult:
        c, N = self.config, self.config.num_draft_tokens
        B = anchor.shape[0]
        tokens = torch.zeros(B, N, dtype=torch.int64)
        conf = torch.ones(B, N)
        for b in range(B):
            request, p = self.active[b], int(ctx_len[b])
            ref = self.references[request]
            if p >= len(ref) or int(anchor[b]) != ref[p]:
                raise DSparkTrtInternalError(
                    f"request {request}: anchor {int(anchor[b])} at position {p} is not the reference token "
                    f"{ref[p] if p < len(ref) else None}: the runtime drifted off the target's output")
            expected = None
            for j in range(N):
                pos = p + 1 + j
                truth = ref[pos] if pos < len(ref) else 0
                bad = self.wrong(request, pos)
                tokens[b, j] = (truth + 1) % c.vocab_size if bad else truth
                if (bad or pos >= len(ref)) and expected is None:
                    expected = j
                if self.confidence is not None:
                    conf[b, j] = float(self.confidence(request, pos))
            self.rounds.append({"request": request, "position": p,
                                "expected_accepted": N if expected is None else expected})
        tokens = tokens.to(self.device)
        return MarkovWalkResult(tokens=tokens, cand_ids=tokens.unsqueeze(-1),
                                cand_logits=torch.zeros(B, N, 1, device=self.device), confidence=conf.to(self.device))

    def observed_rounds(self) -> list[tuple[int, int]]:
        """(expected_accepted, actual_accepted) for every round followed by another round of the same request:
        actual = next anchor position − this anchor position − 1."""
        last: dict[int, dict] = {}
        pairs = []
        for r in self.rounds:
            prev = last.get(r["request"])
            if prev is not None:
                pairs.append((prev["expected_accepted"], r["position"] - prev["position"] - 1))
            last[r["request"]] = r
        return pairs
