"""DrafterState: per-request context K/V rows, ctx_len bookkeeping (rollback by not advancing), growth, select."""

from __future__ import annotations

import torch

from dspark_trt.runtime import DrafterState


def kv(L, B, Q, H, D, start):
    x = torch.arange(start, start + L * B * Q * H * D, dtype=torch.float32).view(L, B, Q, H, D)
    return x, -x


def test_append_writes_at_each_requests_length_and_advances_by_count():
    s = DrafterState(2, 3, 4, 1, 2, dtype=torch.float32, device=torch.device("cpu"))
    k, v = kv(2, 3, 3, 1, 2, 1)
    s.append(k, v, torch.tensor([3, 1, 2]))  # a right-padded prefill
    assert s.ctx_len.tolist() == [3, 1, 2]
    k2, v2 = kv(2, 3, 2, 1, 2, 1000)
    s.append(k2, v2, torch.tensor([2, 0, 1]))  # a round: row 1 keeps nothing (all rejected)
    assert s.ctx_len.tolist() == [5, 1, 3]
    assert s.capacity == 128  # the smallest bucket
    ck, cv = s.context()
    assert ck.shape == (2, 3, 128, 1, 2)  # the whole capacity: rows past ctx_len are masked by the round
    torch.testing.assert_close(ck[:, 0, :3], k[:, 0])
    torch.testing.assert_close(ck[:, 0, 3:5], k2[:, 0])
    torch.testing.assert_close(ck[:, 1, :1], k[:, 1, :1])  # row 1: the rejected rows are beyond ctx_len
    torch.testing.assert_close(ck[:, 2, 2:3], k2[:, 2, :1])
    torch.testing.assert_close(cv[:, 2, :2], v[:, 2, :2])
    # the next round overwrites row 1's rejected rows
    k3, v3 = kv(2, 3, 1, 1, 2, 5000)
    s.append(k3, v3, torch.tensor([1, 1, 1]))
    torch.testing.assert_close(s.context()[0][:, 1, 1:2], k3[:, 1])


def test_select_keeps_rows():
    s = DrafterState(1, 3, 8, 1, 1, dtype=torch.float32, device=torch.device("cpu"))
    k, v = kv(1, 3, 2, 1, 1, 1)
    s.append(k, v, torch.tensor([2, 1, 2]))
    s.anchor = torch.tensor([7, 8, 9])
    s.select(torch.tensor([2, 0]))
    assert s.ctx_len.tolist() == [2, 2] and s.anchor.tolist() == [9, 7]
    torch.testing.assert_close(s.context()[0][:, 0, :2], k[:, 2])


def test_context_is_the_cache_itself_and_grows_by_buckets():
    """context() hands out views of the heads-first buffers (same memory every round, each layer a contiguous
    [B, H_kv, capacity, D] block); appends write in place until a bucket is full, then the cache moves once
    into the next bucket with every row kept. Odd shapes: 3 layers, 2 requests, 3 heads, D = 5."""
    L, B, H, D = 3, 2, 3, 5
    s = DrafterState(L, B, 100, H, D, dtype=torch.float32, device=torch.device("cpu"))
    assert s.capacity == 128 and s.allocations == 2
    gen = torch.Generator().manual_seed(0)
    full_k = torch.randn(L, B, 400, H, D, generator=gen)  # what each request's rows must end up holding
    full_v = torch.randn(L, B, 400, H, D, generator=gen)
    lens = torch.tensor([90, 61])
    s.append(full_k[:, :, :90], full_v[:, :, :90], lens)
    ptr, allocations, capacities = s.k.data_ptr(), s.allocations, {s.capacity}
    for step in range(40):
        Q = 8
        pos = s.ctx_len.view(B, 1) + torch.arange(Q)  # [B, Q]
        idx = pos.view(1, B, Q, 1, 1).expand(L, B, Q, H, D)
        new_k, new_v = full_k.gather(2, idx), full_v.gather(2, idx)
        accept = torch.tensor([step % 8 + 1, (3 * step) % 8 + 1])
        before = s.capacity
        s.append(new_k, new_v, accept)
        ck, cv = s.context()
        if s.capacity == before:
            assert s.k.data_ptr() == ptr and s.allocations == allocations  # written in place, nothing allocated
        else:
            assert s.allocations == allocations + 2  # one move per bucket
            ptr, allocations = s.k.data_ptr(), s.allocations
            capacities.add(s.capacity)
        assert ck.data_ptr() == s.k.data_ptr() and ck.shape == (L, B, s.capacity, H, D)
        for layer in range(L):
            block = ck[layer].transpose(1, 2)
            assert block.is_contiguous() and block.data_ptr() == s.k[layer].data_ptr()
        for b in range(B):
            n = int(s.ctx_len[b])
            torch.testing.assert_close(ck[:, b, :n], full_k[:, b, :n])
            torch.testing.assert_close(cv[:, b, :n], full_v[:, b, :n])
    assert sorted(capacities) == [128, 160, 192, 224, 256, 320]  # every bucket in turn, none skipped


def test_capacity_stops_at_the_limit():
    s = DrafterState(1, 1, 300, 1, 1, dtype=torch.float32, device=torch.device("cpu"), limit=300)
    assert s.capacity == 300  # bucket 320 > the export's bound: the bound itself
    s = DrafterState(1, 1, 300, 1, 1, dtype=torch.float32, device=torch.device("cpu"), limit=4096)
    assert s.capacity == 320
