"""How the target writes its training text: greedy, or sampled like a served request (T, top-p, top-k).

A sampled row draws with the project's reference sampler (``reference/sampling.py``): the tokens
``truncation_mask`` keeps at temperature T, then Gumbel-max with counter-based noise keyed by (row seed,
position, token id) in the target-only sampler's stream (``SAMPLE_SALT``). A row's text therefore depends only
on its prompt, its seed and the settings — never on which rows share its batch — so the text store
(``training/store.py``) can key every row by its content.

With ``top_k`` > 0 only the k best tokens of a row are scored (the rest cannot survive the truncation), which
keeps the noise off the full vocabulary: the kept set and the draw equal the reference's on the full row
(tested), up to exact ties at the k-th logit, which the reference keeps and this drops.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["WritingSettings", "next_tokens", "row_seed"]


@dataclass(frozen=True)
class WritingSettings:
    """The non-greedy rows' sampling (DeepSpec regenerates at T = 0.7, top-p 0.8, top-k 20)."""

    temperature: float = 0.7
    top_p: float = 0.8  # 1 = off
    top_k: int = 20  # 0 = off


def row_seed(seed: int, prompt: list[int], round_: int = 0) -> int:
    """A 31-bit noise seed for one sampled row: (run seed, prompt ids, round) hashed."""
    import hashlib

    h = hashlib.sha256(f"{seed}/{round_}/{','.join(map(str, prompt))}".encode()).digest()
    return int.from_bytes(h[:4], "little") & 0x7FFFFFFF


def next_tokens(logits: torch.Tensor, greedy: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor,
                s: WritingSettings) -> torch.Tensor:
    """[B] int64 next tokens of ``logits`` [B, V] fp32: argmax where ``greedy`` [B] bool, else a draw from the
    truncated distribution at ``s.temperature`` with noise keyed by ``seeds`` [B] int64 and ``positions`` [B]
    int64 (the position the token is written at)."""
    from ..reference.sampling import SAMPLE_SALT, gumbel_noise, truncation_mask

    out = logits.argmax(-1)  # [B]
    rows = ~greedy
    if not bool(rows.any()):
        return out
    z = logits[rows].to(torch.float32) / s.temperature  # [R, V] scaled
    R, V = z.shape
    k = s.top_k if 0 < s.top_k < V else V
    vals, ids = z.topk(k, dim=-1) if k < V else (z, torch.arange(V, device=z.device).expand(R, V))  # [R, k]
    dev = z.device
    keep = truncation_mask(vals, torch.full((R,), k, dtype=torch.int64, device=dev),
                           torch.full((R,), s.top_p, dtype=torch.float32, device=dev))  # [R, k]
    g = gumbel_noise(seeds[rows].view(R, 1), positions[rows].view(R, 1), ids, SAMPLE_SALT)  # [R, k]
    pick = torch.where(keep, vals + g, float("-inf")).argmax(-1)  # [R]
    out[rows] = ids.gather(-1, pick.view(R, 1)).view(R)
    return out
