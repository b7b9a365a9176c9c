"""The Gemma-4 text target's forward with flat tensor I/O: taps, K/V cache in and new slots out, soft-capped logits.

Gemma-4 (transformers' ``Gemma4ForCausalLM``) differs from the Llama/Qwen target graph (``target_graph.py``) in
its cache, so its graph has an I/O of its own (``KV_INTERFACE``)::

    input_ids          [B, Q]          int64   new tokens
    position_ids       [B, Q]          int64   their positions
    attention_mask     [B, P + Q]      int64   slot mask of the global layers' cache (capacity P) + the new slots
    window_positions   [B, W]          int64   position of each slot of the sliding layers' cache (capacity W,
                                               −1 = empty): a ring of the last tokens, not the whole context
    logits_index       [B, K]          int64   rows that get logits
    past_key_<l> / past_value_<l>              one pair per layer that stores K/V, in layer order:
                       [B, H_g, P, D_g]        global (full_attention) layers
                       [B, H_s, W, D_s]        sliding_attention layers (their window only)
    →
    logits             [B, K, V]       fp32    final_logit_softcapping applied: cap · tanh(logits / cap), in the
                                               model dtype (each step rounded, as transformers), then fp32
    taps               [B, Q, m·d]             the drafter's target_layer_ids, before the final norm
    new_key_global / new_value_global   [L_g, B, H_g, Q, D_g]   the new slots of the storing global layers
    new_key_sliding / new_value_sliding [L_s, B, H_s, Q, D_s]   the same for the storing sliding layers

Sliding layers see a key at position k from a query at position q when q − W_model < k ≤ q (transformers'
``sliding_window_overlay``): the graph builds that bias from ``window_positions``, so the runtime may keep only the
last W_model − 1 tokens (plus a round's headroom for rollback) of each sliding layer. Layers that reuse another
layer's K/V (``num_kv_shared_layers``: ``kv_sharing_modes`` "reuse") have no cache input or output: they read
their producer's past and new K/V, which are stored once. Per-layer inputs (PLE) are computed in the graph from
``input_ids``. Attention is ``capacity_attention`` (scale 1, as Gemma-4's); the rest is transformers' modules.
"""

from __future__ import annotations

import contextlib
from typing import Sequence

import torch

from ..artifact.target_io import GEMMA4_KV_INTERFACE
from ..errors import DSparkTrtError
from ..taps import LayerTaps, decoder_layers
from .capacity_attention import NAME as ATTENTION_NAME
from .capacity_attention import LayerKV, capacity_attention, slot_bias

__all__ = ["KV_INTERFACE", "OUTPUT_NAMES", "Gemma4TargetGraph", "is_gemma4", "gemma4_input_names"]

KV_INTERFACE = GEMMA4_KV_INTERFACE
OUTPUT_NAMES = ["logits", "taps", "new_key_global", "new_value_global", "new_key_sliding", "new_value_sliding"]


def is_gemma4(config) -> bool:
    raw = config.get("architectures") if isinstance(config, dict) else getattr(config, "architectures", None)
    return bool(raw) and raw[0] == "Gemma4ForCausalLM"


def gemma4_input_names(stored_layers: Sequence[int]) -> list[str]:
    return ["input_ids", "position_ids", "attention_mask", "window_positions", "logits_index",
            *[f"past_key_{i}" for i in stored_layers], *[f"past_value_{i}" for i in stored_layers]]


def check_gemma4(config) -> None:
    """One line refusing the Gemma-4 features this graph does not implement."""
    if getattr(config, "enable_moe_block", False):
        raise DSparkTrtError("this Gemma-4 target has MoE blocks (enable_moe_block), which the target export does not "
                             "implement; pass --skip-target to export the drafter only")
    if getattr(config, "use_bidirectional_attention", None) == "all":
        raise DSparkTrtError("this Gemma-4 target attends bidirectionally (use_bidirectional_attention 'all'); the "
                             "target export is causal: pass --skip-target")
    if set(config.layer_types) != {"sliding_attention", "full_attention"}:
        raise DSparkTrtError(f"this Gemma-4 target's layer_types {sorted(set(config.layer_types))} are not both "
                             f"sliding_attention and full_attention; the Gemma-4 target export needs both")


