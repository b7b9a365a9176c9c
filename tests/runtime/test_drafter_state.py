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


def _window_rows(state: DrafterState, b: int, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The K/V rows request b's next round reads (positions max(0, p - W) … p - 1), found through ``start``."""
    p, start = int(state.ctx_len[b]), int(state.start[b])
    first = max(0, p - window)
    ck, cv = state.context()
    return ck[:, b, first - start:p - start], cv[:, b, first - start:p - start]


def test_a_sliding_cache_holds_every_row_its_window_reads_in_bounded_memory():
    """With a window W every request keeps at least its last W rows at ``start``-relative rows, whatever the
    context: a long prefill (longer than the cache), rounds writing rejected rows past what they keep, requests
    at different lengths; the buffer never exceeds ``most`` = bucket(W + W/2 + headroom) rows and, once there,
    stays the same storage (what a bound engine input needs). Odd shapes: 2 layers, 3 heads, D = 5, W = 37.
    ``most`` = bucket(W + W/2)."""
    L, B, H, D, W, N = 2, 2, 3, 5, 37, 7
    gen = torch.Generator().manual_seed(1)
    full_k = torch.randn(L, B, 900, H, D, generator=gen)
    full_v = torch.randn(L, B, 900, H, D, generator=gen)
    s = DrafterState(L, B, 300, H, D, dtype=torch.float32, device=torch.device("cpu"), window=W)
    assert s.most == 128 and s.capacity == 128  # bucket(37 + 18): the prompt's 300 rows do not need more
    lens = torch.tensor([300, 45])
    s.append(full_k[:, :, :300], full_v[:, :, :300], lens)  # request 1 right-padded: its rows 45 … are garbage
    assert s.start.tolist() == [300 - W, 0]
    ptr = s.k.data_ptr()
    for step in range(60):
        pos = s.ctx_len.view(B, 1) + torch.arange(N + 1)  # [B, N + 1] the round's rows, some rejected
        idx = pos.view(1, B, N + 1, 1, 1).expand(L, B, N + 1, H, D)
        accept = torch.tensor([step % (N + 1) + 1, (5 * step) % (N + 1) + 1])
        s.append(full_k.gather(2, idx), full_v.gather(2, idx), accept)
        assert s.capacity <= s.most
        for b in range(B):
            p = int(s.ctx_len[b])
            k, v = _window_rows(s, b, W)
            torch.testing.assert_close(k, full_k[:, b, max(0, p - W):p])
            torch.testing.assert_close(v, full_v[:, b, max(0, p - W):p])
            assert int(s.start[b]) <= max(0, p - W)
    assert s.k.data_ptr() == ptr and s.allocations == 2  # slid in place, never grown: one storage all along
    assert int(s.start.min()) > 0  # both requests slid


def test_sliding_survives_select_and_join():
    L, H, D, W = 1, 1, 2, 16
    gen = torch.Generator().manual_seed(2)
    full = torch.randn(L, 3, 400, H, D, generator=gen)
    a = DrafterState(L, 2, 10, H, D, dtype=torch.float32, device=torch.device("cpu"), window=W)
    a.append(full[:, :2, :200], -full[:, :2, :200], torch.tensor([200, 150]))
    b = DrafterState(L, 1, 10, H, D, dtype=torch.float32, device=torch.device("cpu"), window=W)
    b.append(full[:, 2:, :5], -full[:, 2:, :5], torch.tensor([5]))
    a.join(b)  # a slid request, a short one and a fresh one
    a.select(torch.tensor([2, 1]))
    assert a.ctx_len.tolist() == [5, 150]
    for row, (src, p) in enumerate(((2, 5), (1, 150))):
        k, v = _window_rows(a, row, W)
        torch.testing.assert_close(k, full[:, src, max(0, p - W):p])
        torch.testing.assert_close(v, -full[:, src, max(0, p - W):p])


def test_rows_past_the_new_length_need_no_room():
    """A write of many more rows than it keeps (a right-padded prompt, a round's rejected drafts) fits a sliding
    cache smaller than the write: only the kept rows must be held."""
    W = 100
    gen = torch.Generator().manual_seed(3)
    full = torch.randn(1, 1, 600, 1, 2, generator=gen)
    s = DrafterState(1, 1, 10, 1, 2, dtype=torch.float32, device=torch.device("cpu"), window=W)
    assert s.most == 160
    s.append(full[:, :, :150], -full[:, :, :150], torch.tensor([150]))
    s.append(full[:, :, 150:500], -full[:, :, 150:500], torch.tensor([10]))  # 350 rows written, 10 kept
    s.append(full[:, :, 160:161], -full[:, :, 160:161], torch.tensor([1]))
    assert s.capacity == 160 and int(s.ctx_len) == 161
    k, v = _window_rows(s, 0, W)
    torch.testing.assert_close(k, full[:, 0, 61:161])
    torch.testing.assert_close(v, -full[:, 0, 61:161])


def test_begin_at_starts_a_sliding_cache_past_a_long_prompts_first_rows():
    import pytest

    from dspark_trt.errors import DSparkTrtInternalError

    gen = torch.Generator().manual_seed(4)
    full = torch.randn(1, 2, 500, 1, 2, generator=gen)
    s = DrafterState(1, 2, 500, 1, 2, dtype=torch.float32, device=torch.device("cpu"), window=16)
    s.begin_at(300 - 16)  # prompts of 300 and 420 tokens: rows before 284 are read by no round
    s.append(full[:, :, 284:420], -full[:, :, 284:420], torch.tensor([300 - 284, 420 - 284]))
    assert s.ctx_len.tolist() == [300, 420]
    for b, p in enumerate((300, 420)):
        k, v = _window_rows(s, b, 16)
        torch.testing.assert_close(k, full[:, b, p - 16:p])
    with pytest.raises(DSparkTrtInternalError):  # only an empty cache can start later
        s.begin_at(5)
    with pytest.raises(DSparkTrtInternalError):  # and only a sliding one (the whole cache holds every row)
        DrafterState(1, 1, 8, 1, 1, dtype=torch.float32, device=torch.device("cpu")).begin_at(3)


def _request_rows(state, b, n):
    """Request ``b``'s first ``n`` context rows, ``[L, n, H_kv, D]``."""
    return state.context()[0][:, b, :n]


def test_spare_rows_stay_through_growth_select_and_join():
    """A padded backend's cache (``rows`` = its batch bucket, ``DrafterBackend.state_rows``): the requests first,
    spare rows after, every row handed out by ``context()``. Growth keeps the rows; ``select`` within the bucket
    moves the kept requests forward in the same buffers (bound addresses stay), out of it into new buffers;
    ``join`` packs both batches' requests before the spare rows. Odd shapes: 2 layers, 3 heads, D = 5."""
    L, H, D = 2, 3, 5
    gen = torch.Generator().manual_seed(4)
    full = torch.randn(L, 4, 320, H, D, generator=gen)  # what each request's rows must hold
    s = DrafterState(L, 3, 10, H, D, dtype=torch.float32, device=torch.device("cpu"), rows=4)
    assert (s.batch, s.rows, s.context()[0].shape[1]) == (3, 4, 4)
    s.append(full[:, :3, :9], -full[:, :3, :9], torch.tensor([7, 3, 5]))
    for _ in range(25):  # past the first bucket (128): the cache grows, its rows stay 4
        p = s.ctx_len.tolist()
        k = torch.stack([full[:, b, p[b]: p[b] + 8] for b in range(3)], 1)  # [L, 3, 8, H, D]
        s.append(k, -k, torch.tensor([8, 5, 2]))
    lens = s.ctx_len.tolist()
    assert s.capacity > 128 and s.rows == 4 and lens == [207, 128, 55]
    for b in range(3):
        torch.testing.assert_close(_request_rows(s, b, lens[b]), full[:, b, :lens[b]])
    ptr = s.k.data_ptr()
    s.select(torch.tensor([2, 0]), total=4)  # 2 requests still round up to 4 rows … in place
    assert s.k.data_ptr() == ptr and (s.batch, s.rows) == (2, 4) and s.ctx_len.tolist() == [55, 207]
    torch.testing.assert_close(_request_rows(s, 0, 55), full[:, 2, :55])
    torch.testing.assert_close(_request_rows(s, 1, 207), full[:, 0, :207])
    s.select(torch.tensor([1]), total=1)  # … 1 request: a bucket of 1 row, new buffers
    assert s.k.data_ptr() != ptr and (s.batch, s.rows) == (1, 1)
    torch.testing.assert_close(_request_rows(s, 0, 207), full[:, 0, :207])
    t = DrafterState(L, 1, 10, H, D, dtype=torch.float32, device=torch.device("cpu"), rows=4)  # a spare-row one
    t.append(full[:, 3:, :6], -full[:, 3:, :6], torch.tensor([6]))
    t.join(s, total=2)  # its request, then s's: the spare rows of t are not in between
    assert (t.batch, t.rows) == (2, 2) and t.ctx_len.tolist() == [6, 207]
    torch.testing.assert_close(_request_rows(t, 0, 6), full[:, 3, :6])
    torch.testing.assert_close(_request_rows(t, 1, 207), full[:, 0, :207])
    torch.testing.assert_close(t.context()[1][:, 1, :207], -full[:, 0, :207])
