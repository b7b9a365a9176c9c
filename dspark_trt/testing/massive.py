"""The massive-activation case of issue #16 on a tiny drafter: taps with four channels at ±3·10⁴ and an
``fc`` whose first outputs read all four with weight 0.6 — 7.2·10⁴ per output, past fp16's 65504."""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..reference.precision import MASSIVE_ACTIVATION, massive_channels, massive_taps

__all__ = ["MassiveCase", "massive_case", "plant_massive_target"]


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


@torch.no_grad()
def plant_massive_target(model, *, token: int = 0, channels: tuple[int, ...] = (3, 17),
                         magnitude: float = MASSIVE_ACTIVATION, boost_layer: int | None = None,
                         boost: float = 4e4) -> None:
    """Give a ``transformers`` Llama/Qwen target massive activations, in place (any dtype, best fp32).

    ``token``'s embedding holds +``magnitude`` in ``channels``, so the residual stream carries them at every
    occurrence (real targets' sit at BOS: ``export.target_precision.calibration_prompt`` starts with it).
    With ``boost_layer``, that layer's MLP adds about ``boost`` more to ``channels[0]`` at such tokens (3·10⁴ +
    4·10⁴ > fp16's 65504): one intermediate unit reads the channel and writes it back, scaled.
    """
    inner = model.model
    emb = inner.embed_tokens.weight  # [V, d]
    emb[token, list(channels)] = magnitude
    if boost_layer is None:
        return
    mlp = inner.layers[boost_layer].mlp
    c, g = channels[0], 0  # the channel, the intermediate unit taken over
    seen = {}
    handle = mlp.register_forward_pre_hook(lambda _m, args: seen.setdefault("x", args[0].detach()))
    try:
        model(input_ids=torch.tensor([[token, token]], device=emb.device), use_cache=False)
    finally:
        handle.remove()
    a = float(seen["x"][0, 0, c])  # the MLP's normed input at the massive channel
    mlp.gate_proj.weight[g] = 0
    mlp.up_proj.weight[g] = 0
    mlp.gate_proj.weight[g, c] = 1.0
    mlp.up_proj.weight[g, c] = 1.0
    mlp.down_proj.weight[:, g] = 0
    mlp.down_proj.weight[c, g] = boost / (torch.nn.functional.silu(torch.tensor(a)) * a)