@contextlib.contextmanager
def _capacity_attention(config):
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, capacity_attention)
    before = config._attn_implementation
    config._attn_implementation = ATTENTION_NAME
    try:
        yield
    finally:
        config._attn_implementation = before


def window_bias(window_positions: torch.Tensor, position_ids: torch.Tensor, new_valid: torch.Tensor, window: int,
                groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Score biases of a sliding layer: ``bias_past [B, 1, g·Q, W]`` (slot k seen by query q when it holds a token
    and q − window < pos(k) < q) and ``bias_new [B, 1, g·Q, Q]`` (new j seen by new i when j ≤ i, slot j valid and
    pos(i) − pos(j) < window); rows ordered as ``capacity_attention``'s grouped queries."""
    lowest = torch.finfo(torch.float32).min
    zero = torch.zeros((), dtype=torch.float32, device=position_ids.device)
    q = position_ids.unsqueeze(-1)  # [B, Q, 1]
    k = window_positions.unsqueeze(1)  # [B, 1, W]
    past = (k >= 0) & (k < q) & (k > q - window)  # [B, Q, W]
    Q = position_ids.shape[1]
    step = torch.arange(Q, device=position_ids.device)
    causal = (step.view(1, Q) <= step.view(Q, 1)).unsqueeze(0)  # [1, Q, Q]
    near = (q - position_ids.unsqueeze(1)) < window  # [B, Q, Q]: pos(i) − pos(j) < window
    new = causal & near & (new_valid != 0).unsqueeze(1)
    bias_past = torch.where(past, zero, lowest).unsqueeze(1).repeat(1, 1, groups, 1)
    bias_new = torch.where(new, zero, lowest).unsqueeze(1).repeat(1, 1, groups, 1)
    return bias_past, bias_new


def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    """``x · factor`` as PyTorch computes a tensor times a Python float: in fp32, the factor unrounded, then one
    rounding to ``x``'s dtype (an exported ``x * factor`` would round the factor to bf16 first: 2^-0.5 → 0.70703)."""
    return (x.float() * factor).to(x.dtype)


def project_per_layer_inputs(decoder, inputs_embeds: torch.Tensor, per_layer_inputs: torch.Tensor) -> torch.Tensor:
    """transformers' ``Gemma4TextModel.project_per_layer_inputs`` (``[B, Q, L, d_ple]``) with its two Python-float
    scales applied by ``scale``, so that a bf16 graph rounds where transformers does."""
    projection = scale(decoder.per_layer_model_projection(inputs_embeds), decoder.per_layer_model_projection_scale)
    projection = projection.reshape(*inputs_embeds.shape[:-1], decoder.config.num_hidden_layers,
                                    decoder.hidden_size_per_layer_input)
    projection = decoder.per_layer_projection_norm(projection)
    return scale(projection + per_layer_inputs, decoder.per_layer_input_scale)


class Gemma4TargetGraph(torch.nn.Module):
    """``forward(input_ids, position_ids, attention_mask, window_positions, logits_index, past_keys, past_values)``
    (``past_*``: one tensor per storing layer, in layer order) → logits, taps, new K/V per layer type."""

    def __init__(self, model, target_layer_ids: Sequence[int]):
        super().__init__()
        self.model = model
        cfg = model.config
        check_gemma4(cfg)
        self.cfg = cfg
        self.num_layers = int(cfg.num_hidden_layers)
        self.layer_types = list(cfg.layer_types)
        self.window = int(cfg.sliding_window)
        modes = cfg.kv_sharing_modes
        self.stored = [i for i in range(self.num_layers) if modes[i] != "reuse"]
        self.reuse_of = {}  # reuse layer → the storing layer whose K/V it reads (the last of its type before sharing)
        for i in range(self.num_layers):
            if modes[i] == "reuse":
                producers = [j for j in self.stored if j < i and self.layer_types[j] == self.layer_types[i]
                             and modes[j] == "store"]
                if not producers:
                    raise DSparkTrtError(f"Gemma-4 layer {i} reuses K/V that no earlier {self.layer_types[i]} layer "
                                         f"stores; report this config")
                self.reuse_of[i] = producers[-1]
        self.softcap = cfg.final_logit_softcapping
        self.taps = LayerTaps(target_layer_ids, self.num_layers)
        attn = [layer.self_attn for layer in decoder_layers(model)]
        self.groups = {i: int(cfg.num_attention_heads) // (a.k_proj.out_features // a.head_dim if a.k_proj is not None
                                                           else 1) for i, a in enumerate(attn)
                       if not a.is_kv_shared_layer}
        self.kv_shape = {i: (attn[i].k_proj.out_features // attn[i].head_dim, attn[i].head_dim) for i in self.stored}

    def forward(self, input_ids, position_ids, attention_mask, window_positions, logits_index, past_keys, past_values):
        decoder = self.model.model
        past = {i: (k, v) for i, k, v in zip(self.stored, past_keys, past_values)}
        full_capacity = next(past[i][0].shape[2] for i in self.stored if self.layer_types[i] == "full_attention")
        Q = input_ids.shape[1]
        new_valid = attention_mask[:, attention_mask.shape[1] - Q:]
        biases = {}
        for i in self.stored:
            g = self.groups[i]
            key = (self.layer_types[i], g)
            if key in biases:
                continue
            if self.layer_types[i] == "full_attention":
                biases[key] = slot_bias(attention_mask, full_capacity, g)
            else:
                biases[key] = window_bias(window_positions, position_ids, new_valid, self.window, g)
        hidden = decoder.embed_tokens(input_ids)  # × √d inside
        per_layer = None
        if decoder.hidden_size_per_layer_input:
            per_layer = project_per_layer_inputs(decoder, hidden, decoder.get_per_layer_inputs(input_ids, hidden))
        rope = {t: decoder.rotary_emb(hidden, position_ids, t) for t in sorted(set(self.layer_types))}
        states, new = [hidden], {}
        shared: dict = {}
        with _capacity_attention(self.model.config):
            for i, layer in enumerate(decoder_layers(self.model)):
                owner = self.reuse_of.get(i, i)
                kv = LayerKV(*past[owner])
                bias = biases[(self.layer_types[owner], self.groups[owner])]
                out = layer(hidden, per_layer[:, :, i, :] if per_layer is not None else None,
                            shared_kv_states=shared, position_embeddings=rope[self.layer_types[i]],
                            attention_mask=bias, position_ids=position_ids, cache=None, dspark_kv=kv)
                hidden = out[0] if isinstance(out, tuple) else out
                states.append(hidden)
                if i not in self.reuse_of:
                    new[i] = kv
        rows = logits_index.unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
        logits = self.model.lm_head(decoder.norm(hidden.gather(1, rows)))  # [B, K, V] model dtype
        if self.softcap is not None:  # each step rounded to the model dtype, as transformers' Gemma4ForCausalLM
            cap = float(self.softcap)
            logits = scale(torch.tanh((logits.float() / cap).to(logits.dtype)), cap)
        logits = logits.float()  # [B, K, V] fp32
        taps = self.taps.select_states(states)
        glob = [i for i in self.stored if self.layer_types[i] == "full_attention"]
        slid = [i for i in self.stored if self.layer_types[i] == "sliding_attention"]
        return (logits, taps, torch.stack([new[i].new_key for i in glob]), torch.stack([new[i].new_value for i in glob]),
                torch.stack([new[i].new_key for i in slid]), torch.stack([new[i].new_value for i in slid]))
