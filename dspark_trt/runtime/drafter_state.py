"""The drafter's per-request state: its context K/V cache, the anchor and the anchor position.

Per request, at the start of a round (docs/dspark.md §4.1, §9)::

    committed target tokens   x_0 … x_{p-1}     their taps are fused into ctx K/V rows 0 … p-1
    anchor                    a = x_p            the last emitted token: not yet seen by the target
    ctx_len                   p                  = the anchor's position = valid context rows

The same holds in both layouts (§3.4): anchor-first feeds ``[a, M × (N-1)]`` at ``p … p+N-1``, bonus-anchor
``[a, M × N]`` at ``p … p+N``; the reference drafter builds that block from (anchor, ctx_len) itself, so
the runtime state is layout-free. What the layout changes for the runtime is N (``num_draft_tokens``).

After verification of ``[a, d_1 … d_n]`` with ``acc`` drafts accepted, the target has committed
``a, d_1 … d_acc`` at positions ``p … p+acc``: their taps are appended (``append(k, v, count=acc+1)``), the
context grows to ``p+acc+1`` and the emitted token becomes the anchor at that position. Rows past
``ctx_len`` (a rejected draft's taps) are left in the buffer but masked by ``ctx_len`` and overwritten next
round — that is the drafter's rollback.
"""

from __future__ import annotations

import torch

__all__ = ["DrafterState"]


class DrafterState:
    """Context K/V ``[L, B, T_cap, H_kv, D]`` per request (right-padded), ``ctx_len [B]`` and ``anchor [B]``."""

    def __init__(self, num_layers: int, batch: int, capacity: int, kv_heads: int, head_dim: int, *,
                 dtype: torch.dtype, device: torch.device):
        shape = (num_layers, batch, capacity, kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [L, B, T_cap, H_kv, D]
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.ctx_len = torch.zeros(batch, dtype=torch.int64, device=device)  # [B] = anchor position p
        self.anchor = torch.zeros(batch, dtype=torch.int64, device=device)  # [B] target id at position p

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor, count: torch.Tensor) -> None:
        """Write ``k, v`` [L, B, Q, H_kv, D] at rows ``ctx_len … ctx_len+Q-1``; advance ``ctx_len`` by ``count`` [B]."""
        L, B, Q = k.shape[:3]
        need = int(self.ctx_len.max()) + Q if B else 0
        if need > self.capacity:
            self._grow(max(need, 2 * self.capacity))
        rows = self.ctx_len.view(B, 1) + torch.arange(Q, device=self.k.device)  # [B, Q]
        batch = torch.arange(B, device=self.k.device).view(B, 1).expand(B, Q)
        self.k[:, batch, rows] = k.to(self.k.dtype)
        self.v[:, batch, rows] = v.to(self.v.dtype)
        self.ctx_len = self.ctx_len + count.to(self.ctx_len.device, torch.int64)

    def context(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of the used part of the cache, [L, B, max(ctx_len), H_kv, D] (no copy)."""
        t = int(self.ctx_len.max()) if self.ctx_len.numel() else 0
        return self.k[:, :, :t], self.v[:, :, :t]

    def select(self, rows: torch.Tensor) -> None:
        """Keep only the requests at ``rows``."""
        rows = rows.to(self.k.device, torch.int64)
        self.k, self.v = self.k[:, rows], self.v[:, rows]
        self.ctx_len, self.anchor = self.ctx_len[rows], self.anchor[rows]

    def _grow(self, capacity: int) -> None:
        pad = capacity - self.capacity
        shape = list(self.k.shape)
        shape[2] = pad
        self.k = torch.cat((self.k, self.k.new_zeros(shape)), dim=2)
        self.v = torch.cat((self.v, self.v.new_zeros(shape)), dim=2)

    def join(self, other: "DrafterState") -> "DrafterState":
        """This batch followed by ``other``'s requests (new requests joining at a round boundary)."""
        cap = max(self.capacity, other.capacity)
        for s in (self, other):
            if s.capacity < cap:
                s._grow(cap)
        self.k, self.v = torch.cat((self.k, other.k), dim=1), torch.cat((self.v, other.v), dim=1)
        self.ctx_len = torch.cat((self.ctx_len, other.ctx_len.to(self.ctx_len.device)))
        self.anchor = torch.cat((self.anchor, other.anchor.to(self.anchor.device)))
        return self
