"""``HFTarget``: any local ``transformers`` causal LM with full attention (Qwen3, Llama, ...) as a ``Target``.

Batching with different lengths uses one ``DynamicCache`` whose slots may be *holes*: padding after a short
prompt, or drafts another request accepted but this one rejected. A slot mask ``valid [B, S]`` is the attention
mask and explicit ``position_ids`` keep RoPE per request, so a request sees exactly its own committed tokens, as
if it ran alone. After each round the cache is cropped (``DynamicCache.crop``) back to the last slot any request
still uses; with one request that is an exact rollback to the accepted length. When holes pile up past
``compact_ratio`` the cache is compacted (valid slots gathered to the front).
"""

from __future__ import annotations

import contextlib
import inspect
from pathlib import Path
from typing import Sequence

import torch

from ...errors import DSparkTrtError
from ...taps import LayerTaps

from .base import SlotTarget, TargetOutput, resolve_device

__all__ = ["HFTarget"]


class HFTarget(SlotTarget):
    """A local ``transformers`` causal LM as a DSpark target.

    Args:
        model: a loaded ``PreTrainedModel`` (``AutoModelForCausalLM``), in eval mode.
        compact_ratio (float, *optional*, defaults to 2.0): compact the KV cache when its slot count exceeds
            this multiple of the longest committed sequence (holes left by rejected drafts in a batch).

    Example:
        >>> target = HFTarget.from_pretrained("target/", dtype="fp32", device="cpu")
        >>> target.set_taps([1, 2, 4])
    """

    def __init__(self, model, *, compact_ratio: float = 2.0):
        self.model = model
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.vocab_size = int(cfg.vocab_size)
        self.hidden_size = int(cfg.hidden_size)
        self.num_layers = int(cfg.num_hidden_layers)
        if "sliding_attention" in (getattr(cfg, "layer_types", None) or ()):
            raise DSparkTrtError(
                f"this {type(model).__name__} target has sliding-window layers, whose transformers cache HFTarget "
                f"cannot roll back past the window; export it with the drafter (dspark-export DRAFTER --target DIR "
                f"--dtype fp32) and run the export (dspark generate --export OUT, SpeculativeDecoder.from_export)")
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.eos_token_ids = _eos_ids(model)
        self.compact_ratio = compact_ratio
        self._taps_of: LayerTaps | None = None
        self._cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self.cache = None

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, *, dtype=None, device=None, attn_implementation: str | None = None,
                        **kwargs) -> "HFTarget":
        """Load ``AutoModelForCausalLM`` from a local directory (never the network)."""
        from ...loader import resolve_dtype

        model_dir = Path(model_dir)
        if not (model_dir / "config.json").is_file():
            raise DSparkTrtError(f"no config.json in target directory {model_dir}; pass a local Hugging Face model dir")
        device = resolve_device(device)
        dtype = resolve_dtype(dtype if dtype is not None else ("bf16" if device.type == "cuda" else "fp32"))
        import transformers

        extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
        from ...hf import no_progress_bars

        try:
            with no_progress_bars():
                model = transformers.AutoModelForCausalLM.from_pretrained(
                    model_dir, dtype=dtype, local_files_only=True, **extra)
        except (OSError, ValueError, KeyError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise DSparkTrtError(f"cannot load the target model from {model_dir} ({first}); pass a directory "
                                 f"with a transformers causal-LM checkpoint") from None
        return cls(model.to(device).eval().requires_grad_(False), **kwargs)

    # -- taps -----------------------------------------------------------------------------------------
    def set_taps(self, target_layer_ids: Sequence[int]) -> None:
        """Tap these layers (DeepSeek ids in [-1, L-1]; L-1 = the last layer's output before the final norm)."""
        self._taps_of = LayerTaps(target_layer_ids, self.num_layers)

    @property
    def layer_ids(self) -> tuple[int, ...] | None:
        return None if self._taps_of is None else self._taps_of.layer_ids

    def _taps(self, hidden_states) -> torch.Tensor:
        return self._taps_of.select(hidden_states)  # [B, Q, m·d]

    def _forward(self, ids, attention_mask, position_ids, logits_to_keep=0, hidden_states=True):
        if hidden_states and self._taps_of is None:
            raise DSparkTrtError("HFTarget.set_taps(target_layer_ids) must be called before prefill/verify")
        with self._taps_of.capture(self.model) if hidden_states else contextlib.nullcontext():
            out = self.model(input_ids=ids, attention_mask=attention_mask, position_ids=position_ids,
                             use_cache=True, output_hidden_states=hidden_states, logits_to_keep=logits_to_keep,
                             **{self._cache_kw: self.cache})
        self.cache = getattr(out, self._cache_kw, None) or getattr(out, "past_key_values", None)
        return out

    @torch.inference_mode()
    def prefill(self, prompts: Sequence[torch.Tensor]) -> TargetOutput:
        """Start a batch: prompts (1-D int64, any lengths ≥ 1) are right-padded into one cache."""
        from transformers import DynamicCache

        lens = torch.tensor([len(p) for p in prompts], dtype=torch.int64, device=self.device)  # [B]
        B, T = len(prompts), int(lens.max())
        ids = torch.zeros(B, T, dtype=torch.int64, device=self.device)
        for b, p in enumerate(prompts):
            ids[b, : len(p)] = p.to(self.device)
        valid, positions = self._start(lens)  # [B, T] each
        try:
            self.cache = DynamicCache(config=self.model.config)
        except TypeError:  # older transformers
            self.cache = DynamicCache()
        last = lens - 1  # [B] slot of each prompt's last token
        keep = torch.unique(last)  # logits only where needed: [U] slots, U ≤ B
        out = self._forward(ids, valid.to(torch.int64), positions, logits_to_keep=keep)
        col = torch.searchsorted(keep, last)  # [B] column of each request's last token in the kept logits
        logits = out.logits[torch.arange(B, device=self.device), col]  # [B, V]
        return TargetOutput(logits=logits, taps=self._taps(out.hidden_states))

    @torch.inference_mode()
    def verify(self, tokens: torch.Tensor, *, with_taps: bool = True) -> TargetOutput:
        """Score ``tokens`` [B, Q] at positions ``lengths … lengths+Q-1``; they stay pending until ``commit``."""
        B, Q = tokens.shape
        positions, mask = self._begin_verify(Q)  # [B, Q], [B, S + Q]
        out = self._forward(tokens.to(self.device), mask.to(torch.int64), positions, hidden_states=with_taps)
        self._end_verify(mask, Q)
        return TargetOutput(logits=out.logits, taps=self._taps(out.hidden_states) if with_taps else None)

    # -- storage: the live DynamicCache ---------------------------------------------------------------
    def _crop_slots(self, end: int) -> None:
        _crop(self.cache, self.valid.shape[1], end)

    def _select_rows(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)

    def _can_compact(self) -> bool:
        return _layers(self.cache) is not None

    def _storage(self):
        return self.cache

    def _join_rows(self, old, old_slots: int, slots: int) -> None:
        old_layers, new_layers = _layers(old), _layers(self.cache)
        if old_layers is None or new_layers is None:
            raise DSparkTrtError("this transformers version's KV cache has no per-layer keys/values, so requests "
                                 "cannot join a running batch; upgrade transformers")
        for o, n in zip(old_layers, new_layers):
            o.keys = torch.cat((_pad_slots(o.keys, slots), _pad_slots(n.keys, slots)), dim=0)  # [B+Bn, H, S, D]
            o.values = torch.cat((_pad_slots(o.values, slots), _pad_slots(n.values, slots)), dim=0)
        self.cache = old

    def _gather_slots(self, order: torch.Tensor) -> None:
        B, longest = order.shape
        for layer in _layers(self.cache):
            idx = order.view(B, 1, longest, 1).expand(B, layer.keys.shape[1], longest, layer.keys.shape[-1])
            layer.keys = layer.keys.gather(2, idx)
            layer.values = layer.values.gather(2, idx)


def _pad_slots(x: torch.Tensor, slots: int) -> torch.Tensor:
    """[B, H, S, D] → [B, H, slots, D] with zero slots appended (masked holes)."""
    return torch.nn.functional.pad(x, (0, 0, 0, slots - x.shape[2])) if x.shape[2] < slots else x


def _layers(cache):
    layers = getattr(cache, "layers", None)
    if layers is None or not all(hasattr(layer, "keys") and hasattr(layer, "values") for layer in layers):
        return None
    return layers


def _crop(cache, current: int, new_length: int) -> None:
    """``DynamicCache.crop`` to ``new_length`` slots across transformers versions (5.x: a negative count)."""
    param = next(iter(inspect.signature(cache.crop).parameters))
    if param == "tokens_to_remove":
        cache.crop(new_length - current)
    else:
        cache.crop(new_length)


def _eos_ids(model) -> tuple[int, ...]:
    ids = []
    for cfg in (getattr(model, "generation_config", None), model.config):
        value = getattr(cfg, "eos_token_id", None) if cfg is not None else None
        if value is None:
            continue
        ids.extend(value if isinstance(value, (list, tuple)) else [value])
    return tuple(dict.fromkeys(int(i) for i in ids))
