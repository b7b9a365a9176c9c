"""The target's K/V cache: in-place per-layer views (the graph's inputs, never a copy),
O(new slots) writes, growth keeping the used slots, row selection / joining / slot gathering against plain
tensor indexing."""

from __future__ import annotations

import pytest
import torch

from dspark_trt.errors import DSparkTrtError
from dspark_trt.runtime.kv_cache import KVCache


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


def test_padded_batches_keep_their_rows_in_place():
    """TensorRT keeps a batch bucket of rows: dropping a request within the bucket moves rows in place (the
    captured graphs' addresses stay valid), a smaller bucket or growth reallocates keeping the used slots."""
    cache = _cache()
    cache.reserve(batch=4, slots=30, used=0)
    k, _ = _fill(cache, 30)
    ptr = cache.k.data_ptr()
    cache.select(torch.tensor([0, 2, 3]), total=4)
    assert cache.k.data_ptr() == ptr and cache.batch == 4
    torch.testing.assert_close(cache.k[:, :3, :, :30], k[:, [0, 2, 3]])
    cache.select(torch.tensor([2, 0]), total=2)
    assert cache.batch == 2 and cache.k.data_ptr() != ptr
    torch.testing.assert_close(cache.k[:, :, :, :30], k[:, [3, 0]])
    assert cache.reserve(batch=4, slots=30, used=30)  # a bigger bucket: rows 0, 1 kept, 2, 3 spare
    torch.testing.assert_close(cache.k[:, :2, :, :30], k[:, [3, 0]])
