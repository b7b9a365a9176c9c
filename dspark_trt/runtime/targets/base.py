"""The target side of speculative decoding: the ``Target`` protocol, the slot bookkeeping every target shares
(``SlotTarget``), and the registry of targets that run an export directory (``TARGETS``).

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

The family (siblings, one base): ``hf.HFTarget`` (transformers), and over an export directory
``exported.ExportedTarget`` → ``onnxruntime.OnnxRuntimeTarget``, ``tensorrt.TensorRTTarget``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import torch

from ...errors import DSparkTrtError

__all__ = ["Target", "TargetOutput", "SlotTarget", "TARGETS", "target_class", "resolve_device"]

#: target name → "module:Class": a ``Target`` over an export directory (``Class.from_export(export_dir, device=,
#: **options)``), used by ``SpeculativeDecoder.from_export(..., backend=NAME)``
TARGETS: dict[str, str] = {
    "onnxruntime": "dspark_trt.runtime.targets.onnxruntime:OnnxRuntimeTarget",
    "tensorrt": "dspark_trt.runtime.targets.tensorrt:TensorRTTarget",
}


def target_class(name: str):
    """The target class registered as ``name`` in ``TARGETS`` (imported on demand)."""
    if name not in TARGETS:
        raise DSparkTrtError(f"unknown target backend {name!r}: choose one of {', '.join(sorted(TARGETS))}")
    module, _, cls = TARGETS[name].partition(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except ModuleNotFoundError as e:
        from ...optional import install_hint

        raise DSparkTrtError(f"target backend {name!r} needs the package {e.name!r}: {install_hint(e.name or '')}") \
            from None


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


def resolve_device(device) -> torch.device:
    from ...devices import resolve_device

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
