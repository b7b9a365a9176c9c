"""Capacity buckets of the exported target's K/V cache: the ``P`` its graph reads (``export/target_graph.py``).

    capacity_bucket(700)          # 768: the smallest bucket ≥ 700 slots
    capacity_buckets(8192)        # 128, 160, 192, 224, 256, 320, …, 8192: every bucket up to a context bound

Buckets are ``smallest · 2^k · (1 + i / steps_per_octave)``: four per octave by default, so a graph reading a
whole bucket attends over at most 25 % more slots than are used, and a cache growing bucket by bucket copies
O(1) slots per generated token, amortised. The runtime's cache (``runtime/kv_cache.py``) allocates them and
the TensorRT engine's profile reaches the largest (``target_onnx.target_dynamic_ranges``).
"""

from __future__ import annotations

from ..errors import DSparkTrtError

__all__ = ["capacity_bucket", "capacity_buckets"]


def capacity_bucket(slots: int, *, smallest: int = 128, steps_per_octave: int = 4, limit: int | None = None) -> int:
    """The smallest capacity ≥ ``slots`` among ``smallest · 2^k · (1 + i / steps_per_octave)`` (i < steps);
    ``slots`` past ``limit`` (the export's ``max_context``) is an error naming the fix. With the defaults every
    bucket is a multiple of 32 slots (so each layer's block stays 256-byte aligned for TensorRT)."""
    if slots < 0 or smallest < 1 or steps_per_octave < 1:
        raise DSparkTrtError(f"capacity bucket of {slots} slots (smallest {smallest}, {steps_per_octave} per octave) "
                             f"is undefined")
    if limit is not None and slots > limit:
        raise DSparkTrtError(f"the batch needs {slots} KV slots but the export's bound is {limit}; export again "
                             f"with a larger --max-context")
    base = smallest
    while True:
        for i in range(steps_per_octave):
            cap = base + base * i // steps_per_octave
            if cap >= slots:
                return cap
        base *= 2


def capacity_buckets(limit: int, *, smallest: int = 128, steps_per_octave: int = 4) -> tuple[int, ...]:
    """Every capacity ``capacity_bucket`` returns for 0 … ``limit`` slots (TensorRT: the CUDA-graph keys; the
    last one is the engine profile's largest past)."""
    out, slots = [], 0
    while slots <= limit:
        cap = capacity_bucket(slots, smallest=smallest, steps_per_octave=steps_per_octave)
        out.append(cap)
        slots = cap + 1
    return tuple(out)
