"""Attention over a capacity-sized K/V cache plus the step's new slots, without copying the cache.

The exported target reads each layer's cache as it lies in the runtime's buffers, ``[B, H_kv, P, D]`` with
``P`` ≥ 1 the buffer's capacity (slots past the used ones are masked), and returns only the new slots' K/V.
For a query block of ``Q`` new tokens (``g = H_q / H_kv`` query heads per K/V head, ``s = 1/√D``)::

    q      = s · query  [B, H_q, Q, D]  viewed as [B, H_kv, g·Q, D]   (query head h reads K/V head h // g)
    a_past = q · K_pastᵀ + bias_past   [B, H_kv, g·Q, P]   bias 0 where the slot mask is 1, else ``lowest``
    a_new  = q · K_newᵀ  + bias_new    [B, H_kv, g·Q, Q]   the same, causal among the new slots
    m      = max(max a_past, max a_new)          per row (fp32)
    e_*    = exp(a_* − m),  z = Σ e_past + Σ e_new
    out    = (e_past · V_past + e_new · V_new) / z   [B, H_kv, g·Q, D] → [B, Q, H_q, D]

which is ``softmax([a_past ; a_new]) · [V_past ; V_new]`` — the attention transformers computes over the
concatenated cache — without ever forming ``[K_past ; K_new]`` (an O(P) copy per layer and step) or
repeating the K/V heads g times (GQA's ``repeat_kv``: g copies). Every O(P) tensor left is one the math
needs: the scores and their exponentials, O(H_q · Q · P), touched by as few elementwise passes as the
softmax allows (the scale goes on q; in fp32 the normalisation on the [g·Q, D] output; the slot mask
becomes an additive bias built once per call, ``slot_bias``, not per layer). ``lowest`` is the most negative
finite fp32, so a row whose slots are all masked (a padded request) gives finite garbage, never NaN. Scores
are fp32; in fp16/bf16 graphs the weights are normalised, then cast to the model dtype before the value
products (transformers' eager order: the sums stay within the largest |V|).

Standard ONNX ops only (MatMul, Add, ReduceMax, Sub, Exp, ReduceSum, Div): TensorRT parses it.
"""

from __future__ import annotations

import torch

__all__ = ["NAME", "LayerKV", "capacity_attention", "slot_bias"]

#: the name this attention function is registered under in transformers' ``AttentionInterface``
NAME = "dspark_capacity"


class LayerKV:
    """One layer's past K/V (``[B, H_kv, P, D]`` each) in, its new slots' K/V (``[B, H_kv, Q, D]``) recorded."""

    def __init__(self, past_key: torch.Tensor, past_value: torch.Tensor):
        self.past_key, self.past_value = past_key, past_value
        self.new_key: torch.Tensor | None = None
        self.new_value: torch.Tensor | None = None


def slot_bias(attention_mask: torch.Tensor, past: int, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The slot mask ``[B, P + Q]`` (1 = a valid slot of this request) → additive fp32 score biases
    ``bias_past [B, 1, 1, P]`` and ``bias_new [B, 1, g·Q, Q]`` (new token i sees new token j ≤ i when slot P + j
    is valid; rows ordered as ``capacity_attention``'s grouped queries: g blocks of Q)."""
    B = attention_mask.shape[0]
    valid = attention_mask != 0
    lowest = torch.finfo(torch.float32).min
    zero = torch.zeros((), dtype=torch.float32, device=attention_mask.device)
    bias_past = torch.where(valid[:, :past], zero, lowest).view(B, 1, 1, past)
    new = valid[:, past:]  # [B, Q]
    Q = new.shape[1]
    step = torch.arange(Q, device=attention_mask.device)
    causal = step.view(1, Q) <= step.view(Q, 1)  # [Q, Q]: key j ≤ query i (Range + LessOrEqual, no Trilu)
    keep_new = causal.view(1, 1, Q, Q) & new.view(B, 1, 1, Q)
    bias_new = torch.where(keep_new, zero, lowest).repeat(1, 1, groups, 1)  # [B, 1, gQ, Q]
    return bias_past, bias_new


def capacity_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers ``AttentionInterface`` function: ``query`` [B, H_q, Q, D], ``key``/``value`` [B, H_kv, Q, D]
    (the new slots, RoPE applied), ``attention_mask`` = ``slot_bias(...)``'s pair, ``kwargs["dspark_kv"]`` the
    layer's ``LayerKV``. Returns ``(output [B, Q, H_q, D], None)``; records the new K/V on the ``LayerKV``."""
    kv: LayerKV = kwargs["dspark_kv"]
    kv.new_key, kv.new_value = key, value
    bias_past, bias_new = attention_mask
    B, Hq, Q, D = query.shape
    Hkv = key.shape[1]
    scale = float(scaling) if scaling is not None else D ** -0.5
    q = (query * scale).reshape(B, Hkv, (Hq // Hkv) * Q, D)  # rows ordered (head within the group, token)
    a_past = torch.matmul(q, kv.past_key.transpose(2, 3)).float() + bias_past  # [B, Hkv, gQ, P] fp32
    a_new = torch.matmul(q, key.transpose(2, 3)).float() + bias_new  # [B, Hkv, gQ, Q] fp32
    m = torch.maximum(a_past.amax(-1, keepdim=True), a_new.amax(-1, keepdim=True))  # [B, Hkv, gQ, 1]
    e_past, e_new = torch.exp(a_past - m), torch.exp(a_new - m)
    z = e_past.sum(-1, keepdim=True) + e_new.sum(-1, keepdim=True)  # ≥ 1: the row's largest weight is exp(0)
    dtype = query.dtype
    if dtype == torch.float32:  # normalise the [gQ, D] output, not the [gQ, P] weights: one pass fewer
        out = (torch.matmul(e_past, kv.past_value) + torch.matmul(e_new, value)) / z  # [B, Hkv, gQ, D]
    else:  # fp16/bf16: weights normalised first (as transformers' eager attention), so the sums stay ≤ max |V|
        out = torch.matmul((e_past / z).to(dtype), kv.past_value) + torch.matmul((e_new / z).to(dtype), value)
    return out.reshape(B, Hq, Q, D).transpose(1, 2).contiguous(), None  # [B, Q, Hq, D]
