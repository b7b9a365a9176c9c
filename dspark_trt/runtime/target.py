"""The target side of speculative decoding: the ``Target`` protocol and a Hugging Face implementation.

What DSpark needs from a target model, per batch of independent requests:

* ``prefill(prompts)`` — run each prompt; return the logits at its last token (they give the first new
  token) and the tapped hidden states of every prompt token (they become the drafter's context);
* ``verify(tokens)`` — score ``Q = n+1`` new tokens per request (the anchor and n drafts) on top of the
  committed sequence; return their logits ``[B, Q, V]`` and taps ``[B, Q, m·d]``;
* ``commit(keep)`` — keep the first ``keep[b]`` of those Q tokens per request and roll the rest of the KV
  cache back (the rejected drafts); ``select(rows)`` drops finished requests;
* ``extend(prompts)`` (needed by ``RequestScheduler`` only) — like ``prefill``, but the new requests join
  the running batch after the existing ones, between rounds, without changing them.

Taps are the outputs of the drafter's ``target_layer_ids`` (DeepSeek convention: id i = output of decoder
layer i, -1 = embeddings), concatenated in that order. ``runtime/taps.py`` converts them to
``output_hidden_states`` indices with ``config.hf_hidden_state_indices`` — the one place the conventions
meet — and checks them against the model's depth; id L-1 (the last layer) is its output before the final
norm, captured explicitly.

``HFTarget`` runs any local ``transformers`` causal LM with full attention (Qwen3, Llama, ...). Batching
with different lengths uses one ``DynamicCache`` whose slots may be *holes*: padding after a short prompt,
or drafts another request accepted but this one rejected. A slot mask ``valid [B, S]`` is the attention
mask and explicit ``position_ids`` keep RoPE per request, so a request sees exactly its own committed
tokens, as if it ran alone. After each round the cache is cropped (``DynamicCache.crop``) back to the
last slot any request still uses; with one request that is an exact rollback to the accepted length.
When holes pile up past ``compact_ratio`` the cache is compacted (valid slots gathered to the front).
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence, runtime_checkable

import torch

from ..errors import DSparkTrtError
from ..taps import LayerTaps

__all__ = ["Target", "TargetOutput", "SlotTarget", "HFTarget"]


@dataclass
class TargetOutput:
    logits: torch.Tensor  # prefill: [B, V] at each prompt's last token; verify: [B, Q, V]
    taps: torch.Tensor | None  # prefill: [B, T, m·d] (right-padded to the longest prompt); verify: [B, Q, m·d]


@runtime_checkable
class Target(Protocol):
    """What ``SpeculativeDecoder`` needs from a target model (see the module docstring)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    device: torch.device
    eos_token_ids: tuple[int, ...]

    def set_taps(self, target_layer_ids: Sequence[int]) -> None: ...

    def prefill(self, prompts: Sequence[torch.Tensor]) -> TargetOutput: ...

    def verify(self, tokens: torch.Tensor, *, with_taps: bool = True) -> TargetOutput: ...

    def commit(self, keep: torch.Tensor) -> None: ...

    def select(self, rows: torch.Tensor) -> None: ...

    @property
    def lengths(self) -> torch.Tensor: ...  # [B] int64 committed tokens per request


def _resolve_device(device) -> torch.device:
    from ..devices import resolve_device

    return resolve_device(device)


