"""The exported target's K/V cache: persistent buffers that the target graph reads in place.

    cache = KVCache(num_layers=30, kv_heads=3, head_dim=64, dtype=torch.float32, device="cpu")
    cache.reserve(batch=1, slots=700, used=0)       # capacity 768: a bucket ≥ 700
    keys, values = cache.layers()                    # L views [B, H, capacity, D], each contiguous: the graph inputs
    cache.write(512, new_key, new_value)             # the step's new slots [L, B, H, Q, D] at 512 … 512+Q-1

Layout ``[L, B, H, capacity, D]``: one layer's ``[B, H, capacity, D]`` is a contiguous block, so it is handed
to onnxruntime (or bound to a TensorRT input) as it lies; the graph attends over all ``capacity`` slots and
the slot mask hides the unused ones (``export/capacity_attention.py``). A step therefore costs O(new
slots) of bookkeeping — writing them — whatever the context; reading a used *prefix* instead would need a
copy, as ``[:, :, :, :S]`` is not contiguous.

Capacities are buckets (``artifact/kv_capacity.py``): 128, 160, 192, 224, 256, 320, … — four per octave, so the
graph attends over at most 25 % more slots than it needs (plus a round's headroom), and growing (a copy of the used slots into
bigger buffers) happens once per bucket, O(1) slots per generated token amortised. TensorRT captures one
CUDA graph per (batch bucket, capacity bucket, Q) with these very buffers bound (``runtime/targets/tensorrt.py``).
"""

from __future__ import annotations

import torch

from ..errors import DSparkTrtError
from ..artifact.kv_capacity import capacity_bucket, capacity_buckets

__all__ = ["capacity_bucket", "capacity_buckets", "KVCache"]


class KVCache:
    """Keys and values ``[L, B, H, capacity, D]`` (module docstring); slots past ``used`` hold stale values the
    slot mask hides. Rows follow the batch (``select`` / ``join`` / ``gather_slots``)."""

    def __init__(self, *, num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu", smallest: int = 128, steps_per_octave: int = 4,
                 limit: int | None = None):
        self.num_layers, self.kv_heads, self.head_dim = int(num_layers), int(kv_heads), int(head_dim)
        self.dtype, self.device = dtype, torch.device(device)
        self.smallest, self.steps_per_octave, self.limit = smallest, steps_per_octave, limit
        self.k: torch.Tensor | None = None  # [L, B, H, capacity, D]
        self.v: torch.Tensor | None = None
        self.allocations = 0  # buffers allocated so far (tests, benchmarks)

    @property
    def batch(self) -> int:
        return 0 if self.k is None else self.k.shape[1]

    @property
    def capacity(self) -> int:
        return 0 if self.k is None else self.k.shape[3]

    def bucket(self, slots: int) -> int:
        return capacity_bucket(slots, smallest=self.smallest, steps_per_octave=self.steps_per_octave,
                               limit=self.limit)

    def _empty(self, batch: int, capacity: int) -> torch.Tensor:
        self.allocations += 1
        shape = (self.num_layers, batch, self.kv_heads, capacity, self.head_dim)
        return torch.zeros(shape, dtype=self.dtype, device=self.device)

    def reserve(self, batch: int, slots: int, used: int) -> bool:
        """Room for ``slots`` slots of ``batch`` rows, keeping the first ``used`` slots of the rows both sizes
        share; True when the buffers were (re)allocated (their addresses changed)."""
        if self.k is not None and self.batch == batch and self.capacity >= slots:
            return False
        capacity = self.bucket(max(slots, self.capacity if self.batch == batch else 0))
        k, v = self._empty(batch, capacity), self._empty(batch, capacity)
        rows = min(batch, self.batch)
        if rows and used:
            k[:, :rows, :, :used] = self.k[:, :rows, :, :used]
            v[:, :rows, :, :used] = self.v[:, :rows, :, :used]
        self.k, self.v = k, v
        return True

    def clear(self) -> None:
        self.k = self.v = None

    def layers(self, slots: int | None = None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-layer views ``[B, H, capacity, D]`` (contiguous, no copy); ``slots=0`` gives empty views (a prefill
        with nothing in the cache attends to its own tokens only)."""
        k, v = (self.k, self.v) if slots is None else (self.k[:, :, :, :slots], self.v[:, :, :, :slots])
        return list(k.unbind(0)), list(v.unbind(0))

    def write(self, at: int, new_key: torch.Tensor, new_value: torch.Tensor) -> None:
        """The step's new K/V ``[L, B, H, Q, D]`` into rows ``0 … B-1``, slots ``at … at+Q-1`` (O(Q), no more)."""
        B, Q = new_key.shape[1], new_key.shape[3]
        if at + Q > self.capacity or B > self.batch:
            raise DSparkTrtError(f"writing {B} rows at slots {at}…{at + Q - 1} past the cache ({self.batch} rows, "
                                 f"capacity {self.capacity}); reserve first")
        self.k[:, :B, :, at: at + Q] = new_key  # a padded batch's spare rows (TensorRT buckets) are left alone
        self.v[:, :B, :, at: at + Q] = new_value

    def select(self, rows: torch.Tensor, total: int | None = None) -> None:
        """Keep the requests at ``rows``, in buffers of ``total`` rows (default ``len(rows)``; more: spare rows
        for a padded batch). With ``total`` = the current row count the rows move in place (same addresses)."""
        rows = rows.to(self.k.device)
        total = len(rows) if total is None else total
        if total == self.batch:
            self.k[:, : len(rows)] = self.k[:, rows]  # advanced indexing reads a copy first: no overlap hazard
            self.v[:, : len(rows)] = self.v[:, rows]
            return
        k, v = self._empty(total, self.capacity), self._empty(total, self.capacity)
        k[:, : len(rows)], v[:, : len(rows)] = self.k[:, rows], self.v[:, rows]
        self.k, self.v = k, v

    def join(self, old_k: torch.Tensor, old_v: torch.Tensor, old_slots: int, new_slots: int) -> None:
        """Rows of ``old`` (``old_slots`` used) then the current rows (``new_slots`` used), in buffers of a
        capacity bucket ≥ every used slot."""
        capacity = self.bucket(max(old_slots, new_slots, 1))
        Bo, Bn = old_k.shape[1], self.batch
        k, v = self._empty(Bo + Bn, capacity), self._empty(Bo + Bn, capacity)
        k[:, :Bo, :, :old_slots], v[:, :Bo, :, :old_slots] = old_k[:, :, :, :old_slots], old_v[:, :, :, :old_slots]
        k[:, Bo:, :, :new_slots] = self.k[:, :, :, :new_slots]
        v[:, Bo:, :, :new_slots] = self.v[:, :, :, :new_slots]
        self.k, self.v = k, v

    def gather_slots(self, order: torch.Tensor) -> None:
        """Slot ``j`` of request ``b`` becomes its old slot ``order[b, j]`` (compaction), in place."""
        B, n = order.shape
        L, _, H, _, D = self.k.shape
        idx = order.to(self.k.device).view(1, B, 1, n, 1).expand(L, B, H, n, D)
        self.k[:, :, :, :n] = self.k.gather(3, idx)
        self.v[:, :, :, :n] = self.v.gather(3, idx)

    def nbytes(self) -> int:
        """Bytes held by the buffers."""
        return 0 if self.k is None else 2 * self.k.numel() * self.k.element_size()
