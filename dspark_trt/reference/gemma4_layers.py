"""Gemma-4 draft layers of DeepSpec's ``Gemma4DSparkModel`` (``deepspec/modeling/dspark/gemma4/modeling.py``), in
plain PyTorch, with the Qwen3 layer's interface (``reference/layers.py``): ``key_value`` for the context,
``forward(x, positions, ctx_k, ctx_v, key_valid)`` for the block.

Per layer (names as the checkpoint's, so ``load_state_dict`` needs no map)::

    a = post_attention_layernorm(attn(input_layernorm(x)))        x ← x + a
    m = post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x)))   x ← (x + m) · layer_scalar
    attn: q = rope(q_norm(q_proj)), K = rope(k_norm(k_proj)), V = v_norm(v_proj) (v_norm has no weight; with
          attention_k_eq_v V = v_norm(k_proj), before k_norm), scores q·Kᵀ unscaled (scale 1), over
          [context ; block] as ``two_part_attention``; RoPE: the full_attention (proportional) tables at D
    mlp:  down(gelu_tanh(gate(x)) ⊙ up(x))

The context K/V come from the fused context ``hidden_norm(fc(taps))`` without ``input_layernorm`` (as the Qwen3
layers', DeepSpec's ``target_hidden_states``). Numerics follow transformers' Gemma-4 modules: ``Gemma4RMSNorm``
computes in fp32 (``x · (mean(x²) + eps)^-0.5``, times the weight in fp32, then cast back), RoPE tables in fp32,
softmax in fp32.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .layers import DSparkAttention, DSparkMLP, apply_rope, rope_tables

__all__ = ["Gemma4RMSNorm", "Gemma4DraftAttention", "Gemma4MLP", "Gemma4DraftLayer"]


class Gemma4RMSNorm(nn.Module):
    """``x · (mean(x²) + eps)^-0.5`` (times ``weight`` when ``with_scale``) in fp32, cast back (Gemma4RMSNorm)."""

    def __init__(self, size: int, eps: float, with_scale: bool = True):
        super().__init__()
        self.eps = eps
        if with_scale:
            self.weight = nn.Parameter(torch.ones(size))
        else:
            self.weight = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        out = x32 * torch.pow(x32.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)
        if self.weight is not None:
            out = out * self.weight.float()
        return out.to(x.dtype)


class Gemma4DraftAttention(DSparkAttention):
    """Block queries over the cached context K/V and the block slots, Gemma-4 style (module docstring): the Qwen3
    layer's attention with Gemma-4's norms (an unscaled one on V), partial RoPE, scores unscaled, K as V with
    ``k_eq_v``."""

    score_scale = 1.0

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, eps: float, theta: float,
                 rotary_factor: float, k_eq_v: bool = False):
        nn.Module.__init__(self)  # its own projections and norms, not the Qwen3 layer's
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.theta, self.rotary_factor, self.k_eq_v = theta, rotary_factor, k_eq_v
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = None if k_eq_v else nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.q_norm = Gemma4RMSNorm(head_dim, eps)
        self.k_norm = Gemma4RMSNorm(head_dim, eps)
        self.v_norm = Gemma4RMSNorm(head_dim, eps, with_scale=False)

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype):
        return rope_tables(positions, self.head_dim, self.theta, dtype, self.rotary_factor)

    def key_value(self, h: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """h [B, S, d], positions [B, S] → K, V [B, S, H_kv, D] (k_norm + RoPE on K, the unscaled v_norm on V)."""
        B, S, _ = h.shape
        k = self.k_proj(h).view(B, S, self.kv_heads, self.head_dim)
        v = k if self.v_proj is None else self.v_proj(h).view(B, S, self.kv_heads, self.head_dim)
        cos, sin = self._rope(positions, h.dtype)
        return apply_rope(self.k_norm(k), cos, sin), self.v_norm(v)


class Gemma4MLP(DSparkMLP):
    """``down(gelu_tanh(gate(x)) ⊙ up(x))`` (Gemma4TextMLP, hidden_activation gelu_pytorch_tanh)."""

    @staticmethod
    def activation(x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate="tanh")


class Gemma4DraftLayer(nn.Module):
    """Sandwich-normed Gemma-4 layer scaled by ``layer_scalar`` (a checkpoint buffer); module docstring."""

    def __init__(self, hidden, intermediate, heads, kv_heads, head_dim, eps, theta, rotary_factor, k_eq_v=False):
        super().__init__()
        self.input_layernorm = Gemma4RMSNorm(hidden, eps)
        self.self_attn = Gemma4DraftAttention(hidden, heads, kv_heads, head_dim, eps, theta, rotary_factor, k_eq_v)
        self.post_attention_layernorm = Gemma4RMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = Gemma4RMSNorm(hidden, eps)
        self.mlp = Gemma4MLP(hidden, intermediate)
        self.post_feedforward_layernorm = Gemma4RMSNorm(hidden, eps)
        self.register_buffer("layer_scalar", torch.ones(1))  # persistent: DeepSpec's checkpoints hold it

    def forward(self, x, positions, ctx_k, ctx_v, key_valid):  # x [B, Q, d] → [B, Q, d]
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), positions, ctx_k, ctx_v,
                                                             key_valid))
        x = x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        return x * self.layer_scalar
