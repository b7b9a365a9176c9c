"""The target's K/V cache: capacity buckets, in-place per-layer views (the graph's inputs, never a copy),
O(new slots) writes, growth keeping the used slots, row selection / joining / slot gathering against plain
tensor indexing."""

from __future__ import annotations

import pytest
import torch

from dspark_trt.errors import DSparkTrtError
from dspark_trt.runtime.kv_cache import KVCache, capacity_bucket, capacity_buckets


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


def _cache(**kw):
    return KVCache(num_layers=3, kv_heads=2, head_dim=4, dtype=torch.float32, **kw)


def _fill(cache, slots, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(3, cache.batch, 2, slots, 4, generator=g)
    v = torch.randn(3, cache.batch, 2, slots, 4, generator=g)
    cache.write(0, k, v)
    return k, v


def test_layer_views_are_the_buffers_themselves():
    cache = _cache()
    cache.reserve(batch=2, slots=100, used=0)
    assert (cache.batch, cache.capacity) == (2, 128)
    keys, values = cache.layers()
    for layer, (k, v) in enumerate(zip(keys, values)):
        assert k.shape == (2, 2, 128, 4) and k.is_contiguous() and v.is_contiguous()
        assert k.data_ptr() == cache.k[layer].data_ptr() and v.data_ptr() == cache.v[layer].data_ptr()
    keys[1][0, 1, 7] = 5.0  # writing through a view writes the cache: no copy in between
    assert bool((cache.k[1, 0, 1, 7] == 5.0).all())
    empty, _ = cache.layers(0)
    assert empty[0].shape == (2, 2, 0, 4)


def test_writes_touch_only_the_new_slots():
    cache = _cache()
    cache.reserve(batch=2, slots=20, used=0)
    k, v = _fill(cache, 10)
    before = cache.k.clone()
    new_k, new_v = torch.randn(3, 2, 2, 3, 4), torch.randn(3, 2, 2, 3, 4)
    cache.write(10, new_k, new_v)
    torch.testing.assert_close(cache.k[:, :, :, 10:13], new_k)
    torch.testing.assert_close(cache.v[:, :, :, 10:13], new_v)
    untouched = torch.ones(cache.capacity, dtype=torch.bool)
    untouched[10:13] = False
    assert torch.equal(cache.k[:, :, :, untouched], before[:, :, :, untouched])
    cache.write(0, new_k[:, :1], new_v[:, :1])  # fewer rows than the buffers (a padded batch): row 0 only
    torch.testing.assert_close(cache.k[:, 1, :, :3], before[:, 1, :, :3])
    with pytest.raises(DSparkTrtError, match="past the cache"):
        cache.write(cache.capacity - 2, new_k, new_v)


def test_growth_keeps_the_used_slots_and_happens_once_per_bucket():
    cache = _cache()
    cache.reserve(batch=1, slots=120, used=0)
    k, _ = _fill(cache, 120)
    allocations = cache.allocations
    for slots in range(121, 129):  # still within the 128 bucket: nothing allocated
        assert not cache.reserve(batch=1, slots=slots, used=120)
    assert cache.allocations == allocations
    assert cache.reserve(batch=1, slots=129, used=120) and cache.capacity == 160
    torch.testing.assert_close(cache.k[:, :, :, :120], k)
    assert cache.reserve(batch=3, slots=10, used=0) and cache.batch == 3  # another batch: fresh buffers


def test_select_join_and_gather_match_plain_indexing():
    cache = _cache()
    cache.reserve(batch=3, slots=40, used=0)
    k, v = _fill(cache, 40)
    rows = torch.tensor([2, 0])
    cache.select(rows)
    torch.testing.assert_close(cache.k[:, :, :, :40], k[:, rows])
    order = torch.tensor([[0, 2, 5, 39], [1, 1, 3, 4]])
    ref = torch.stack([cache.k[:, b, :, order[b]] for b in range(2)], dim=1)  # [L, B, H, 4, D]
    cache.gather_slots(order)
    torch.testing.assert_close(cache.k[:, :, :, :4], ref)
    old_k, old_v = cache.k, cache.v
    cache.reserve(batch=1, slots=200, used=0)
    newcomer, _ = _fill(cache, 200, seed=1)
    cache.join(old_k, old_v, old_slots=4, new_slots=200)
    assert (cache.batch, cache.capacity) == (3, 224)
    torch.testing.assert_close(cache.k[:, :2, :, :4], ref)
    torch.testing.assert_close(cache.k[:, 2:, :, :200], newcomer)
    assert cache.nbytes() == 2 * 3 * 3 * 2 * 224 * 4 * 4
