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
    assert s.capacity >= 5  # grew from 4
    ck, cv = s.context()
    assert ck.shape == (2, 3, 5, 1, 2)
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
    torch.testing.assert_close(s.context()[0][:, 0], k[:, 2])
