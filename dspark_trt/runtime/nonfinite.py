"""Non-finite values in a draft round's inputs, detected cheaply and reported once per request (issue #16).

A drafter that overflows its dtype (an fp16 context fusion fed massive activations, a target that overflows
itself) drafts garbage without failing: the verifier rejects every draft, decoding stays lossless, and only
the acceptance collapses. ``NonFiniteMonitor`` makes that visible:

* ``context(taps, k, v, keep, request_ids)`` after each ``backend.context_kv``: one ``isfinite().all()``
  reduction over the *new* tokens' taps and K/V (the cache is append-only, so checking what enters it covers
  it), queued on the device — no synchronisation;
* ``draft(result, request_ids)`` after each ``backend.draft``: the same on the candidate logits, and one
  synchronisation for the whole round.

Only after a non-finite value is found does it scan per request, per tap and per layer, and log one warning
per request (``logging`` ``dspark.runtime``) naming where the values went non-finite and the fix.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

import torch

from ..config import DSparkConfig

__all__ = ["NonFiniteMonitor"]

log = logging.getLogger("dspark.runtime")

_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
_DRAFTER_FIX = ("run the drafter in bf16 or fp32 (--dtype bf16), or re-export it with this dspark-trt (fp16 "
                "exports keep the taps, fc and hidden_norm in fp32)")


@dataclass
class _Context:
    finite: torch.Tensor  # [] bool, on the device
    taps: torch.Tensor  # [B, T, m·d]
    k: torch.Tensor  # [L, B, T, H_kv, D]
    v: torch.Tensor
    valid: torch.Tensor  # [B, T] bool: tokens that enter the cache
    request_ids: list


def _finite(x: torch.Tensor, valid: torch.Tensor, batch_dim: int) -> torch.Tensor:
    """[] bool: x finite wherever ``valid`` [B, T] (x's dims ``batch_dim``, ``batch_dim + 1``) holds."""
    shape = [1] * x.dim()
    shape[batch_dim], shape[batch_dim + 1] = valid.shape
    return (torch.isfinite(x) | ~valid.to(x.device).view(shape)).all()


class NonFiniteMonitor:
    """Watches one batch of requests' draft rounds (see the module docstring).

    Args:
        config: the drafter's config (tap layer ids, for the warning).
        drafter_dtype (*optional*): the backend's compute dtype, named in the warning.
    """

    def __init__(self, config: DSparkConfig, *, drafter_dtype: torch.dtype | None = None):
        self.config = config
        self.dtype_name = _DTYPE_NAMES.get(drafter_dtype, str(drafter_dtype).removeprefix("torch."))
        self.reported: set = set()  # request ids already warned about
        self._pending: list[_Context] = []

    def context(self, taps: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor,
                request_ids: Sequence | torch.Tensor) -> None:
        """taps [B, T, m·d], K/V [L, B, T, H_kv, D] of the new tokens; keep [B]: leading tokens that enter the
        cache. Queues the check (no synchronisation)."""
        B, T = taps.shape[:2]
        valid = torch.arange(T, device=keep.device).view(1, T) < keep.view(B, 1)  # [B, T]
        finite = _finite(taps, valid, 0)
        finite = finite & _finite(k, valid, 1).to(finite.device) & _finite(v, valid, 1).to(finite.device)
        self._pending.append(_Context(finite, taps, k, v, valid, request_ids))

    def draft(self, result, request_ids: Sequence | torch.Tensor) -> list[str]:
        """After a draft round (``MarkovWalkResult``): one synchronisation; warns about newly affected
        requests and returns the warnings (empty when all is finite)."""
        logits = result.cand_logits  # [B, N, k]
        finite = result.finite_logits() if hasattr(result, "finite_logits") else torch.isfinite(logits)
        flags = [p.finite.to(logits.device) for p in self._pending] + [finite.all()]
        pending, self._pending = self._pending, []
        if bool(torch.stack(flags).all()):
            return []
        found: dict = {}  # request id → message (the earliest stage wins)
        for p in pending:
            self._scan_context(p, found)
        for row, rid in enumerate(_ids(request_ids)):
            if rid not in found and not bool(finite[row].all()):
                slots = sorted({int(j) for j in (~finite[row]).nonzero()[:, 0].tolist()})
                found[rid] = (f"non-finite draft logits at slot(s) {slots} while its context K/V are finite: the "
                              f"draft round (block layers, lm_head) overflowed the drafter's {self.dtype_name}; "
                              f"{_DRAFTER_FIX}")
        messages = []
        for rid, why in found.items():
            if rid in self.reported:
                continue
            self.reported.add(rid)
            message = f"request {rid}: {why}. Its drafts are garbage (decoding stays lossless, acceptance collapses)"
            log.warning(message)
            messages.append(message)
        return messages

    def _scan_context(self, p: _Context, found: dict) -> None:
        c = self.config
        d = p.taps.shape[-1] // max(1, len(c.target_layer_ids))
        for row, rid in enumerate(_ids(p.request_ids)):
            if rid in found:
                continue
            valid = p.valid[row].to(p.taps.device)
            bad = ~torch.isfinite(p.taps[row][valid])  # [t, m·d]
            if bool(bad.any()):
                taps = sorted({int(ch) // d for ch in bad.any(0).nonzero()[:, 0].tolist()})
                layers = [c.target_layer_ids[i] for i in taps if i < len(c.target_layer_ids)]
                found[rid] = (f"non-finite target hidden states in tap(s) {taps} (target layer(s) {layers}, "
                              f"DeepSeek ids): the target overflowed its own dtype; run the target in bf16 or fp32")
                continue
            kv_valid = p.valid[row].to(p.k.device)
            layers = [i for i in range(p.k.shape[0])
                      if not bool(torch.isfinite(p.k[i, row][kv_valid]).all() and
                                  torch.isfinite(p.v[i, row][kv_valid]).all())]
            if layers:
                found[rid] = (f"non-finite context K/V in drafter layer(s) {layers} while its taps are finite: the "
                              f"context fusion (fc, hidden_norm) or the K/V projections overflowed the drafter's "
                              f"{self.dtype_name}; {_DRAFTER_FIX}")


def _ids(request_ids) -> list:
    return request_ids.tolist() if isinstance(request_ids, torch.Tensor) else list(request_ids)
