"""``ExportedTarget``: the shared base of the targets that run an export's target graph (``onnx/target.onnx`` in
onnxruntime, its TensorRT engine): the K/V cache, taps, prefill in chunks and the storage hooks of ``SlotTarget``.

The graph is stateless (``export/target_graph.py``; its I/O: ``artifact/target_io.py``): it reads each layer's
K/V cache in place and returns the new slots' K/V. The cache lives in persistent buffers
``[L, B, H, capacity, D]`` (``runtime/kv_cache.py``: capacity buckets, grown when a round would overflow) whose
per-layer views are the graph's inputs as they lie — a step copies only its new slots, whatever the context —
with the slot bookkeeping of ``HFTarget`` (``SlotTarget``): right-padded prefill, a slot mask with holes for
padding and per-request rejections, rollback by length after each round, ``select`` for finished requests,
compaction when holes pile up. Long prompts are prefilled in chunks of ``prefill_chunk`` tokens (peak memory
bounded by the chunk, not the prompt), logits only at each prompt's last token. Taps are baked into the graph at
export; ``set_taps`` checks they are the drafter's.

Subclasses run the graph: ``_run(ids, positions, mask, rows, headroom)`` → logits, taps, plus ``prefill`` and
``verify`` on their device.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ...artifact.target_io import MAX_NEW_TOKENS
from ...errors import DSparkTrtError
from ..kv_cache import KVCache
from .base import SlotTarget, TargetOutput

__all__ = ["ExportedTarget", "prefill_chunks", "capacity_mask", "PREFILL_CHUNK", "ROUND_HEADROOM"]

#: tokens per prefill chunk (a prompt of T tokens runs as ⌈T / chunk⌉ graph calls over the growing cache). On a
#: CPU, 2,048 tokens took 17 s in chunks of 128 or 256, 20 s in chunks of 512, 32 s (and 0.6 GiB more) at once;
#: at most the graph profile's ``MAX_NEW_TOKENS``
PREFILL_CHUNK = min(256, MAX_NEW_TOKENS)
#: slots reserved past the prompt at prefill, so the first rounds do not grow the cache at once
ROUND_HEADROOM = 16


def prefill_chunks(length: int, chunk: int | None) -> list[tuple[int, int]]:
    """[start, end) token ranges of a prefill of ``length`` tokens in chunks of ``chunk`` (None/0: one range)."""
    if length < 1:
        raise DSparkTrtError("a prompt needs at least one token")
    step = length if not chunk or chunk >= length else int(chunk)
    return [(a, min(a + step, length)) for a in range(0, length, step)]


def capacity_mask(mask: torch.Tensor, used: int, past: int) -> torch.Tensor:
    """The graph's ``attention_mask`` [B, past + Q] int64 from the slot mask ``mask`` [B, used + Q]: the used
    slots, zeros up to the capacity ``past`` the graph reads, then the Q new slots."""
    B, Q = mask.shape[0], mask.shape[1] - used
    out = torch.zeros(B, past + Q, dtype=torch.int64, device=mask.device)
    out[:, :used] = mask[:, :used]
    out[:, past:] = mask[:, used:]
    return out


class ExportedTarget(SlotTarget):
    """What the exported-graph targets share; their constructors call ``_init_exported`` with the target's shapes
    (from the manifest's ``target`` section) and the dtype their cache is kept in."""

    def _init_exported(self, *, num_layers: int, num_key_value_heads: int, head_dim: int, hidden_size: int,
                       vocab_size: int, layer_ids: Sequence[int], dtype: torch.dtype, eos_token_ids: Sequence[int],
                       device: torch.device, compact_ratio: float, max_context: int | None,
                       prefill_chunk: int | None, cache_dtype: torch.dtype) -> None:
        self.num_layers, self.hidden_size, self.vocab_size = int(num_layers), int(hidden_size), int(vocab_size)
        self.num_key_value_heads, self.head_dim = int(num_key_value_heads), int(head_dim)
        self.layer_ids = tuple(int(i) for i in layer_ids)
        self.dtype = dtype
        self.eos_token_ids = tuple(int(i) for i in eos_token_ids)
        self.device = device
        self.compact_ratio = compact_ratio
        self.max_context = max_context
        self.prefill_chunk = prefill_chunk
        self.cache = KVCache(num_layers=self.num_layers, kv_heads=self.num_key_value_heads, head_dim=self.head_dim,
                             dtype=cache_dtype, device=self.device)
        self._taps_set = False

    def set_taps(self, target_layer_ids: Sequence[int]) -> None:
        """The taps are part of the graph: ``target_layer_ids`` must be the ones it was exported with."""
        ids = tuple(int(i) for i in target_layer_ids)
        if ids != self.layer_ids:
            raise DSparkTrtError(f"the exported target taps layers {list(self.layer_ids)} but the drafter needs "
                                 f"{list(ids)}; export this drafter with its target (dspark-export DRAFTER --target "
                                 f"TARGET)")
        self._taps_set = True

    def _room(self, slots: int, headroom: int) -> int:
        """Slots to reserve: ``slots`` plus ``headroom`` within the export's bound."""
        room = slots + headroom
        return room if self.max_context is None else max(slots, min(room, self.max_context))

    def _prefill(self, ids: torch.Tensor, lens: torch.Tensor) -> TargetOutput:
        """Right-padded prompts ``ids`` [B, T] (lengths ``lens``) into a fresh cache, chunk by chunk: the cache grows
        with the chunks, so each one attends over about the slots before it; logits only at each prompt's end."""
        B, T = ids.shape
        valid, positions = self._start(lens)  # [B, T] each
        self.cache.clear()
        last = lens - 1  # [B] slot of each prompt's last token
        logits = torch.empty(B, self.vocab_size, dtype=torch.float32, device=self.device)
        taps = []
        for a, b in prefill_chunks(T, self.prefill_chunk):
            room = ROUND_HEADROOM if b == T else 0  # the last chunk leaves room for the first rounds
            index = (last - a).clamp(0, b - a - 1).view(B, 1)  # [B, 1]: the prompt's last token, if in this chunk
            chunk_logits, chunk_taps = self._run(ids[:, a:b], positions[:, a:b], valid[:, :b], index, room)
            ends = ((last >= a) & (last < b)).nonzero().view(-1)
            logits[ends] = chunk_logits[ends, 0].to(logits.device)
            taps.append(chunk_taps)
        return TargetOutput(logits=logits, taps=torch.cat(taps, dim=1) if len(taps) > 1 else taps[0])

    def _check_taps(self) -> None:
        if not self._taps_set:
            raise DSparkTrtError(f"{type(self).__name__}.set_taps(target_layer_ids) must be called before prefill/verify")

    def _crop_slots(self, end: int) -> None:
        """Rollback by length: slots ≥ end are simply reused by the next round."""

    def _select_rows(self, rows: torch.Tensor) -> None:
        self.cache.select(rows)

    def _storage(self):
        return self.cache.k, self.cache.v

    def _join_rows(self, old, old_slots: int, slots: int) -> None:
        self.cache.join(old[0], old[1], old_slots, self.valid.shape[1])

    def _gather_slots(self, order: torch.Tensor) -> None:
        self.cache.gather_slots(order)

    def fork(self) -> "ExportedTarget":
        """Another target on the same graph session with a cache and slots of its own (e.g. one per context length
        in a benchmark, without loading the graph again)."""
        import copy

        other = copy.copy(self)
        other.cache = KVCache(num_layers=self.num_layers, kv_heads=self.num_key_value_heads, head_dim=self.head_dim,
                              dtype=self.cache.dtype, device=self.device)
        other.valid = other._lengths = None
        other._pending = 0
        return other

    def cache_bytes(self) -> int:
        """Bytes held by the K/V cache now (memory per request = this / batch)."""
        return self.cache.nbytes()
