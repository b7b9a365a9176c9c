"""Capacity buckets of the target's K/V cache: four per octave, multiples of 32, within 25 % of the need; the
export's bound refused in one line."""

from __future__ import annotations

import pytest

from dspark_trt.errors import DSparkTrtError
from dspark_trt.artifact.kv_capacity import capacity_bucket, capacity_buckets


def test_capacity_buckets_are_four_per_octave_multiples_of_32():
    assert capacity_buckets(1000) == (128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 896, 1024)
    for slots in list(range(0, 600)) + [4095, 4096, 4097, 8191, 8192, 8193, 100_000]:
        cap = capacity_bucket(slots)
        assert cap >= slots and cap % 32 == 0
        assert slots <= 128 or cap <= 1.25 * slots  # the graph attends over at most 25 % spare slots
        assert capacity_bucket(cap) == cap  # a bucket is its own bucket
    assert capacity_buckets(8192)[-1] == 8192 and capacity_buckets(8000)[-1] == 8192
    assert capacity_bucket(5, smallest=4, steps_per_octave=2) == 6  # 4, 6, 8, 12, …


def test_past_the_export_bound_is_a_one_line_error():
    assert capacity_bucket(8192, limit=8192) == 8192
    with pytest.raises(DSparkTrtError, match="needs 8193 KV slots but the export's bound is 8192.*--max-context"):
        capacity_bucket(8193, limit=8192)
