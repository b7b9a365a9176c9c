"""The caches of an exported Gemma-4 text target (``export/gemma4_target_graph.py``), which
``onnxruntime.Gemma4OnnxRuntimeTarget`` runs.

    TypeCaches   the global layers' ``KVCache`` (every slot, the slot layout of every exported target: holes,
                 rollback by length, compaction) and the sliding layers' ``RingCache``
    RingCache    per request, the last ``window − 1 + headroom`` tokens of the sliding layers, at slot
                 ``position mod ring``, with each slot's position (−1: empty): the graph's ``window_positions``

A sliding layer's query at position q sees keys at q − window < k < q, so a ring of window − 1 slots holds all it
needs; ``headroom`` more keep the window intact when a round's rejected tokens roll back (they overwrote the
oldest slots; the accepted length then moves back by at most the verify length). Slots at positions at or past
the first new token (rejected tokens of earlier rounds) are hidden as empty, so rollback needs no bookkeeping.
Compaction moves global slots only: positions ignore holes, so the ring is unchanged.
"""

from __future__ import annotations

import torch

from ..kv_cache import KVCache

__all__ = ["TypeCaches", "RingCache", "RING_HEADROOM"]

#: ring slots past window − 1: the most tokens one verify may roll back (verify lengths above are refused)
RING_HEADROOM = 64


class RingCache:
    """Keys and values ``[L, B, H, ring, D]`` and positions ``[B, ring]`` (module docstring)."""

    def __init__(self, *, num_layers: int, kv_heads: int, head_dim: int, ring: int, dtype: torch.dtype,
                 device: torch.device):
        self.num_layers, self.kv_heads, self.head_dim, self.ring = num_layers, kv_heads, head_dim, int(ring)
        self.dtype, self.device = dtype, device
        self.k = self.v = self.pos = None

    @property
    def batch(self) -> int:
        return 0 if self.k is None else self.k.shape[1]

    def _empty(self, batch: int):
        shape = (self.num_layers, batch, self.kv_heads, self.ring, self.head_dim)
        return (torch.zeros(shape, dtype=self.dtype, device=self.device),
                torch.zeros(shape, dtype=self.dtype, device=self.device),
                torch.full((batch, self.ring), -1, dtype=torch.int64, device=self.device))

    def ensure(self, batch: int) -> None:
        if self.k is None:
            self.k, self.v, self.pos = self._empty(batch)
        elif batch > self.batch:  # rows past the running ones: empty
            k, v, pos = self._empty(batch - self.batch)
            self.k, self.v = torch.cat([self.k, k], 1), torch.cat([self.v, v], 1)
            self.pos = torch.cat([self.pos, pos])

    def clear(self) -> None:
        self.k = self.v = self.pos = None

    def layers(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        return list(self.k.unbind(0)), list(self.v.unbind(0))

    def positions(self, first_new: torch.Tensor) -> torch.Tensor:
        """``window_positions`` [B, ring]: slots before each request's first new position ``first_new`` [B]."""
        return torch.where(self.pos < first_new.view(-1, 1), self.pos, torch.full_like(self.pos, -1))

    def write(self, new_key: torch.Tensor, new_value: torch.Tensor, positions: torch.Tensor,
              valid: torch.Tensor) -> None:
        """New K/V ``[L, B, H, Q, D]`` of tokens at ``positions`` [B, Q] (``valid``: real tokens, not padding) into
        slots ``position mod ring``, in runs of at most ``ring`` tokens: each request keeps its last ``ring`` real
        tokens, wherever its padding starts."""
        Q = positions.shape[1]
        for a in range(0, Q, self.ring):
            b = min(a + self.ring, Q)
            self._write(new_key[:, :, :, a:b], new_value[:, :, :, a:b], positions[:, a:b], valid[:, a:b])

    def _write(self, new_key, new_value, positions, valid) -> None:
        B = positions.shape[0]
        L, _, H, n, D = new_key.shape
        slot = positions % self.ring  # [B, n]: distinct within a row (n ≤ ring consecutive positions)
        idx = slot.view(1, B, 1, n, 1).expand(L, B, H, n, D)
        keep = valid.view(1, B, 1, n, 1)
        for buf, new in ((self.k, new_key), (self.v, new_value)):
            rows = buf[:, :B]
            rows.scatter_(3, idx, torch.where(keep, new.to(buf.dtype), rows.gather(3, idx)))
        pos = self.pos[:B]
        pos.scatter_(1, slot, torch.where(valid, positions, pos.gather(1, slot)))

    def select(self, rows: torch.Tensor, total: int | None = None) -> None:
        rows = rows.to(self.k.device)
        self.k, self.v, self.pos = self.k[:, rows], self.v[:, rows], self.pos[rows]
        if total is not None and total > len(rows):
            self.ensure(total)

    def join(self, old: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
        """``old``'s rows (keys, values, positions) then the current rows."""
        self.k, self.v = torch.cat([old[0], self.k], 1), torch.cat([old[1], self.v], 1)
        self.pos = torch.cat([old[2], self.pos])

    def nbytes(self) -> int:
        return 0 if self.k is None else 2 * self.k.numel() * self.k.element_size() + self.pos.numel() * 8


class TypeCaches:
    """The global layers' ``KVCache`` and the sliding layers' ``RingCache`` of one batch."""

    def __init__(self, *, glob: tuple[int, int, int], slid: tuple[int, int, int], ring: int, dtype: torch.dtype,
                 device: torch.device):
        self.glob = KVCache(num_layers=glob[0], kv_heads=glob[1], head_dim=glob[2], dtype=dtype, device=device)
        self.slid = RingCache(num_layers=slid[0], kv_heads=slid[1], head_dim=slid[2], ring=ring, dtype=dtype,
                              device=device)
        self.dtype = dtype

    @property
    def capacity(self) -> int:
        return self.glob.capacity

    @property
    def batch(self) -> int:
        return self.glob.batch

    def reserve(self, batch: int, slots: int, used: int) -> bool:
        self.slid.ensure(batch)
        return self.glob.reserve(batch, slots, used)

    def clear(self) -> None:
        self.glob.clear()
        self.slid.clear()

    def select(self, rows: torch.Tensor, total: int | None = None) -> None:
        self.glob.select(rows, total)
        self.slid.select(rows, total)

    def snapshot(self) -> tuple:
        """What ``extend`` keeps aside while new requests are prefilled."""
        return self.glob.k, self.glob.v, (self.slid.k, self.slid.v, self.slid.pos)

    def join(self, old: tuple, old_slots: int, new_slots: int) -> None:
        self.glob.join(old[0], old[1], old_slots, new_slots)
        self.slid.join(old[2])

    def gather_slots(self, order: torch.Tensor) -> None:
        self.glob.gather_slots(order)  # positions ignore holes: the ring is unchanged

    def nbytes(self) -> int:
        return self.glob.nbytes() + self.slid.nbytes()
