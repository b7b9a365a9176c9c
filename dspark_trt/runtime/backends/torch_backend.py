"""The ``torch`` drafter backend: the reference ``DSparkDrafter`` itself, on any device.

``draft`` is ``DSparkDrafter.draft`` (``block_hidden`` → ``base_logits`` → candidate selection → walk). By
default (``walk_fn=None``) the selection and walk are chosen per round by ``plugins.dispatch``: with top-k,
the fused Triton DSparkTopKMarkov kernel on CUDA and the Numba kernels on the CPU, else the oracle
``reference.markov``. A given ``walk_fn`` (``walk_candidates``' signature) walks the reference's candidates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from ...plugins.dispatch import REFERENCE, MarkovImpl, select_markov_impl
from ...reference.markov import MarkovWalkResult
from .base import DrafterBackend

__all__ = ["TorchDrafterBackend"]


class TorchDrafterBackend(DrafterBackend):
    """Runs a reference ``DSparkDrafter`` (weights on ``drafter``'s device/dtype).

    Args:
        drafter: a loaded ``reference.DSparkDrafter`` (``dspark_trt.load_drafter``).
        walk_fn (*optional*): replaces the Markov walk; same signature and result as
            ``reference.markov.walk_candidates``. Default: the device's native kernel, else the reference.

    Example:
        >>> with TorchDrafterBackend.from_pretrained("drafter/", target_dir="target/") as backend:
        ...     k, v = backend.context_kv(taps, positions)
    """

    name = "torch"

    def __init__(self, drafter, *, walk_fn: Callable[..., MarkovWalkResult] | None = None):
        self.drafter = drafter
        self.config = drafter.config
        self.device = drafter.embed_tokens.weight.device
        self.dtype = drafter.embed_tokens.weight.dtype
        self.walk_fn = walk_fn  # None: plugins.dispatch chooses per (device, case)
        self.d2t = drafter.d2t_or_none  # [V_d] or None

    @classmethod
    def from_pretrained(cls, drafter_dir: str | Path, *, target_dir: str | Path | None = None, dtype=None,
                        device=None, **kwargs) -> "TorchDrafterBackend":
        from ...loader import load_drafter

        from ...devices import resolve_device

        device = resolve_device(device)
        dtype = dtype if dtype is not None else ("bf16" if device.type == "cuda" else "fp32")
        return cls(load_drafter(drafter_dir, dtype=dtype, device=device, target_dir=target_dir), **kwargs)

    @torch.inference_mode()
    def context_kv(self, taps: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.drafter.context_kv(taps.to(self.device), positions.to(self.device))

    @torch.inference_mode()
    def draft(self, anchor, ctx_k, ctx_v, ctx_len, *, topk, temperature, seed) -> MarkovWalkResult:
        impl = self._auto_impl(topk) if self.walk_fn is None else REFERENCE._replace(walk=self.walk_fn)
        return self.drafter.draft(anchor, ctx_k, ctx_v, ctx_len, topk=topk, temperature=temperature, seed=seed,
                                  walk=impl.walk, select=impl.select)

    def _auto_impl(self, topk: int | None) -> MarkovImpl:
        """``plugins.dispatch.MarkovImpl`` for this drafter's device, dtype and ``topk``."""

        c = self.config
        return select_markov_impl(self.device, topk=topk, rank=c.markov_rank, num_draft_tokens=c.num_draft_tokens,
                                  logits_dtype=torch.float32, weights_dtype=self.dtype,
                                  draft_vocab_size=c.draft_vocab_size)
