"""Mixed precision of the drafter: the context fusion stays out of fp16 (its inputs leave fp16's range).

Real targets' tapped hidden states carry a few *massive activation* channels (~2–3·10⁴ in Qwen3-8B, the
same channels at every token). ``fc`` sums m·d of them per output, so one output that reads four such
channels with weight 0.6 is 7.2·10⁴ — past fp16's largest finite value (65504): the fused context becomes
inf, ``hidden_norm`` turns it into NaN, and every draft is garbage. bf16 has fp32's exponent range and
does not overflow.

So a drafter in **fp16** keeps its *context fusion* — the taps input, ``fc`` and ``hidden_norm`` — in
**fp32**; everything after the norm (K/V projections, the block layers, lm_head, Markov/confidence heads)
runs in fp16. The boundary sits after ``hidden_norm`` because the normed context has RMS ~1 (times the
norm weight): at most √d · max|w| per element (64 · ~1 for d = 4096), far inside fp16. fp32 and bf16
drafters are uniform.

``context_fusion_dtype(dtype)`` is the rule, ``parameter_dtype`` applies it per checkpoint tensor (the
loader), ``keep_context_fusion_fp32`` applies it to a drafter already cast with ``.to(fp16)``.
``massive_taps`` plants massive channels into taps (export validation and tests).
"""

from __future__ import annotations

import torch

__all__ = ["CONTEXT_FUSION_MODULES", "MASSIVE_ACTIVATION", "context_fusion_dtype", "parameter_dtype",
           "keep_context_fusion_fp32", "model_dtype", "massive_channels", "massive_taps"]

#: the modules that run in fp32 in an fp16 drafter (with the taps that feed them)
CONTEXT_FUSION_MODULES = ("fc", "hidden_norm")
#: magnitude of planted massive activations (Qwen3-8B's are ~2–3·10⁴; fp16's max is 65504)
MASSIVE_ACTIVATION = 3e4


def context_fusion_dtype(dtype: torch.dtype) -> torch.dtype:
    """dtype of the taps input, ``fc`` and ``hidden_norm`` for a drafter in ``dtype``: fp32 for fp16, else ``dtype``."""
    return torch.float32 if dtype == torch.float16 else dtype


def parameter_dtype(name: str, dtype: torch.dtype) -> torch.dtype:
    """dtype a checkpoint tensor ``name`` is loaded in for a drafter in ``dtype``."""
    return context_fusion_dtype(dtype) if name.split(".")[0] in CONTEXT_FUSION_MODULES else dtype


def model_dtype(drafter) -> torch.dtype:
    """The drafter's compute dtype (its block layers'), whatever its context fusion runs in."""
    return drafter.embed_tokens.weight.dtype


def keep_context_fusion_fp32(drafter):
    """Cast ``fc`` and ``hidden_norm`` of an fp16 drafter back to fp32 (in place); returns the drafter.

    Weights cast to fp16 earlier lost their low bits; load with ``load_drafter(dtype="fp16")`` to keep the
    checkpoint's values.
    """
    dtype = context_fusion_dtype(model_dtype(drafter))
    for name in CONTEXT_FUSION_MODULES:
        getattr(drafter, name).to(dtype)
    return drafter


def massive_channels(num_taps: int, hidden: int, count: int = 4, seed: int = 0) -> torch.Tensor:
    """``count`` distinct channel indices into taps [..., m·d], spread over the taps round-robin, fixed by
    ``seed`` (sorted)."""
    gen = torch.Generator().manual_seed(seed)
    per_tap = [torch.randperm(hidden, generator=gen) for _ in range(num_taps)]
    picks = [t * hidden + int(per_tap[t][i]) for i in range(count) for t in [i % num_taps]]
    return torch.tensor(sorted(set(picks)), dtype=torch.int64)


def massive_taps(taps: torch.Tensor, channels: torch.Tensor, magnitude: float = MASSIVE_ACTIVATION) -> torch.Tensor:
    """A copy of taps [B, T, m·d] whose ``channels`` hold ±``magnitude`` at every token (signs alternate
    over channels, ±10 % over tokens), as real targets' massive activations do."""
    out = taps.clone()
    T = taps.shape[1]
    sign = 1.0 - 2.0 * (torch.arange(channels.numel()) % 2).to(torch.float32)  # [C] +1, -1, ...
    scale = 1.0 - 0.1 * torch.linspace(0.0, 1.0, T).view(T, 1)  # [T, 1]
    out[..., channels] = (magnitude * scale * sign).to(out.dtype)  # [T, C] broadcast over B
    return out
