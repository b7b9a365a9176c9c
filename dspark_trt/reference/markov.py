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

Gated and RNN heads (``head``: ``reference/markov_heads.py``) replace ``e_j`` in the bias by a feature ``u_j`` [r]
that also reads slot j's backbone state (and, for rnn, a recurrent state): ``Z_j = U_j[S_j] + s · (W2[S_j] @ u_j)``.
The candidates, the confidence (which reads ``e_j``), the noise and the draft → target map are the same.

Candidate union (``markov_topm = M > 0``, ``union_table`` [V, M] from ``markov_union_table``)::

    S_j = TopK_k(U_j) ∪ table[d_j]                   [k + M] ids, fixed shape: the k top-k ids, then table[d_j]
    a table id already among the top-k keeps its id but gets base value −inf, so it is never drawn and has
    zero probability in q_j (``draft_probs`` masks it); the walk scores exactly this set.

``table[t]`` holds the ids of the M largest entries of the Markov bias row ``s · W2 · W1[t]`` (the
tokens the head pushes up most after ``t``). It is indexed like ``W1``, by the predecessor's *target* id,
so it is [V, M] (= [V_d, M] when V_d = V): the anchor ``d_0`` may be any target id. The union is defined for
the vanilla head only (``DSparkConfig`` and ``walk_candidates`` refuse it for the others): a gated or RNN head's
bias depends on the context, so a static table could rank only a bias that is never applied.

The verifier must use ``q_j = softmax(Z_j / T)`` over ``S_j`` — the dense corrected distribution restricted
to the candidates and renormalised — or one-hot for greedy drafts. The candidate logits are returned
*before* temperature. With ``k = V_d`` the top-k walk drafts the dense walk's tokens: the noise is keyed by
token id, not by candidate rank. Its corrected logits equal the dense ones up to the summation order of the
r-term bias (the dense walk runs one GEMM over V_d, the top-k walk a batched GEMV over gathered rows, and BLAS
picks kernels, hence orders, by shape and CPU): within 2·γ_r·s·Σ|W2·e| in fp32, not bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import DSparkTrtError
from .markov_heads import HeadFeatures
from .sampling import DRAFT_SALT, gumbel_noise, is_greedy

__all__ = ["MarkovWalkResult", "markov_walk", "walk_candidates", "select_candidates", "draft_to_target",
           "markov_union_table"]


@dataclass
class MarkovWalkResult:
    tokens: torch.Tensor  # [B, N] int64, target-vocab ids (d2t applied)
    cand_ids: torch.Tensor  # [B, N, k (+ M)] int64, draft-vocab ids of the candidates (k = V_d when dense)
    cand_logits: torch.Tensor  # [B, N, k (+ M)] fp32, corrected logits Z at cand_ids (−inf: masked duplicate)
    confidence: torch.Tensor | None  # [B, N] fp32 in (0, 1), or None without a confidence head
    union_width: int = 0  # M: the last M candidates are the union's table ids (−inf there = masked duplicate)

    def finite_logits(self) -> torch.Tensor:
        """[B, N, k (+ M)] bool: finite, or a masked duplicate of the candidate union (−inf by design)."""
        ok = torch.isfinite(self.cand_logits)
        if self.union_width:
            ok[..., -self.union_width:] |= self.cand_logits[..., -self.union_width:] == float("-inf")
        return ok


def draft_to_target(draft_ids: torch.Tensor, d2t: torch.Tensor | None) -> torch.Tensor:
    """Draft-vocab ids → target ids (``t = d + d2t[d]``); identity without a table."""
    return draft_ids if d2t is None else draft_ids + d2t.to(draft_ids.device)[draft_ids]


