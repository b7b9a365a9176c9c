"""The DSpark Markov walk, dense and top-k: the oracle for the kernel, the ONNX graphs and the engines.

Per request, with base logits ``U`` [N, V_d] (already × ``s``), anchor ``a`` and ``d_0 = a``
(docs/dspark.md §5, §7, §8)::

    dense:  S_j = all of V_d                      top-k:  S_j = TopK_k(U_j)   (base logits only, once)
    for j in 0..N-1:
        e_j   = W1[d_j]                                        # [r]  predecessor as a *target* id
        Z_j   = U_j[S_j] + s · (W2[S_j] @ e_j)                 # [k]  corrected candidate logits, fp32
        c_j   = σ(w_h · H_j + b + w_e · e_j)                   #      confidence (optional)
        t     = argmax_{v∈S_j} Z_j(v)                           greedy (T < 1e-5)
              = argmax_{v∈S_j} Z_j(v) / T + G(seed, p+1+j, v)   probabilistic (Gumbel-max, draft stream)
        d_{j+1} = t + d2t[t]                                   # draft id → target id

The verifier must use ``q_j = softmax(Z_j / T)`` over ``S_j`` — the dense corrected distribution restricted
to the candidates and renormalised — or one-hot for greedy drafts. The candidate logits are returned
*before* temperature. With ``k = V_d`` the top-k walk equals the dense walk bit for bit in fp32: both
project with the same GEMM shape per row and key the noise by token id, not by candidate rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import DSparkTrtError
from .sampling import DRAFT_SALT, gumbel_noise, is_greedy

__all__ = ["MarkovWalkResult", "markov_walk", "walk_candidates", "select_candidates", "draft_to_target"]


@dataclass
class MarkovWalkResult:
    tokens: torch.Tensor  # [B, N] int64, target-vocab ids (d2t applied)
    cand_ids: torch.Tensor  # [B, N, k] int64, draft-vocab ids of the candidates (k = V_d when dense)
    cand_logits: torch.Tensor  # [B, N, k] fp32, corrected logits Z at cand_ids, before temperature
    confidence: torch.Tensor | None  # [B, N] fp32 in (0, 1), or None without a confidence head


def draft_to_target(draft_ids: torch.Tensor, d2t: torch.Tensor | None) -> torch.Tensor:
    """Draft-vocab ids → target ids (``t = d + d2t[d]``); identity without a table."""
    return draft_ids if d2t is None else draft_ids + d2t.to(draft_ids.device)[draft_ids]


def select_candidates(base_logits: torch.Tensor, topk: int | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """S_j: (values, ids) [B, N, k] of the top-k base logits (fp32 values), or (all fp32 logits, None) for dense."""
    base = base_logits.to(torch.float32)
    if topk is None:
        return base, None
    Vd = base.shape[-1]
    if not 1 <= topk <= Vd:
        raise DSparkTrtError(f"top-k {topk} must be in [1, draft_vocab_size={Vd}]; use a smaller --topk or 'off'")
    fast = _topk_by_chunk_maxima(base, topk)
    return fast if fast is not None else torch.topk(base, topk, dim=-1)  # order irrelevant downstream


def _topk_by_chunk_maxima(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``torch.topk(x, k)`` for long CPU rows in about one read pass: the same values and ids, bit for bit.

    Split each row into V/C chunks of C (chunk j holds positions j, j + V/C, j + 2·V/C, …); every top-k element
    sits in one of the k chunks with the largest maxima, so a top-k over the k+1 best chunks' values finds
    them. A row's result is kept only where it is provably what ``torch.topk`` returns — its k values strictly
    decreasing and strictly above every value left out (the (k+1)-th of those values, and the maxima of all
    other chunks, which are <= the smallest of the k+1 kept maxima); rows with ties or NaNs get ``torch.topk``. None (caller runs torch.topk) for short rows,
    non-CPU tensors, and while tracing/exporting (the check is data-dependent).
    """
    V = x.shape[-1]
    C = next((c for c in (16, 8) if V % c == 0 and 16 * k * c <= V), None)  # sizes where it beats torch.topk
    if C is None or x.numel() == 0 or x.device.type != "cpu" or torch.jit.is_tracing() or torch.compiler.is_compiling():
        return None
    nc = V // C
    rows = x.reshape(-1, V)  # [R, V]
    chunk_max, chunk_ids = torch.topk(rows.view(-1, C, nc).amax(dim=1), k + 1, dim=-1, sorted=False)  # [R, k+1]
    # the k+1 best chunks' C·(k+1) values; everything outside is <= the smallest of their maxima
    ids = (chunk_ids[:, None, :] + torch.arange(0, V, nc, device=x.device)[None, :, None]).flatten(1)
    top, pos = torch.topk(rows.gather(1, ids), k + 1, dim=-1, sorted=False)  # [R, k+1]
    top, order = torch.sort(top, dim=-1, descending=True)
    vals, ids = top[:, :k].contiguous(), ids.gather(1, pos.gather(1, order[:, :k]))  # [R, k]
    unique = (top[:, 1:] < top[:, :-1]).all(dim=-1) & (top[:, k - 1] > chunk_max.amin(dim=-1))  # [R]
    if not bool(unique.all()):
        redo = (~unique).nonzero().squeeze(-1)
        vals[redo], ids[redo] = torch.topk(rows[redo], k, dim=-1)
    shape = (*x.shape[:-1], k)
    return vals.reshape(shape), ids.reshape(shape)