class SlotTarget:
    """The slot bookkeeping every target shares (``HFTarget``, ``OnnxRuntimeTarget``): one KV cache for the
    batch whose slots may be holes, a slot mask ``valid [B, S]``, committed ``lengths``, pending verify
    slots, rollback by cropping to the last used slot, compaction when holes outgrow ``compact_ratio``.

    Subclasses hold the K/V and implement ``_crop_slots(end)``, ``_select_rows(rows)``,
    ``_gather_slots(order)`` (order [B, S'] slot indices to keep, per request) and, for ``extend`` (requests
    joining a running batch), ``_storage()`` / ``_join_rows(old, old_slots, slots)``.
    """

    compact_ratio: float = 2.0
    valid: torch.Tensor | None = None  # [B, S] bool: slot holds a committed token of that request
    _lengths: torch.Tensor | None = None  # [B] int64 committed tokens per request
    _pending: int = 0  # slots appended by the last verify, not yet committed

    @property
    def lengths(self) -> torch.Tensor:
        return self._lengths

    def _start(self, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A new batch of prompts with lengths ``lens`` [B]: slot mask [B, T] and positions [B, T]."""
        B, T = lens.numel(), int(lens.max())
        slots = torch.arange(T, device=lens.device)
        self.valid = slots.view(1, T) < lens.view(B, 1)  # [B, T]
        self._lengths = lens
        self._pending = 0
        return self.valid, slots.expand(B, T)

    def _begin_verify(self, Q: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions [B, Q] of ``Q`` new tokens and the slot mask [B, S + Q] they attend over."""
        if self._pending:
            raise DSparkTrtError(f"{type(self).__name__}.verify called twice without commit; commit the previous "
                                 f"round first")
        B = self._lengths.numel()
        positions = self._lengths.view(B, 1) + torch.arange(Q, device=self._lengths.device)  # [B, Q]
        mask = torch.cat((self.valid, torch.ones(B, Q, dtype=torch.bool, device=self.valid.device)), dim=1)
        return positions, mask

    def _end_verify(self, mask: torch.Tensor, Q: int) -> None:
        self.valid = mask
        self._pending = Q

    def commit(self, keep: torch.Tensor) -> None:
        """Keep the first ``keep[b]`` ∈ [0, Q] pending tokens of each request; roll back the rest."""
        B, S = self.valid.shape
        Q = self._pending
        keep = keep.to(self.valid.device, torch.int64)
        new = torch.arange(Q, device=self.valid.device).view(1, Q) < keep.view(B, 1)  # [B, Q]
        self.valid = torch.cat((self.valid[:, : S - Q], new), dim=1)
        self._lengths = self._lengths + keep
        self._pending = 0
        self._trim()

    def select(self, rows: torch.Tensor) -> None:
        """Keep only the requests at ``rows`` (e.g. drop finished ones)."""
        rows = rows.to(self.valid.device, torch.int64)
        self._select_rows(rows)
        self.valid = self.valid[rows]
        self._lengths = self._lengths[rows]
        self._trim()

    def _trim(self) -> None:
        """Crop slots no request uses any more; compact when holes outgrow ``compact_ratio``."""
        S = self.valid.shape[1]
        used = self.valid.any(0).nonzero()
        end = int(used.max()) + 1 if used.numel() else 0
        if end < S:
            self._crop_slots(end)
            self.valid = self.valid[:, :end]
        longest = int(self._lengths.max()) if self._lengths.numel() else 0
        if end > self.compact_ratio * max(longest, 1) and self._can_compact():
            self._compact(longest)

    def _compact(self, longest: int) -> None:
        """Move every request's committed slots to the front (order kept); the rest becomes padding."""
        B, S = self.valid.shape
        order = torch.argsort((~self.valid).to(torch.int8), dim=1, stable=True)[:, :longest]  # [B, longest]
        self._gather_slots(order)
        self.valid = torch.arange(longest, device=self.valid.device).view(1, longest) < self._lengths.view(B, 1)

    def verify_room(self, bound: int, want: int) -> int:
        """How many tokens the next ``verify`` may score without the cache passing ``bound`` slots; when ``want``
        would pass it, the holes are compacted away first (the committed tokens then fill the front)."""
        S = self.valid.shape[1]
        longest = int(self._lengths.max()) if self._lengths.numel() else 0
        if S + want > bound and longest < S and self._can_compact():
            self._compact(longest)
        return bound - self.valid.shape[1]

    def cached_slots(self) -> int:
        """Slots currently held by the KV cache (committed tokens + holes)."""
        return int(self.valid.shape[1])

    def extend(self, prompts: Sequence[torch.Tensor]) -> TargetOutput:
        """Add requests after the current ones, between rounds: prefill them alone, then join the caches
        (both padded with hole slots to the longer one). Returns ``prefill``'s output for the new prompts;
        the running requests' slots, lengths and K/V are untouched."""
        if self.valid is None or self._lengths is None or not self._lengths.numel():
            return self.prefill(prompts)
        if self._pending:
            raise DSparkTrtError(f"{type(self).__name__}.extend called between verify and commit; commit the round "
                                 f"first")
        old_storage, old_valid, old_lengths = self._storage(), self.valid, self._lengths
        out = self.prefill(prompts)
        S = max(old_valid.shape[1], self.valid.shape[1])
        self._join_rows(old_storage, old_valid.shape[1], S)
        pad = lambda m: torch.nn.functional.pad(m, (0, S - m.shape[1]), value=False)  # noqa: E731
        self.valid = torch.cat((pad(old_valid), pad(self.valid)), dim=0)  # [B + Bn, S]
        self._lengths = torch.cat((old_lengths, self._lengths))
        return out

    # -- storage (subclasses) -------------------------------------------------------------------------
    def _crop_slots(self, end: int) -> None:
        raise NotImplementedError

    def _select_rows(self, rows: torch.Tensor) -> None:
        raise NotImplementedError

    def _gather_slots(self, order: torch.Tensor) -> None:
        raise NotImplementedError

    def _can_compact(self) -> bool:
        return True

    def _storage(self):
        """The K/V storage object, kept aside by ``extend`` while the new requests are prefilled."""
        raise NotImplementedError

    def _join_rows(self, old, old_slots: int, slots: int) -> None:
        """Storage = ``old``'s rows (``old_slots`` used) then the current rows, ``slots`` slots each."""
        raise NotImplementedError


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
        from ..loader import resolve_dtype

        model_dir = Path(model_dir)
        if not (model_dir / "config.json").is_file():
            raise DSparkTrtError(f"no config.json in target directory {model_dir}; pass a local Hugging Face model dir")
        device = _resolve_device(device)
        dtype = resolve_dtype(dtype if dtype is not None else ("bf16" if device.type == "cuda" else "fp32"))
        import transformers

        extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
        from ..hf import no_progress_bars

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
