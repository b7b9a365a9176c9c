"""The caches of an exported Gemma-4 text target (``export/gemma4_target_graph.py``), which
``onnxruntime.Gemma4OnnxRuntimeTarget`` runs.

    TypeCaches   the global layers' ``KVCache`` (every slot, the slot layout of every exported target: holes,
                 rollback by length, compaction) and the sliding layers' ``RingCache``
    RingCache    per request, the last ``window − 1 + headroom`` tokens of the sliding layers, at slot
                 ``position mod ring``, with each slot's position (−1: empty): the graph's ``window_positions``
    cache_names / graph_feeds / write_new / FILLS / ring_size
                 the graph's cache I/O, shared by the onnxruntime and TensorRT targets (pure, CPU-tested)

A sliding layer's query at position q sees keys at q − window < k < q, so a ring of window − 1 slots holds all it
needs; ``headroom`` more keep the window intact when a round's rejected tokens roll back (they overwrote the
oldest slots; the accepted length then moves back by at most the verify length). Slots at positions at or past
the first new token (rejected tokens of earlier rounds) are hidden as empty, so rollback needs no bookkeeping.
Compaction moves global slots only: positions ignore holes, so the ring is unchanged.
"""

from __future__ import annotations

from typing import Mapping

import torch

from ...errors import DSparkTrtError
from ..kv_cache import KVCache

__all__ = ["TypeCaches", "RingCache", "RING_HEADROOM", "FILLS", "ring_size", "cache_names", "new_caches",
           "graph_feeds", "write_new", "check_verify_length", "Gemma4Storage"]

#: ring slots past window − 1: the most tokens one verify may roll back (verify lengths above are refused)
RING_HEADROOM = 64
#: padding of the graph's inputs in a padded batch (TensorRT buckets): (padded requests, padded past slots). A
#: padded request attends to its global slots (stale, finite) and its own new tokens; its ring is empty (−1)
FILLS = {"attention_mask": (1, 0), "window_positions": (-1, -1)}


def ring_size(gemma4: Mapping) -> int:
    """Slots of the sliding layers' ring per request: the manifest's ``ring`` (what the export's engine profile
    is optimized for: ``W`` = the ring), else window − 1 + ``RING_HEADROOM``."""
    return int(gemma4.get("ring") or int(gemma4["sliding_window"]) - 1 + RING_HEADROOM)


def cache_names(gemma4: Mapping) -> tuple[list[str], list[str], list[str], list[str]]:
    """The graph's cache inputs: (global keys, global values, sliding keys, sliding values), in layer order —
    the order of the ``new_*_global`` / ``new_*_sliding`` outputs' first axis and of ``TypeCaches``' layers."""
    glob, slid = list(gemma4["global_layers"]), list(gemma4["sliding_layers"])
    return ([f"past_key_{i}" for i in glob], [f"past_value_{i}" for i in glob],
            [f"past_key_{i}" for i in slid], [f"past_value_{i}" for i in slid])


def new_caches(gemma4: Mapping, dtype: torch.dtype, device: torch.device) -> "TypeCaches":
    """The empty caches of a Gemma-4 target section (``gemma4`` of the manifest's target)."""
    return TypeCaches(glob=(len(gemma4["global_layers"]), *gemma4["global_kv"]),
                      slid=(len(gemma4["sliding_layers"]), *gemma4["sliding_kv"]), ring=ring_size(gemma4),
                      dtype=dtype, device=device)


def graph_feeds(caches: "TypeCaches", names: tuple[list[str], ...], first_new: torch.Tensor,
                rows: int | None = None) -> dict:
    """The cache inputs of one graph call for requests whose new tokens start at ``first_new`` [B]:
    ``window_positions`` [B, ring] and each layer's ``[rows, H, capacity | ring, D]`` view of the caches' buffers
    (contiguous, read in place; ``rows`` None: all the buffers' rows — a padded bucket binds them all)."""
    gk, gv = caches.glob.layers()
    sk, sv = caches.slid.layers()
    feeds = {"window_positions": caches.slid.positions(first_new)}
    for keys, tensors in zip(names, (gk, gv, sk, sv)):
        feeds.update({name: t if rows is None else t[:rows] for name, t in zip(keys, tensors)})
    return feeds


