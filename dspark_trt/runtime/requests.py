"""What a request is and what makes one valid: the ``Request`` record a batch decodes, and the checks every
request passes before anything runs (prompt ids, budget against the context, sampling and truncation settings).

``SpeculativeDecoder.generate`` and ``RequestScheduler.submit`` build requests through these, so a request is
refused with the same one-line ``DSparkTrtError`` whichever way it comes in.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from ..errors import DSparkTrtError

__all__ = ["Request", "StopCheck", "check_context_budget", "check_max_new_tokens", "check_sampling",
           "check_truncation", "eos_ids", "per_request", "token_prompts"]

#: stop(out, start) -> keep | None: run after each round's tokens (``start``: tokens before them); ``keep``
#: ends the request there (stop strings, ``runtime/stop.py``)
StopCheck = Callable[[list, int], "int | None"]


class Request:
    """One request inside a ``Batch``: its settings and the tokens it has emitted so far.

    ``stop``: an optional ``StopCheck`` run after each round's tokens."""

    def __init__(self, rid: int, prompt: torch.Tensor, max_new: int, temperature: float, seed: int, eos, *,
                 stop: StopCheck | None = None, top_k: int = 0, top_p: float = 1.0):
        self.id, self.prompt, self.max_new, self.temperature, self.seed = rid, prompt, max_new, temperature, seed
        self.top_k, self.top_p = int(top_k), float(top_p)  # truncated sampling (0 / 1 = off)
        self.eos = set(eos)
        self.stop = stop
        self.out: list[int] = []
        self.finish: str | None = None  # "stop" (EOS or a stop string) or "length", once finished
        self.rounds = self.drafted = self.accepted = 0  # this request's share of the stats
        self.max_batch = 0  # the most requests decoded together in a round while this one was active

    def emit(self, tokens: list[int]) -> bool:
        """Append new tokens (up to EOS / the budget / a stop string); True when the request is finished."""
        start = len(self.out)
        for t in tokens:
            self.out.append(t)
            if t in self.eos or len(self.out) >= self.max_new:
                self.finish = "stop" if t in self.eos else "length"
                break
        if self.stop is not None:
            keep = self.stop(self.out, start)
            if keep is not None:
                del self.out[keep:]
                self.finish = "stop"
        return self.finish is not None


def token_prompts(inputs, tokenizer, vocab_size: int) -> list[torch.Tensor]:
    """``inputs`` as ``generate`` takes them (token-id lists, a 1-D list, a tensor [B, T], 1-D tensors, or text
    with a ``tokenizer``) → one int64 [T_i] tensor per request, every id checked against ``vocab_size``."""
    if isinstance(inputs, str) or (isinstance(inputs, (list, tuple)) and inputs and isinstance(inputs[0], str)):
        texts = [inputs] if isinstance(inputs, str) else list(inputs)
        if tokenizer is None:
            raise DSparkTrtError("text prompts need a tokenizer, and the target directory has none; "
                                 "pass token ids instead (--input-ids)")
        inputs = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    if isinstance(inputs, torch.Tensor):
        inputs = [inputs] if inputs.dim() == 1 else list(inputs)
    elif isinstance(inputs, (list, tuple)) and inputs and isinstance(inputs[0], int):
        inputs = [inputs]
    if not isinstance(inputs, (list, tuple)) or not inputs:
        raise DSparkTrtError("no prompts given: pass a list of token-id lists (or text with a tokenizer)")
    prompts = []
    for i, p in enumerate(inputs):
        t = torch.as_tensor(p, dtype=torch.int64).flatten()
        if t.numel() == 0:
            raise DSparkTrtError(f"prompt {i} is empty: every request needs at least one token")
        bad = t[(t < 0) | (t >= vocab_size)]
        if bad.numel():
            raise DSparkTrtError(f"prompt {i} has token id {int(bad[0])} outside the target vocabulary "
                                 f"[0, {vocab_size}); use ids from the target's tokenizer")
        prompts.append(t)
    return prompts


def per_request(value, B: int, name: str, dtype, device) -> torch.Tensor:
    """One value or one per request → a [B] tensor; a one-line error for a list of the wrong length."""
    values = list(value) if isinstance(value, (list, tuple)) else [value] * B
    if len(values) != B:
        raise DSparkTrtError(f"{name} has {len(values)} values for {B} requests; give one value or one per request")
    return torch.tensor(values, dtype=dtype, device=device)


def eos_ids(eos_token_id: int | Sequence[int] | None, default: Sequence[int]) -> tuple[int, ...]:
    """The stop ids of a request: ``None`` → ``default`` (the target's), one id, or a list (``[]``: none)."""
    if eos_token_id is None:
        return tuple(default)
    return (int(eos_token_id),) if isinstance(eos_token_id, int) else tuple(int(e) for e in eos_token_id)


def check_max_new_tokens(max_new_tokens: int) -> None:
    if int(max_new_tokens) < 1:
        raise DSparkTrtError(f"max_new_tokens must be >= 1, got {max_new_tokens}")


def check_sampling(temperature: torch.Tensor, seed: torch.Tensor) -> None:
    """Per-request sampling settings: temperature [B] finite and ≥ 0, seed [B] ≥ 0; one-line errors."""
    if not bool(torch.isfinite(temperature).all()) or bool((temperature < 0).any()):
        raise DSparkTrtError("temperature must be finite and >= 0 (0 = greedy)")
    if bool((seed < 0).any()):
        raise DSparkTrtError("seed must be >= 0")


def check_truncation(top_k: torch.Tensor, top_p: torch.Tensor) -> None:
    """Per-request truncated sampling: top_k [B] ≥ 0 (0 = off), top_p [B] in (0, 1] (1 = off); one-line errors."""
    if bool((top_k < 0).any()):
        raise DSparkTrtError(f"top_k must be >= 0 (0 = off), got {int(top_k.min())}")
    if not bool(torch.isfinite(top_p).all()) or bool(((top_p <= 0) | (top_p > 1)).any()):
        raise DSparkTrtError("top_p must be in (0, 1] (1 = off)")


def check_context_budget(prompt_lengths: Sequence[int], max_new_tokens: int, max_context: int | None) -> None:
    """Refuse, before anything runs, a request whose prompt + ``max_new_tokens`` exceeds ``max_context`` (the
    graphs' or engines' KV bound; None: unbounded). One line naming the limit and the fix."""
    if max_context is None or not prompt_lengths:
        return
    longest = max(int(n) for n in prompt_lengths)
    if longest + int(max_new_tokens) > int(max_context):
        raise DSparkTrtError(f"prompt ({longest} tokens) + max_new_tokens ({int(max_new_tokens)}) exceeds the model's "
                             f"context of {int(max_context)} tokens; shorten the prompt or ask for at most "
                             f"{max(int(max_context) - longest, 0)} new tokens (an export's bound: dspark-export "
                             f"--max-context)")