def markov_walk(
    base_logits: torch.Tensor,  # [B, N, V_d] any float dtype, already × logit_scale
    anchor: torch.Tensor,  # [B] int, target id of the anchor
    w1: torch.Tensor,  # [V, r] markov_w1 (indexed by target id)
    w2: torch.Tensor,  # [V_d, r] markov_w2 (Linear r → V_d, layout [out, in])
    *,
    topk: int | None = None,  # None = dense
    **walk_options,
) -> MarkovWalkResult:
    """Select the candidates (top-k of the base logits, or all of V_d) and walk the N Markov steps."""
    cand_vals, cand_ids = select_candidates(base_logits, topk)
    return walk_candidates(cand_vals, cand_ids, anchor, w1, w2, **walk_options)


def walk_candidates(
    cand_vals: torch.Tensor,  # [B, N, k] base logits at the candidates (k = V_d and ids None: dense)
    cand_ids: torch.Tensor | None,  # [B, N, k] int draft-vocab ids, or None for the whole vocabulary
    anchor: torch.Tensor,  # [B] int, target id of the anchor
    w1: torch.Tensor,  # [V, r] markov_w1 (indexed by target id)
    w2: torch.Tensor,  # [V_d, r] markov_w2
    *,
    logit_scale: float = 1.0,
    d2t: torch.Tensor | None = None,  # [V_d] int offsets, or None for V_d = V
    temperature: torch.Tensor | None = None,  # [B] fp32, per request; < 1e-5 = greedy; None = all greedy
    seed: torch.Tensor | None = None,  # [B] int >= 0, noise key (probabilistic only)
    positions: torch.Tensor | None = None,  # [B] int: sequence position of d_1 (= anchor position + 1)
    conf_base: torch.Tensor | None = None,  # [B, N] fp32: w_h · H_j + b, the hidden-state part of c_j
    conf_w_markov: torch.Tensor | None = None,  # [r]: the Markov-embedding part of the confidence weight
) -> MarkovWalkResult:
    """Walk the N sequential Markov steps over given candidates (the DSparkTopKMarkov op; module docstring)."""
    B, N, k = cand_vals.shape
    device = cand_vals.device
    cand_vals = cand_vals.to(torch.float32)
    dense = cand_ids is None
    if dense:
        cand_ids = torch.arange(k, device=device).expand(B, N, k)
    cand_ids = cand_ids.to(torch.int64)
    # Export-friendly: which path runs depends on which arguments are given, never on tensor values.
    sampling = temperature is not None
    if sampling and (seed is None or positions is None):
        raise DSparkTrtError("a temperature tensor needs seed and positions tensors (the Gumbel noise key)")
    if sampling:
        greedy = is_greedy(temperature).view(B, 1)  # [B, 1]
        temp = torch.where(greedy, 1.0, temperature.to(torch.float32).view(B, 1))  # [B, 1]
    w2f = w2.to(torch.float32) if dense else None  # top-k: only the gathered rows are converted
    wc = None if conf_w_markov is None else conf_w_markov.to(torch.float32)

    prev = anchor.to(torch.int64)  # [B] target ids
    tokens, logits, conf = [], [], []
    for j in range(N):
        e = w1[prev].to(torch.float32)  # [B, r]
        if conf_base is not None:
            part = conf_base[:, j].to(torch.float32)
            conf.append(torch.sigmoid(part + e @ wc if wc is not None else part))  # [B]
        if dense:
            bias = (w2f @ e.T).T  # [B, V_d]: one GEMM over the whole vocabulary
        else:
            rows = w2.index_select(0, cand_ids[:, j].reshape(-1)).view(B, k, -1).to(torch.float32)  # [B, k, r]
            bias = torch.bmm(rows, e.unsqueeze(-1)).squeeze(-1)  # [B, k]
        z = cand_vals[:, j] + logit_scale * bias  # [B, k] fp32
        score = z
        if sampling:
            g = gumbel_noise(seed.view(B, 1), (positions + j).view(B, 1), cand_ids[:, j], DRAFT_SALT)  # [B, k]
            score = torch.where(greedy, z, z / temp + g)
        pick = score.argmax(dim=-1)  # [B]
        tok = draft_to_target(cand_ids[:, j].gather(-1, pick.unsqueeze(-1)).squeeze(-1), d2t)
        tokens.append(tok)
        logits.append(z)
        prev = tok
    return MarkovWalkResult(
        tokens=torch.stack(tokens, dim=1),
        cand_ids=cand_ids,
        cand_logits=torch.stack(logits, dim=1),
        confidence=torch.stack(conf, dim=1) if conf else None,
    )
