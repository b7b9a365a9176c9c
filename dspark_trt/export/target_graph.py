"""The exported target's forward: a ``torch.nn.Module`` around a ``transformers`` causal LM with flat tensor I/O.

One graph serves prefill (Q = prompt, P = 0) and verify (Q = n + 1 on P past slots)::

    input_ids       [B, Q]          int64   new tokens
    position_ids    [B, Q]          int64   their positions (per request; holes don't count)
    attention_mask  [B, P + Q]      int64   1 = the slot holds a valid token of this request (past + new)
    past_key/value  [L, B, H, P, D] dt      P may be 0
    →
    logits          [B, Q, V]       fp32
    taps            [B, Q, m·d]     dt      the drafter's target_layer_ids order (runtime/taps.py)
    new_key/value   [L, B, H, Q, D] dt      the new slots' K/V only (the caller appends them)

The module rebuilds a ``DynamicCache`` from the stacked past, calls the model with explicit positions and the
slot mask — exactly what ``HFTarget`` does with its live cache — and returns the slots the model appended.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..errors import DSparkTrtError
from ..taps import LayerTaps

__all__ = ["TargetShape", "TargetGraph", "INPUT_NAMES", "OUTPUT_NAMES", "target_shape"]

INPUT_NAMES = ["input_ids", "position_ids", "attention_mask", "past_key", "past_value"]
OUTPUT_NAMES = ["logits", "taps", "new_key", "new_value"]
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


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


def _cache_kw(model) -> str:
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class TargetGraph(torch.nn.Module):
    """``forward(input_ids, position_ids, attention_mask, past_key, past_value)`` → logits, taps, new K/V."""

    def __init__(self, model, target_layer_ids: Sequence[int]):
        super().__init__()
        self.model = model
        self.shape = target_shape(model.config)
        self.taps = LayerTaps(target_layer_ids, self.shape.num_layers)
        self._cache_kw = _cache_kw(model)

    def _cache(self, past_key: torch.Tensor, past_value: torch.Tensor):
        from transformers import DynamicCache

        try:
            cache = DynamicCache(config=self.model.config)
        except TypeError:  # older transformers
            cache = DynamicCache()
        for layer in range(self.shape.num_layers):
            cache.update(past_key[layer], past_value[layer], layer)
        return cache

    def forward(self, input_ids, position_ids, attention_mask, past_key, past_value):
        P = past_key.shape[3]
        cache = self._cache(past_key, past_value)
        with self.taps.capture(self.model):
            out = self.model(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                             use_cache=True, output_hidden_states=True, **{self._cache_kw: cache})
        cache = getattr(out, self._cache_kw, None) or getattr(out, "past_key_values", None) or cache
        layers = getattr(cache, "layers", None)
        if layers is not None:
            keys = [layer.keys for layer in layers]
            values = [layer.values for layer in layers]
        else:  # older transformers
            keys, values = cache.key_cache, cache.value_cache
        new_key = torch.stack([k[:, :, P:] for k in keys])  # [L, B, H, Q, D]
        new_value = torch.stack([v[:, :, P:] for v in values])  # [L, B, H, Q, D]
        taps = self.taps.select(out.hidden_states)  # [B, Q, m·d]
        return out.logits.float(), taps, new_key, new_value


def check_architecture(config) -> str:
    """The target's architecture (a transformers config or its config.json dict), refused when not supported."""
    raw = config.get("architectures") if isinstance(config, dict) else getattr(config, "architectures", None)
    arch = (raw or ["?"])[0]
    if arch not in SUPPORTED_ARCHITECTURES:
        raise DSparkTrtError(f"target architecture {arch} is not supported by the target export (supported: "
                             f"{', '.join(SUPPORTED_ARCHITECTURES)}); pass --skip-target to export the drafter only")
    return arch
