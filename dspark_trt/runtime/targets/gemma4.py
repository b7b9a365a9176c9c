"""The caches of an exported Gemma-4 text target (``export/gemma4_target_graph.py``), which
``onnxruntime.Gemma4OnnxRuntimeTarget`` runs.

The graph takes the global layers' caches and the sliding layers' caches as two families of different shapes
(``[B, H_g, P, D_g]`` and ``[B, H_s, W, D_s]``) plus ``window_positions`` [B, W], the position of each sliding slot
(−1: empty); layers that reuse another layer's K/V have no cache. Here both families are ``KVCache`` buffers with
the same slot layout as every other exported target (right-padded prefill, holes, rollback by length, compaction:
``SlotTarget``), and ``window_positions`` are the slots' positions, so the sliding layers attend only within their
window by position. This runtime keeps the sliding layers' slots for the whole context (the graph also takes a
ring of the last window − 1 + headroom tokens — what its validation feeds — but the runtime's ring is not written
yet: memory for sliding layers is that of global ones).
"""

from __future__ import annotations

import torch

from ..kv_cache import KVCache

__all__ = ["TypeCaches", "slot_positions"]


def slot_positions(mask: torch.Tensor, capacity: int) -> torch.Tensor:
    """``window_positions`` [B, capacity] from the slot mask [B, S] (S ≤ capacity): each valid slot's position
    (holes do not count, as ``position_ids``), −1 for holes, padding and unused capacity."""
    B, S = mask.shape
    valid = mask != 0
    pos = torch.where(valid, valid.long().cumsum(1) - 1, torch.full_like(mask, -1, dtype=torch.int64))
    out = torch.full((B, capacity), -1, dtype=torch.int64)
    out[:, :S] = pos
    return out


class TypeCaches:
    """The global and the sliding layers' ``KVCache`` with one slot layout: every ``KVCache`` operation on both."""

    def __init__(self, *, glob: tuple[int, int, int], slid: tuple[int, int, int], dtype: torch.dtype,
                 device: torch.device):
        self.glob = KVCache(num_layers=glob[0], kv_heads=glob[1], head_dim=glob[2], dtype=dtype, device=device)
        self.slid = KVCache(num_layers=slid[0], kv_heads=slid[1], head_dim=slid[2], dtype=dtype, device=device)
        self.dtype = dtype

    @property
    def capacity(self) -> int:
        return self.glob.capacity

    @property
    def batch(self) -> int:
        return self.glob.batch

    @property
    def k(self):
        return self.glob.k, self.slid.k

    @property
    def v(self):
        return self.glob.v, self.slid.v

    def reserve(self, batch: int, slots: int, used: int) -> bool:
        a = self.glob.reserve(batch, slots, used)
        b = self.slid.reserve(batch, max(slots, self.glob.capacity), used)
        return a or b

    def clear(self) -> None:
        self.glob.clear()
        self.slid.clear()

    def select(self, rows: torch.Tensor, total: int | None = None) -> None:
        self.glob.select(rows, total)
        self.slid.select(rows, total)

    def join(self, old_k, old_v, old_slots: int, new_slots: int) -> None:
        self.glob.join(old_k[0], old_v[0], old_slots, new_slots)
        self.slid.join(old_k[1], old_v[1], old_slots, new_slots)

    def gather_slots(self, order: torch.Tensor) -> None:
        self.glob.gather_slots(order)
        self.slid.gather_slots(order)

    def nbytes(self) -> int:
        return self.glob.nbytes() + self.slid.nbytes()
