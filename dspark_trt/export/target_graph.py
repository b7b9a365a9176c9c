"""The exported target's forward: a ``torch.nn.Module`` around a ``transformers`` causal LM with flat tensor I/O.

One graph serves prefill (Q = prompt or a chunk of it) and verify (Q = n + 1 new tokens)::

    input_ids        [B, Q]         int64   new tokens
    position_ids     [B, Q]         int64   their positions (per request; holes don't count)
    attention_mask   [B, P + Q]     int64   1 = the slot holds a valid token of this request (past + new)
    logits_index     [B, K]         int64   which new tokens (0 … Q-1) get logits: all of them in a verify,
                                            a prompt's last token in a prefill chunk (no lm_head for the rest)
    past_key_<l>     [B, H, P, D]   dt      layer l's K/V cache as the runtime holds it: P ≥ 1 its capacity,
    past_value_<l>   [B, H, P, D]   dt      slots past the used ones masked (0 in attention_mask)
    →
    logits           [B, K, V]      fp32
    taps             [B, Q, m·d]    dt      the drafter's target_layer_ids order (runtime/taps.py)
    new_key/value    [L, B, H, Q, D] dt     the new slots' K/V only (the runtime writes them into its cache)

The past is read in place, one input per layer so that each is a contiguous view of the runtime's
``[L, B, H, capacity, D]`` buffers (no per-step copy or conversion of the cache, and nothing in the graph
copies it either: ``export/capacity_attention.py``). The module runs the model's own embedding, rotary
embedding, decoder layers (norms, projections, MLP) and final norm, with transformers' attention swapped for
``capacity_attention`` while it runs — the only change to the math is where the softmax is summed.

``KV_INTERFACE`` (``artifact/target_io.py``) names this I/O; the manifest's target section records it, and the runtimes refuse a target
graph exported with another (older exports took one stacked ``past_key [L, B, H, P, D]``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Sequence

import torch

from ..errors import DSparkTrtError
from ..taps import LayerTaps, decoder_layers
from .capacity_attention import NAME as ATTENTION_NAME
from .capacity_attention import LayerKV, capacity_attention, slot_bias

__all__ = ["TargetShape", "TargetGraph", "target_shape", "check_architecture"]

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Gemma4ForCausalLM")


@dataclass(frozen=True)
class TargetShape:
    """What the graph's tensors look like (read from the model config)."""

    num_layers: int
    num_key_value_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int


def target_shape(config) -> TargetShape:
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = int(cfg.num_attention_heads)
    head_dim = getattr(cfg, "head_dim", None) or int(cfg.hidden_size) // heads
    return TargetShape(num_layers=int(cfg.num_hidden_layers),
                       num_key_value_heads=int(getattr(cfg, "num_key_value_heads", None) or heads),
                       head_dim=int(head_dim), hidden_size=int(cfg.hidden_size), vocab_size=int(cfg.vocab_size))


@contextlib.contextmanager
def _capacity_attention(config):
    """transformers' attention modules call ``capacity_attention`` while the block runs (then as before)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, capacity_attention)
    before = config._attn_implementation
    config._attn_implementation = ATTENTION_NAME
    try:
        yield
    finally:
        config._attn_implementation = before


class TargetGraph(torch.nn.Module):
    """``forward(input_ids, position_ids, attention_mask, logits_index, past_keys, past_values)`` → logits, taps,
    new K/V (``past_keys`` / ``past_values``: lists of L tensors [B, H, P, D])."""

    def __init__(self, model, target_layer_ids: Sequence[int]):
        super().__init__()
        self.model = model
        self.shape = target_shape(model.config)
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.groups = int(cfg.num_attention_heads) // self.shape.num_key_value_heads  # query heads per K/V head
        self.taps = LayerTaps(target_layer_ids, self.shape.num_layers)

    def forward(self, input_ids, position_ids, attention_mask, logits_index, past_keys, past_values):
        decoder = self.model.get_decoder() if hasattr(self.model, "get_decoder") else self.model.model
        bias = slot_bias(attention_mask, past_keys[0].shape[2], self.groups)  # [B, 1, 1, P], [B, 1, gQ, Q] fp32
        hidden = decoder.embed_tokens(input_ids)  # [B, Q, d]
        rope = decoder.rotary_emb(hidden, position_ids)  # cos, sin [B, Q, D]
        states, kvs = [hidden], []
        with _capacity_attention(self.model.config):
            for layer, past_k, past_v in zip(decoder_layers(self.model), past_keys, past_values):
                kv = LayerKV(past_k, past_v)
                out = layer(hidden, attention_mask=bias, position_ids=position_ids, position_embeddings=rope,
                            dspark_kv=kv)
                hidden = out[0] if isinstance(out, tuple) else out  # transformers 4.x returns a tuple
                states.append(hidden)
                kvs.append(kv)
        rows = logits_index.unsqueeze(-1).expand(-1, -1, hidden.shape[-1])  # [B, K, d]
        logits = self.model.lm_head(decoder.norm(hidden.gather(1, rows))).float()  # [B, K, V]
        taps = self.taps.select_states(states)  # [B, Q, m·d]
        new_key = torch.stack([kv.new_key for kv in kvs])  # [L, B, H, Q, D]
        new_value = torch.stack([kv.new_value for kv in kvs])
        return logits, taps, new_key, new_value


def check_architecture(config) -> str:
    """The target's architecture (a transformers config or its config.json dict), refused when not supported."""
    raw = config.get("architectures") if isinstance(config, dict) else getattr(config, "architectures", None)
    arch = (raw or ["?"])[0]
    get = config.get if isinstance(config, dict) else lambda k: getattr(config, k, None)
    if arch == "Gemma4ForCausalLM":  # its own graph: export/gemma4_target_graph.py
        if get("enable_moe_block"):
            raise DSparkTrtError("this Gemma-4 target has MoE blocks (enable_moe_block), which the target export does "
                                 "not implement; pass --skip-target to export the drafter only")
        if get("use_bidirectional_attention") == "all":
            raise DSparkTrtError("this Gemma-4 target attends bidirectionally (use_bidirectional_attention 'all'); the "
                                 "target export is causal: pass --skip-target")
        return arch
    if arch.startswith("Gemma4"):
        raise DSparkTrtError(f"target architecture {arch} (a multimodal Gemma-4) is not exported; export its text "
                             f"model (Gemma4ForCausalLM), or pass --skip-target to export the drafter only")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise DSparkTrtError(f"target architecture {arch} is not supported by the target export (supported: "
                             f"{', '.join(SUPPORTED_ARCHITECTURES)}); pass --skip-target to export the drafter only")
    windowed = sorted({t for t in get("layer_types") or () if t != "full_attention"})
    if windowed or get("use_sliding_window"):
        raise DSparkTrtError(f"this {arch} has {', '.join(windowed) or 'sliding-window'} layers; the target export "
                             f"attends over the full context only: pass --skip-target to export the drafter only")
    return arch
