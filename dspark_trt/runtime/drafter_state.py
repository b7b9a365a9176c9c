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

The cache lies **heads first**, ``[L, B, H_kv, capacity, D]``, so one layer's ``[B, H_kv, capacity, D]`` is a
contiguous block: ``context()`` hands out views of the whole capacity (``[L, B, capacity, H_kv, D]``, the
backends' layout; each layer's heads-first view is the block itself), the draft graph reads them in place
and masks slots past ``ctx_len`` (``reference/layers.py: two_part_attention``), and ``append`` writes only
the new rows. A round therefore costs O(new tokens) of cache bookkeeping, whatever the context; slicing the
used prefix instead would hand the backends a non-contiguous tensor (a copy per round). Capacities are the
target cache's buckets (``artifact/kv_capacity.py``: 128, 160, 192, 224, 256, 320, …, four per octave): the
draft round attends over at most 25 % more slots than it needs (plus a round's headroom), and growing (a
copy of the cache into bigger buffers) happens once per bucket, O(1) rows per generated token amortised.

**Sliding** (a drafter whose every layer reads only the last W context rows, ``DSparkConfig.context_window``:
``dspark distill --context-window``). Then rows older than ``p - W`` are never read again, and the cache
holds at most ``most = bucket(W + W/2)`` rows, whatever the context. Buffer row r holds position
``start + r`` (``start [B]``, per request); when the rows kept would pass ``most``, that request's rows
``p' - W … p - 1`` (``p'`` its new length) move to the front — W rows copied once every ~W/2 tokens — and
``start`` becomes ``p' - W``. A long prompt writes only its last W rows; rows past ``p'`` (a round's
rejected drafts, a right-padded prompt's padding) only where they fit, being never read; and the decoder
computes the K/V of a long prompt's last rows only (``begin_at``: from min(prompt length) - W on). The keys
keep the RoPE of their positions, so only the mask moves: the draft round takes ``ctx_start = start``
(``reference/layers.py: block_attention_mask``) and reads ``most`` rows at most, and a request's drafter
memory stays O(W) at any context (the TensorRT backend's static buffers too).

**Spare rows** (``rows``: the padded backends). A backend that replays its draft round from a CUDA graph per
(batch bucket, capacity) bucket — the torch backend with graphs, TensorRT — binds the cache's buffers to the
graph by address, as ``TensorRTTarget`` binds the target's, instead of copying the context into the bucket's
static buffers every round (a whole context's worth per round for a drafter that attends to all of it). It asks
for its batch bucket of rows (``DrafterBackend.state_rows``): the buffers are ``[L, rows, H_kv, capacity, D]``
with rows ≥ B, the real requests first; ``context()`` hands out all rows (a padded request reads its own
stale, finite rows under ``ctx_len`` 0), ``select`` moves the kept requests forward in place while the bucket
stays, so the bound addresses stay too.
"""

from __future__ import annotations

import torch

from ..errors import DSparkTrtInternalError
from ..artifact.kv_capacity import capacity_bucket

__all__ = ["DrafterState"]


class DrafterState:
    """Context K/V ``[L, rows, H_kv, capacity, D]`` (right-padded, heads first; the B requests in rows 0 … B-1,
    ``rows`` ≥ B spare rows for a padded backend), ``ctx_len [B]``, ``anchor [B]`` and ``start [B]`` (the position
    of buffer row 0; 0 unless sliding). ``capacity`` is the first bucket ≥ the slots asked for (at most ``limit``,
    the export's ``max_context``, when that is enough; at most ``most`` with a ``window``)."""

    def __init__(self, num_layers: int, batch: int, capacity: int, kv_heads: int, head_dim: int, *,
                 dtype: torch.dtype, device: torch.device, limit: int | None = None, window: int | None = None,
                 rows: int | None = None):
        self.limit, self.window = limit, window
        # the most rows a sliding cache holds (None: it grows with the context)
        self.most = None if window is None else capacity_bucket(window + max(window // 2, 1))
        self.allocations = 0  # cache buffers allocated so far (tests, benchmarks)
        shape = (num_layers, max(batch, rows or 0), kv_heads, self._bucket(capacity), head_dim)
        self.k = self._zeros(shape, dtype, device)  # [L, B, H_kv, capacity, D]
        self.v = self._zeros(shape, dtype, device)
        self.ctx_len = torch.zeros(batch, dtype=torch.int64, device=device)  # [B] = anchor position p
        self.anchor = torch.zeros(batch, dtype=torch.int64, device=device)  # [B] target id at position p
        self.start = torch.zeros(batch, dtype=torch.int64, device=device)  # [B] position of buffer row 0

    def _zeros(self, shape, dtype, device) -> torch.Tensor:
        self.allocations += 1
        return torch.zeros(shape, dtype=dtype, device=device)

    def _bucket(self, slots: int) -> int:
        if self.most is not None:
            slots = min(int(slots), self.most)
        cap = capacity_bucket(max(int(slots), 1))
        return min(cap, self.limit) if self.limit is not None and slots <= self.limit else cap

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    @property
    def batch(self) -> int:
        """Requests held (B)."""
        return self.ctx_len.shape[0]

    @property
    def rows(self) -> int:
        """Buffer rows (≥ B: a padded backend's batch bucket)."""
        return self.k.shape[1]

    def append(self, k: torch.Tensor, v: torch.Tensor, count: torch.Tensor) -> None:
        """Write ``k, v`` [L, B, Q, H_kv, D] at positions ``ctx_len … ctx_len+Q-1``; advance ``ctx_len`` by ``count``
        [B]. Writes the B·Q new rows only (one indexed store), growing to the next bucket first when they do not
        fit — or, sliding, dropping the rows the window no longer reads (a long prompt's first rows among them;
        rows past the new length, padding or rejected drafts, are written only where they fit)."""
        L, B, Q = k.shape[:3]
        count = count.to(self.ctx_len.device, torch.int64)
        if not B:
            return
        new_len = self.ctx_len + count  # [B]
        first, kept, written = self._extent(new_len, Q)
        if self.most is not None and kept > self.most:
            self._slide(new_len)
            first, kept, written = self._extent(new_len, Q)
        need = kept if self.most is not None else written  # sliding: rows past the new length need no room
        if need > self.capacity:
            self._grow(need)
        rows = self.ctx_len.view(B, 1) + torch.arange(Q, device=self.k.device) - self.start.view(B, 1)  # [B, Q]
        batch = torch.arange(B, device=self.k.device).view(B, 1).expand(B, Q)
        if first < 0 or written > self.capacity:  # sliding: positions left behind or past the cache are skipped
            fits = (rows >= 0) & (rows < self.capacity)  # [B, Q]
            batch, step = fits.nonzero(as_tuple=True)  # [M] each
            # indices on dims 1 and 3 around a slice: the value is [M, L, H_kv, D]
            self.k[:, batch, :, rows[batch, step]] = k[:, batch, step].to(self.k.dtype).transpose(0, 1)
            self.v[:, batch, :, rows[batch, step]] = v[:, batch, step].to(self.v.dtype).transpose(0, 1)
        else:  # indices on dims 1 and 3 around a slice: the value is [B, Q, L, H_kv, D]
            self.k[:, batch, :, rows] = k.to(self.k.dtype).permute(1, 2, 0, 3, 4)
            self.v[:, batch, :, rows] = v.to(self.v.dtype).permute(1, 2, 0, 3, 4)
        self.ctx_len = new_len

    def _extent(self, new_len: torch.Tensor, Q: int) -> tuple[int, int, int]:
        """Buffer rows (relative to ``start``, over the batch, one synchronisation): the first row written (min),
        one past the last row kept (max of ``new_len``) and one past the last row written (max of ``ctx_len + Q``)."""
        first, kept, written = torch.stack(((self.ctx_len - self.start).min(), (new_len - self.start).max(),
                                            (self.ctx_len + Q - self.start).max())).tolist()
        return first, kept, written

    def begin_at(self, position: int) -> None:
        """Start every request's rows at ``position`` (empty, sliding: a long prompt's rows that no window will
        read are never computed; the first ``append`` writes position ``position`` on)."""
        if position and (self.most is None or bool((self.ctx_len != 0).any())):
            raise DSparkTrtInternalError(f"begin_at({position}) needs an empty sliding DrafterState")
        self.ctx_len.fill_(int(position))
        self.start.fill_(int(position))

    def _slide(self, new_len: torch.Tensor) -> None:
        """For each request whose kept rows would pass ``most``: keep positions ``new_len - W … ctx_len - 1`` (what
        its next rounds read of the rows held), moved to the front of its buffer in place (the same storage:
        bound addresses stay), and start its rows at ``new_len - W``."""
        W = int(self.window)
        for b in ((new_len - self.start) > self.most).nonzero().view(-1).tolist():
            start, held = int(self.start[b]), int(self.ctx_len[b])
            first = max(start, int(new_len[b]) - W)
            keep = max(0, held - first)  # rows already held that stay (positions first … held-1)
            if keep:
                shift = first - start
                self.k[:, b, :, :keep] = self.k[:, b, :, shift:shift + keep].clone()
                self.v[:, b, :, :keep] = self.v[:, b, :, shift:shift + keep].clone()
            self.start[b] = first

    def context(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole cache as ``[L, rows, capacity, H_kv, D]`` views (no copy; rows past ``ctx_len`` are masked by
        the draft round; spare rows past B only where a padded backend asked for them).
        ``ctx_k[l].transpose(1, 2)`` is layer l's contiguous ``[rows, H_kv, capacity, D]`` block."""
        return self.k.transpose(2, 3), self.v.transpose(2, 3)

    def layers(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-layer contiguous blocks ``[rows, H_kv, capacity, D]`` (views: what the draft graph reads)."""
        return list(self.k.unbind(0)), list(self.v.unbind(0))

    def select(self, rows: torch.Tensor, total: int | None = None) -> None:
        """Keep only the requests at ``rows``, in buffers of ``total`` rows (default ``len(rows)``). With ``total``
        = the current row count the kept rows move forward in place (the same buffers: bound addresses stay)."""
        rows = rows.to(self.k.device, torch.int64)
        total = max(len(rows), total or 0)
        if total == self.rows:
            self.k[:, : len(rows)] = self.k[:, rows]  # advanced indexing reads a copy first: no overlap hazard
            self.v[:, : len(rows)] = self.v[:, rows]
        else:
            self.k, self.v = self._packed([self.k[:, rows]], total), self._packed([self.v[:, rows]], total)
            self.allocations += 2
        self.ctx_len, self.anchor, self.start = self.ctx_len[rows], self.anchor[rows], self.start[rows]

    @staticmethod
    def _packed(parts: list[torch.Tensor], total: int) -> torch.Tensor:
        """``parts`` (each ``[L, n, H_kv, capacity, D]``) one after another, then zero rows up to ``total``: one
        buffer, written once."""
        if len(parts) == 1 and parts[0].shape[1] == total:
            return parts[0]
        first = parts[0]
        out = first.new_zeros((first.shape[0], total, *first.shape[2:]))
        at = 0
        for p in parts:
            out[:, at: at + p.shape[1]] = p
            at += p.shape[1]
        return out

    def _grow(self, slots: int) -> None:
        """Buffers of the first bucket ≥ ``slots``, holding the rows used so far (once per bucket)."""
        used = max(0, int((self.ctx_len - self.start).max())) if self.ctx_len.numel() else 0
        shape = list(self.k.shape)
        shape[3] = self._bucket(slots)
        k, v = self._zeros(shape, self.k.dtype, self.k.device), self._zeros(shape, self.v.dtype, self.v.device)
        k[:, :, :, :used], v[:, :, :, :used] = self.k[:, :, :, :used], self.v[:, :, :, :used]
        self.k, self.v = k, v

    def join(self, other: "DrafterState", total: int | None = None) -> "DrafterState":
        """This batch followed by ``other``'s requests (new requests joining at a round boundary), in buffers of
        ``total`` rows (default: the requests')."""
        cap = max(self.capacity, other.capacity)
        for s in (self, other):
            if s.capacity < cap:
                s._grow(cap)
        B, Bo = self.batch, other.batch
        total = max(B + Bo, total or 0)
        self.k = self._packed([self.k[:, :B], other.k[:, :Bo]], total)
        self.v = self._packed([self.v[:, :B], other.v[:, :Bo]], total)
        self.allocations += 2
        self.ctx_len = torch.cat((self.ctx_len, other.ctx_len.to(self.ctx_len.device)))
        self.anchor = torch.cat((self.anchor, other.anchor.to(self.anchor.device)))
        self.start = torch.cat((self.start, other.start.to(self.start.device)))
        return self
