"""The massive-activation case of issue #16 on a tiny drafter: taps with four channels at ±3·10⁴ and an
``fc`` whose first outputs read all four with weight 0.6 — 7.2·10⁴ per output, past fp16's 65504."""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..reference.precision import MASSIVE_ACTIVATION, massive_channels, massive_taps

__all__ = ["MassiveCase", "massive_case"]


class MassiveCase(NamedTuple):
    taps: torch.Tensor  # [B, T, m·d] fp32, massive channels planted
    positions: torch.Tensor  # [B, T] int64
    channels: torch.Tensor  # [C] int64 massive channel indices into m·d
    anchor: torch.Tensor  # [B] int64
    ctx_len: torch.Tensor  # [B] int64 valid context per request (≤ T)


@torch.no_grad()
def massive_case(drafter, *, B: int = 2, T: int = 12, count: int = 4, weight: float = 0.6, outputs: int = 4,
                 magnitude: float = MASSIVE_ACTIVATION, seed: int = 0) -> MassiveCase:
    """Plant the case into ``drafter`` (in place: ``fc`` outputs ``0 … outputs-1`` read the ``count`` massive
    channels with ±``weight``, matching their signs; no other output reads them) and return its inputs."""
    c = drafter.config
    gen = torch.Generator().manual_seed(seed)
    channels = massive_channels(c.num_taps, c.hidden_size, count=count, seed=seed)
    taps = massive_taps(torch.randn(B, T, c.num_taps * c.hidden_size, generator=gen), channels, magnitude)
    sign = taps[0, 0, channels].sign()  # [C]
    w = drafter.fc.weight  # [d, m·d]
    w[:, channels] = 0
    w[:outputs, channels] = (weight * sign).to(w.dtype)
    positions = torch.arange(T).expand(B, T)
    anchor = torch.randint(0, c.vocab_size, (B,), generator=gen)
    ctx_len = torch.randint(max(1, T // 2), T + 1, (B,), generator=gen)
    return MassiveCase(taps, positions, channels, anchor, ctx_len)