def markov_union_table(
    w1: torch.Tensor,  # [V, r] markov_w1 (indexed by target id)
    w2: torch.Tensor,  # [V_d, r] markov_w2
    topm: int,
    *,
    logit_scale: float = 1.0,
    rows_per_chunk: int = 1024,
) -> torch.Tensor:
    """[V, M] int32: per predecessor target id t, the draft ids of the M largest entries of ``s · W2 · W1[t]``.

    Built once per (drafter, M) in fp32, ``rows_per_chunk`` predecessors per GEMM ([chunk, V_d] at a time);
    ties are broken as ``torch.topk`` breaks them. M = 0 gives an empty [V, 0] table.
    """
    V, Vd = w1.shape[0], w2.shape[0]
    if not 0 <= topm <= Vd:
        raise DSparkTrtError(f"--markov-topm {topm} must be in [0, draft_vocab_size={Vd}]; use a smaller M")
    table = torch.empty(V, topm, dtype=torch.int32, device=w1.device)
    if topm == 0:
        return table
    w2f = w2.to(torch.float32)  # [V_d, r]
    for start in range(0, V, rows_per_chunk):
        e = w1[start:start + rows_per_chunk].to(torch.float32)  # [c, r]
        bias = float(logit_scale) * (e @ w2f.T)  # [c, V_d]
        table[start:start + rows_per_chunk] = torch.topk(bias, topm, dim=-1).indices.to(torch.int32)
    return table


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
    """Select the candidates (top-k of the base logits, or all of V_d) and walk the N Markov steps
    (``union_table=`` in ``walk_options``: the candidate union, valued from these base logits)."""
    cand_vals, cand_ids = select_candidates(base_logits, topk)
    if walk_options.get("union_table") is not None:
        walk_options.setdefault("base_logits", base_logits)
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
    union_table: torch.Tensor | None = None,  # [V, M] int draft ids per predecessor target id (candidate union)
    base_logits: torch.Tensor | None = None,  # [B, N, V_d] the base logits (× s): needed with union_table
    head: HeadFeatures | None = None,  # a gated or RNN head's walk inputs (None = vanilla)
) -> MarkovWalkResult:
    """Walk the N sequential Markov steps over given candidates (the DSparkTopKMarkov op; module docstring).

    With ``union_table`` (M = its width > 0), slot j also scores ``union_table[d_j]``'s ids, their base values
    read from ``base_logits``; a duplicate of a top-k id is masked (−inf). M = 0 is the plain walk. With ``head``
    the bias multiplies the head's feature ``u_j`` instead of ``e_j`` (the DSparkTopKMarkovGated/RNN ops).
    """
    if union_table is not None and union_table.shape[-1] > 0:
        if head is not None:
            raise DSparkTrtError(f"the candidate union (--markov-topm M > 0) is defined for the vanilla Markov head "
                                 f"only: a {head.kind} head's bias depends on the context; use --markov-topm 0")
        if cand_ids is None:
            raise DSparkTrtError("the candidate union (--markov-topm M > 0) needs a top-k head: the dense head "
                                 "already scores every token; use --markov-topm 0 or a --topk")
        if base_logits is None:
            raise DSparkTrtError("the candidate union needs the base logits [B, N, V_d] to value the table's ids")
        return _walk_union(cand_vals, cand_ids, anchor, w1, w2, union_table, base_logits, logit_scale=logit_scale,
                           d2t=d2t, temperature=temperature, seed=seed, positions=positions, conf_base=conf_base,
                           conf_w_markov=conf_w_markov)
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
    state = None if head is None else head.start()  # [B, r] fp32 (rnn) or None
    tokens, logits, conf = [], [], []
    for j in range(N):
        e = w1[prev].to(torch.float32)  # [B, r]
        if conf_base is not None:
            part = conf_base[:, j].to(torch.float32)
            conf.append(torch.sigmoid(part + e @ wc if wc is not None else part))  # [B]
        u = e if head is None else None  # [B, r]: what multiplies W2
        if head is not None:
            u, state = head.step(e, j, state)
        if dense:
            bias = (w2f @ u.T).T  # [B, V_d]: one GEMM over the whole vocabulary
        else:
            rows = w2.index_select(0, cand_ids[:, j].reshape(-1)).view(B, k, -1).to(torch.float32)  # [B, k, r]
            bias = torch.bmm(rows, u.unsqueeze(-1)).squeeze(-1)  # [B, k]
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


def _walk_union(cand_vals, cand_ids, anchor, w1, w2, union_table, base_logits, *, logit_scale, d2t, temperature,
                seed, positions, conf_base, conf_w_markov) -> MarkovWalkResult:
    """``walk_candidates`` over S_j = top-k ∪ union_table[d_j] (k + M slots, duplicates masked with −inf)."""
    B, N, k = cand_vals.shape
    M = union_table.shape[-1]
    device = cand_vals.device
    cand_vals = cand_vals.to(torch.float32)
    cand_ids = cand_ids.to(torch.int64)
    table = union_table.to(device)  # [V, M] int32 (rows converted when read: the table is large)
    base = base_logits.to(device)
    sampling = temperature is not None
    if sampling and (seed is None or positions is None):
        raise DSparkTrtError("a temperature tensor needs seed and positions tensors (the Gumbel noise key)")
    if sampling:
        greedy = is_greedy(temperature).view(B, 1)  # [B, 1]
        temp = torch.where(greedy, 1.0, temperature.to(torch.float32).view(B, 1))  # [B, 1]
    wc = None if conf_w_markov is None else conf_w_markov.to(torch.float32)

    prev = anchor.to(torch.int64)  # [B] target ids
    tokens, logits, ids_out, conf = [], [], [], []
    for j in range(N):
        e = w1[prev].to(torch.float32)  # [B, r]
        if conf_base is not None:
            part = conf_base[:, j].to(torch.float32)
            conf.append(torch.sigmoid(part + e @ wc if wc is not None else part))  # [B]
        extra = table[prev].to(torch.int64)  # [B, M] draft ids
        dup = (extra.unsqueeze(-1) == cand_ids[:, j].unsqueeze(1)).any(-1)  # [B, M]: already a top-k candidate
        extra_vals = base[:, j].gather(-1, extra).to(torch.float32).masked_fill(dup, float("-inf"))  # [B, M]
        ids = torch.cat((cand_ids[:, j], extra), dim=-1)  # [B, k + M]
        vals = torch.cat((cand_vals[:, j], extra_vals), dim=-1)  # [B, k + M] fp32
        rows = w2.index_select(0, ids.reshape(-1)).view(B, k + M, -1).to(torch.float32)  # [B, k + M, r]
        bias = torch.bmm(rows, e.unsqueeze(-1)).squeeze(-1)  # [B, k + M]
        z = vals + logit_scale * bias  # [B, k + M] fp32, −inf at masked duplicates
        score = z
        if sampling:
            g = gumbel_noise(seed.view(B, 1), (positions + j).view(B, 1), ids, DRAFT_SALT)  # [B, k + M]
            score = torch.where(greedy, z, z / temp + g)
        pick = score.argmax(dim=-1)  # [B]
        tok = draft_to_target(ids.gather(-1, pick.unsqueeze(-1)).squeeze(-1), d2t)
        tokens.append(tok)
        logits.append(z)
        ids_out.append(ids)
        prev = tok
    return MarkovWalkResult(
        tokens=torch.stack(tokens, dim=1),
        cand_ids=torch.stack(ids_out, dim=1),
        cand_logits=torch.stack(logits, dim=1),
        confidence=torch.stack(conf, dim=1) if conf else None,
        union_width=M,
    )
