"""Attention over a capacity-sized K/V cache plus the step's new slots, without copying the cache.

The exported target reads each layer's cache as it lies in the runtime's buffers, ``[B, H_kv, P, D]`` with
``P`` ≥ 1 the buffer's capacity (slots past the used ones are masked), and returns only the new slots' K/V.
For a query block of ``Q`` new tokens (``g = H_q / H_kv`` query heads per K/V head, ``s = 1/√D``)::

    q      = query  [B, H_q, Q, D]  viewed as [B, H_kv, g·Q, D]    (query head h reads K/V head h // g)
    a_past = s · q · K_pastᵀ   [B, H_kv, g·Q, P]   masked where the slot mask ``keep_past [B, P]`` is 0
    a_new  = s · q · K_newᵀ    [B, H_kv, g·Q, Q]   masked where ``keep_new [B, Q, Q]`` is 0 (causal ∧ slot mask)
    m      = max(max a_past, max a_new)          per row (fp32)
    e_*    = exp(a_* − m),  z = Σ e_past + Σ e_new
    out    = (e_past / z) · V_past + (e_new / z) · V_new     [B, H_kv, g·Q, D] → [B, Q, H_q, D]

which is ``softmax([a_past ; a_new]) · [V_past ; V_new]`` — the attention transformers computes over the
concatenated cache — without ever forming ``[K_past ; K_new]`` (an O(P) copy per layer and step) or
repeating the K/V heads g times (GQA's ``repeat_kv``: g copies). Every O(P) tensor left is one the math
needs: the scores and their exponentials, O(H_q · Q · P). Masked scores are the most negative finite fp32,
so a row whose slots are all masked (a padded request) gives finite garbage, never NaN. Scores and
weights are computed in fp32 and the weights cast to the model dtype before the value products, as
transformers' eager attention does.

Standard ONNX ops only (MatMul, Where, ReduceMax, Exp, ReduceSum, Div, Add): TensorRT parses it.
"""

from __future__ import annotations

import torch

__all__ = ["NAME", "LayerKV", "capacity_attention", "slot_masks"]

#: the name this attention function is registered under in transformers' ``AttentionInterface``
NAME = "dspark_capacity"


class LayerKV:
    """One layer's past K/V (``[B, H_kv, P, D]`` each) in, its new slots' K/V (``[B, H_kv, Q, D]``) recorded."""

    def __init__(self, past_key: torch.Tensor, past_value: torch.Tensor):
        self.past_key, self.past_value = past_key, past_value
        self.new_key: torch.Tensor | None = None
        self.new_value: torch.Tensor | None = None


def slot_masks(attention_mask: torch.Tensor, past: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The slot mask ``[B, P + Q]`` (1 = a valid slot of this request) → ``keep_past [B, 1, 1, P]`` and
    ``keep_new [B, 1, Q, Q]`` (new token i sees new token j ≤ i when slot P + j is valid), both bool."""
    B, S = attention_mask.shape
    valid = attention_mask != 0
    keep_past = valid[:, :past].view(B, 1, 1, past)
    new = valid[:, past:]  # [B, Q]
    Q = new.shape[1]
    step = torch.arange(Q, device=attention_mask.device)
    causal = step.view(1, Q) <= step.view(Q, 1)  # [Q, Q]: key j ≤ query i (Range + LessOrEqual, no Trilu)
    keep_new = (causal.view(1, 1, Q, Q) & new.view(B, 1, 1, Q))
    return keep_past, keep_new


def capacity_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers ``AttentionInterface`` function: ``query`` [B, H_q, Q, D], ``key``/``value`` [B, H_kv, Q, D]
    (the new slots, RoPE applied), ``attention_mask`` = ``slot_masks(...)``'s pair, ``kwargs["dspark_kv"]`` the
    layer's ``LayerKV``. Returns ``(output [B, Q, H_q, D], None)``; records the new K/V on the ``LayerKV``."""
    kv: LayerKV = kwargs["dspark_kv"]
    kv.new_key, kv.new_value = key, value
    keep_past, keep_new = attention_mask
    B, Hq, Q, D = query.shape
    Hkv = key.shape[1]
    g = Hq // Hkv
    scale = float(scaling) if scaling is not None else D ** -0.5
    lowest = torch.finfo(torch.float32).min
    q = query.reshape(B, Hkv, g * Q, D)  # rows ordered (head within the group, token)
    a_past = torch.matmul(q, kv.past_key.transpose(2, 3)).float() * scale  # [B, Hkv, gQ, P] fp32
    a_new = torch.matmul(q, key.transpose(2, 3)).float() * scale  # [B, Hkv, gQ, Q] fp32
    a_past = torch.where(keep_past, a_past, lowest)
    a_new = torch.where(keep_new.repeat(1, 1, g, 1), a_new, lowest)  # [B, 1, gQ, Q] mask, rows as q's
    m = torch.maximum(a_past.amax(-1, keepdim=True), a_new.amax(-1, keepdim=True))  # [B, Hkv, gQ, 1]
    e_past, e_new = torch.exp(a_past - m), torch.exp(a_new - m)
    z = e_past.sum(-1, keepdim=True) + e_new.sum(-1, keepdim=True)
    dtype = query.dtype
    out = torch.matmul((e_past / z).to(dtype), kv.past_value) + torch.matmul((e_new / z).to(dtype), value)
    return out.reshape(B, Hq, Q, D).transpose(1, 2).contiguous(), None  # [B, Q, Hq, D]
