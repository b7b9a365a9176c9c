"""Feeding the exported drafter graphs: torch tensors in, the reference's ``MarkovWalkResult`` out.

``run_context`` / ``run_draft`` take a graph runner (``OrtGraph``, a ``TensorRTGraph``: ``run({name: tensor})``)
and are shared by the onnxruntime and TensorRT drafters and by export's validation (which runs the graphs
through this same code). The I/O names are the artifact's (``artifact/drafter_io.py``).
"""

from __future__ import annotations

import torch

from ..artifact.drafter_io import ctx_names

__all__ = ["run_context", "run_draft"]


def run_context(graph, taps: torch.Tensor, positions: torch.Tensor):
    """Context graph (an ``OrtGraph``): taps [B, T, m·d], positions [B, T] → K, V [L, B, T, H_kv, D]."""
    out = graph.run({"taps": taps, "positions": positions})
    return out["ctx_k"], out["ctx_v"]


def run_draft(graph, anchor, ctx_k, ctx_v, ctx_len, temperature, seed, *, draft_vocab: int, union_width: int = 0,
              ctx_start: torch.Tensor | None = None, plan=None):
    """Draft graph → ``MarkovWalkResult`` (int64 ids as the reference returns them; ``union_width`` = the export's
    M: the last M candidates are union ids, −inf there = a masked duplicate).

    ``ctx_k``/``ctx_v``: ``[L, B, T, H_kv, D]`` or per-layer heads-first ``L × [B, H_kv, T, D]``; each layer is fed
    as its heads-first view, which is the cache's own memory when the tensor is a ``DrafterState.context()``
    view (no copy), and a copy otherwise.

    ``ctx_start`` [B] (None: zeros) is the position of context row 0 (a sliding ``DrafterState``'s ``start``).
    ``temperature=None`` drafts greedily (fed as zeros); seeds are reduced modulo the hash prime, which the
    noise hash does first anyway, so any non-negative int64 seed fits the graph's int32 input.

    ``plan`` (a ``TensorRTGraph``'s ``PadPlan``, optional): the bucket the context is bound in (its rows may then
    exceed B: a ``DrafterState`` of ``state_rows(B)`` rows, ``runtime/cuda_graphs.py: bound_context_plan``).
    """
    from ..reference.markov import MarkovWalkResult
    from ..reference.sampling import HASH_PRIME

    B = anchor.shape[0]
    if temperature is None:
        temperature = torch.zeros(B, device=anchor.device)
    seed = torch.zeros(B, dtype=torch.int64, device=anchor.device) if seed is None else seed.to(torch.int64)
    from ..reference.drafter import context_length, layer_context

    L = ctx_k.shape[0] if isinstance(ctx_k, torch.Tensor) else len(ctx_k)
    keys, values = ctx_names(L)
    start = torch.zeros_like(ctx_len) if ctx_start is None else ctx_start  # [B]: row 0 holds this position
    feeds = {"anchor": anchor, "ctx_len": ctx_len, "ctx_start": start, "temperature": temperature.to(torch.float32),
             "seed": seed % HASH_PRIME}
    empty = context_length(ctx_k) == 0  # the graph reads at least one slot: a masked one stands for none
    for i in range(L):
        k, v = layer_context(ctx_k, i), layer_context(ctx_v, i)  # [B, H_kv, T, D]
        if empty:
            k = v = k.new_zeros((k.shape[0], k.shape[1], 1, k.shape[3]))
        feeds[keys[i]], feeds[values[i]] = k, v
    out = graph.run(feeds) if plan is None else graph.run(feeds, plan=plan)
    logits = out["cand_logits"]
    ids = out.get("cand_ids")
    ids = (torch.arange(draft_vocab, device=logits.device).expand(logits.shape) if ids is None
           else ids.to(torch.int64))
    return MarkovWalkResult(tokens=out["draft_tokens"].to(torch.int64), cand_ids=ids, cand_logits=logits,
                            confidence=out.get("confidence"), union_width=int(union_width))
