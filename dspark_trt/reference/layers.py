"""Qwen3 building blocks of the DSpark draft backbone, in plain PyTorch (docs/dspark.md §4).

Names mirror the checkpoint (``self_attn.q_proj``, ``mlp.gate_proj``, ...) so ``load_state_dict`` needs
no name map. Numerics follow transformers' Qwen3: RMSNorm in fp32 then cast back, RoPE tables in fp32,
softmax in fp32.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["RMSNorm", "rope_tables", "apply_rope", "block_attention_mask", "two_part_attention", "DSparkAttention",
           "DSparkMLP", "DSparkDecoderLayer"]


class RMSNorm(nn.Module):
    """``w ⊙ x / sqrt(mean(x²) + eps)`` over the last dim, computed in fp32 (Qwen3RMSNorm)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype,
                rotary_factor: float = 1.0):
    """cos, sin [..., D] for integer positions [...] (rotate-half layout). ``rotary_factor`` 1: default RoPE; below
    1: transformers' *proportional* RoPE (Gemma-4's full-attention layers): the first ``int(f·D // 2)`` frequencies
    ``θ^(-2i/D)`` (over D, not the rotated width), the rest 0, so those channel pairs keep their values."""
    angles = int(rotary_factor * head_dim // 2)
    inv_freq = 1.0 / (theta ** (torch.arange(0, 2 * angles, 2, dtype=torch.int64, device=positions.device).float() / head_dim))
    if angles < head_dim // 2:  # proportional: the pairs past the rotated share do not turn
        inv_freq = torch.cat((inv_freq, inv_freq.new_zeros(head_dim // 2 - angles)))
    freqs = positions.to(torch.float32).unsqueeze(-1) * inv_freq  # [..., D/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [..., D]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, S, H, D]; cos/sin [B, S, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.unsqueeze(2) + rotated * sin.unsqueeze(2)


def block_attention_mask(
    ctx_len: torch.Tensor,  # [B] int: p, the valid context rows (= the anchor's position)
    T: int,  # context rows in the K/V tensors (≥ every ctx_len; the rest is padding)
    Q: int,  # block slots
    window: int | None,  # sliding window W: context rows p-W … p-1 only; None = all rows < p
    causal: bool,  # block slot i sees slots 0 … i only (else every slot)
    ctx_start: torch.Tensor | None = None,  # [B] int: the position held by context row 0 (None = 0)
) -> torch.Tensor:
    """Which keys ``[context rows ; block slots]`` each block query sees: [B, Q, T+Q] bool ([B, 1, T+Q] when
    no query differs), the speculators training mask (``create_anchor_block_mask_mod``) for one anchor.
    Context row r holds position ``ctx_start + r`` (a sliding cache, ``runtime/drafter_state.py``, drops the
    rows a window no longer reads; their keys keep the RoPE of their positions, so only the mask moves)."""
    B = ctx_len.shape[0]
    rows = torch.arange(T, device=ctx_len.device).view(1, T)
    if ctx_start is not None:
        rows = rows + ctx_start.view(B, 1).to(rows.dtype)  # [B, T] positions
    p = ctx_len.view(B, 1)
    ctx = rows < p  # [B, T]
    if window is not None:
        ctx = ctx & (rows >= p - window)
    if not causal:
        return torch.cat((ctx, torch.ones(B, Q, dtype=torch.bool, device=ctx.device)), dim=1).view(B, 1, T + Q)
    slots = torch.arange(Q, device=ctx_len.device)
    blk = (slots.view(1, Q) <= slots.view(Q, 1)).view(1, Q, Q).expand(B, Q, Q)  # [B, Q, Q]: key slot ≤ query slot
    return torch.cat((ctx.view(B, 1, T).expand(B, Q, T), blk), dim=2)


def two_part_attention(
    q: torch.Tensor,  # [B, Q, H, D] block queries (RoPE applied)
    ctx_k: torch.Tensor,  # [B, H_kv, T, D] context keys, heads first (read as they lie: no copy when contiguous)
    ctx_v: torch.Tensor,  # [B, H_kv, T, D]
    k_blk: torch.Tensor,  # [B, Q, H_kv, D] the block's own keys
    v_blk: torch.Tensor,  # [B, Q, H_kv, D]
    key_valid: torch.Tensor,  # [B, Q or 1, T + Q] bool (block_attention_mask)
    scale: float,
) -> torch.Tensor:  # [B, Q, H, D]
    """``softmax([q·K_ctxᵀ ; q·K_blkᵀ]) · [V_ctx ; V_blk]`` without forming ``[K_ctx ; K_blk]`` (a copy of the
    whole context per layer and round) or repeating the K/V heads for the ``g = H / H_kv`` query heads that
    share them (GQA: g more copies). The queries are grouped instead (``[B, H_kv, g·Q, D]``: query head h
    reads K/V head h // g), the two score blocks share one fp32 max and sum, and the context is read where
    it lies (``runtime/drafter_state.py`` holds it heads-first, so ``ctx_k`` is a view of the cache). Scores
    come from fp32 products and the softmax is fp32, as the reference always computed them (in an fp16/bf16
    drafter the keys are cast to fp32 for the products: the one pass over the context left, which keeps its
    drafts equal to fp32's on massive activations); the weights are cast to the model dtype before the value
    products. Only standard ONNX ops (MatMul, Where, ReduceMax,
    Exp, ReduceSum, Div). A block slot always sees itself, so every row's max is finite."""
    B, Q, H, D = q.shape
    Hkv, T = ctx_k.shape[1], ctx_k.shape[2]
    g = H // Hkv
    dtype = q.dtype
    qg = q.transpose(1, 2).reshape(B, Hkv, g * Q, D)  # rows ordered (head within the group, slot)
    valid = key_valid.unsqueeze(1)  # [B, 1, Q or 1, T + Q]
    if valid.shape[2] != 1:
        valid = valid.repeat(1, 1, g, 1)  # [B, 1, g·Q, T + Q] (a bool mask, not the cache)
    minus_inf = torch.tensor(float("-inf"), dtype=torch.float32, device=q.device)
    qf = qg.float()  # scores from fp32 products (as before): an fp16/bf16 drafter then drafts what fp32 drafts
    a_blk = torch.matmul(qf, k_blk.float().permute(0, 2, 3, 1)) * scale  # [B, H_kv, gQ, Q] fp32
    a_blk = torch.where(valid[..., T:], a_blk, minus_inf)
    m = a_blk.amax(-1, keepdim=True)  # [B, H_kv, gQ, 1]
    if T:
        a_ctx = torch.matmul(qf, ctx_k.float().transpose(2, 3)) * scale  # [B, H_kv, gQ, T] fp32 (fp32: no cast)
        a_ctx = torch.where(valid[..., :T], a_ctx, minus_inf)
        m = torch.maximum(m, a_ctx.amax(-1, keepdim=True))
    e_blk = torch.exp(a_blk - m)
    z = e_blk.sum(-1, keepdim=True)
    if T:
        e_ctx = torch.exp(a_ctx - m)
        z = z + e_ctx.sum(-1, keepdim=True)
    out = torch.matmul((e_blk / z).to(dtype), v_blk.transpose(1, 2))  # [B, H_kv, gQ, D]
    if T:
        out = out + torch.matmul((e_ctx / z).to(dtype), ctx_v)
    return out.reshape(B, H, Q, D).transpose(1, 2)  # [B, Q, H, D]


class DSparkAttention(nn.Module):
    """Block queries attend to the cached context K/V and to the block slots, as ``key_valid`` allows."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, eps: float, theta: float):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.theta = heads, kv_heads, head_dim, theta
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)

    def key_value(self, h: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """h [B, S, d], positions [B, S] → K, V [B, S, H_kv, D] (k_norm + RoPE on K, nothing on V)."""
        B, S, _ = h.shape
        k = self.k_norm(self.k_proj(h).view(B, S, self.kv_heads, self.head_dim))
        cos, sin = self._rope(positions, h.dtype)
        return apply_rope(k, cos, sin), self.v_proj(h).view(B, S, self.kv_heads, self.head_dim)

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype):
        return rope_tables(positions, self.head_dim, self.theta, dtype)

    @property
    def score_scale(self) -> float:
        """The factor on q·k before the softmax: 1/√D."""
        return self.head_dim ** -0.5

    def forward(
        self,
        x: torch.Tensor,  # [B, Q, d] normed block input
        positions: torch.Tensor,  # [B, Q] int64
        ctx_k: torch.Tensor,  # [B, H_kv, T, D] cached context keys (RoPE applied), heads first
        ctx_v: torch.Tensor,  # [B, H_kv, T, D]
        key_valid: torch.Tensor,  # [B, Q or 1, T + Q] bool (block_attention_mask)
    ) -> torch.Tensor:
        B, Q, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, Q, self.heads, self.head_dim))
        cos, sin = self._rope(positions, x.dtype)
        q = apply_rope(q, cos, sin)  # [B, Q, H, D]
        k_blk, v_blk = self.key_value(x, positions)  # [B, Q, H_kv, D]
        out = two_part_attention(q, ctx_k, ctx_v, k_blk, v_blk, key_valid, self.score_scale)  # [B, Q, H, D]
        out = out.reshape(B, Q, self.heads * self.head_dim)
        return self.o_proj(out)


class DSparkMLP(nn.Module):
    """``down(act(gate(x)) ⊙ up(x))``, act SiLU."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    @staticmethod
    def activation(x: torch.Tensor) -> torch.Tensor:
        return F.silu(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.activation(self.gate_proj(x)) * self.up_proj(x))


class DSparkDecoderLayer(nn.Module):
    """Pre-norm Qwen3 layer; the context K/V skip ``input_layernorm`` (docs/dspark.md §4.2)."""

    def __init__(self, hidden, intermediate, heads, kv_heads, head_dim, eps, theta):
        super().__init__()
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = DSparkAttention(hidden, heads, kv_heads, head_dim, eps, theta)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = DSparkMLP(hidden, intermediate)

    def forward(self, x, positions, ctx_k, ctx_v, key_valid):
        x = x + self.self_attn(self.input_layernorm(x), positions, ctx_k, ctx_v, key_valid)
        return x + self.mlp(self.post_attention_layernorm(x))