def write_new(caches: "TypeCaches", out: Mapping[str, torch.Tensor], used: int, positions: torch.Tensor,
              valid: torch.Tensor) -> None:
    """A call's new K/V into the caches: the global layers' into slots ``used … used + Q − 1``, the sliding
    layers' into their ring at ``positions`` [B, Q] (``valid`` [B, Q]: real tokens, not padding)."""
    caches.glob.write(used, out["new_key_global"], out["new_value_global"])
    caches.slid.write(out["new_key_sliding"], out["new_value_sliding"], positions, valid)


def check_verify_length(Q: int) -> None:
    if Q > RING_HEADROOM:
        raise DSparkTrtError(f"a Gemma-4 target verifies at most {RING_HEADROOM} tokens per round (its sliding "
                             f"layers' ring rolls back that many); got {Q}")


class Gemma4Storage:
    """The ``SlotTarget`` storage hooks of a target whose ``cache`` is a ``TypeCaches`` (requests joining a
    running batch keep their rows, global slots and rings)."""

    cache: "TypeCaches"
    _lengths: torch.Tensor | None

    _gemma4: dict

    def _storage(self):
        return self.cache.snapshot(self._lengths.numel())

    def _join_rows(self, old, old_slots: int, slots: int) -> None:
        self.cache.join(old, old_slots, self.valid.shape[1])

    def fork(self):
        """Another target on the same graph or engine with caches and slots of its own."""
        import copy

        other = copy.copy(self)
        other.cache = new_caches(self._gemma4, self.cache.dtype, self.device)
        other.valid = other._lengths = None
        other._pending = 0
        return other


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
        """Exactly ``batch`` rows, as the global cache's: the first rows kept, rows past them empty."""
        if self.k is None:
            self.k, self.v, self.pos = self._empty(batch)
        elif batch > self.batch:  # rows past the running ones: empty
            k, v, pos = self._empty(batch - self.batch)
            self.k, self.v = torch.cat([self.k, k], 1), torch.cat([self.v, v], 1)
            self.pos = torch.cat([self.pos, pos])
        elif batch < self.batch:  # a smaller bucket (TensorRT): padding rows dropped
            self.k, self.v = self.k[:, :batch].contiguous(), self.v[:, :batch].contiguous()
            self.pos = self.pos[:batch].contiguous()

    def clear(self) -> None:
        self.k = self.v = self.pos = None

    def layers(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        return list(self.k.unbind(0)), list(self.v.unbind(0))

    def positions(self, first_new: torch.Tensor) -> torch.Tensor:
        """``window_positions`` [B, ring] of the first B rows: slots before each request's first new position
        ``first_new`` [B] (later ones, rejected tokens of earlier rounds, read as empty: −1)."""
        pos = self.pos[: first_new.numel()]
        return torch.where(pos < first_new.view(-1, 1), pos, torch.full_like(pos, -1))

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

    def snapshot(self, rows: int | None = None) -> tuple:
        """What ``extend`` keeps aside while new requests are prefilled: the first ``rows`` rows (the running
        requests; a TensorRT target keeps a bucket of rows, the rest padding), default all."""
        r = slice(None) if rows is None else slice(0, rows)
        return self.glob.k[:, r], self.glob.v[:, r], (self.slid.k[:, r], self.slid.v[:, r], self.slid.pos[r])

    def join(self, old: tuple, old_slots: int, new_slots: int) -> None:
        self.glob.join(old[0], old[1], old_slots, new_slots)
        self.slid.join(old[2])

    def gather_slots(self, order: torch.Tensor) -> None:
        self.glob.gather_slots(order)  # positions ignore holes: the ring is unchanged

    def nbytes(self) -> int:
        return self.glob.nbytes() + self.slid.nbytes()
