"""One round of speculative decoding for a batch, as one pure function of its inputs (docs/dspark.md §9).

Anchor ``a`` at position ``p`` (per row)::

    draft     drafter.draft(a, ctx K/V, p)               → d_1 … d_N, candidates, corrected logits Z, confidence
    truncate  n = leading slots with confidence ≥ threshold   (n = N without a threshold), then n ≤ limit(n)
    q         reference.draft_probs(Z, candidates, d, T)      the exact distribution each d_j was drawn from
    verify    target.verify([a, d_1 … d_n])                   → p_1 … p_{n+1}, taps of positions p … p+n
              reference.verify_drafts(p, d, q)                → acc accepted, one emitted token y
    commit    target keeps a, d_1 … d_acc (KV rollback); drafter context += their taps; anchor ← y at p+acc+1

``speculative_round`` does exactly that and nothing else: what it was asked comes in as ``RoundParams``, what
happened goes out as ``RoundOutput`` (drafts, n verified, accepted, emitted tokens, the next anchor, and what the
drafter saw, for whoever watches it). Timers, statistics, the non-finite monitor, the verify policy of
``verify_drafts="auto"`` and the KV-room clamp belong to the caller (``batch.Batch``): it names the phases
through ``phase`` and caps n through ``limit``. ``target_round`` is the target-only baseline round.

The verifier and the baseline are the reference oracle functions with the same noise keys: ``sample_tokens``
at position t draws what the verifier's bonus draw at position t would.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..reference.markov import draft_to_target
from ..reference.verify import draft_probs, sample_tokens, verify_drafts

__all__ = ["Phase", "RoundOutput", "RoundParams", "speculative_round", "target_round"]

#: phase(name) -> a context manager around the round's work of that kind: "draft", "verify" or "other"
Phase = Callable[[str], object]


def _untimed(name: str):
    return nullcontext()


@dataclass(frozen=True)
class RoundParams:
    """What a round is asked, resolved before it runs (``draft_options``); per-row tensors follow the batch."""

    topk: int | None = None  # candidates per draft slot; None: the dense head
    threshold: float | None = None  # verify only the leading drafts with confidence ≥ this
    union: dict = field(default_factory=dict)  # {"markov_topm": M} with the candidate union, else {}
    temperature: torch.Tensor | None = None  # [B] fp32; None: every row greedy
    seed: torch.Tensor | None = None  # [B] int64 noise keys
    truncation: dict = field(default_factory=dict)  # {"top_k": [B] int64, "top_p": [B] fp32}, or {} (off)
    d2t: torch.Tensor | None = None  # [V_d] draft → target ids of a reduced draft vocabulary, else None


@dataclass
class RoundOutput:
    """What one round did, per row of the batch."""

    n: torch.Tensor  # [B] int64 drafts verified (0 in a target-only round)
    accepted: torch.Tensor  # [B] int64 drafts accepted, ≤ n
    emitted: torch.Tensor  # [B, N + 1] int64 tokens committed: row b's first accepted[b] + 1, then -1
    next_anchor: torch.Tensor  # [B] int64 the correction / bonus token: the next round's anchor
    width: int  # tokens per row the target verified (the anchor and max n drafts)
    drafts: torch.Tensor | None = None  # [B, N] int64 target ids drafted
    draft: object = None  # the drafter's MarkovWalkResult (candidate logits, confidence)
    context: tuple | None = None  # (taps [B, W, m·d], K, V [L, B, W, H_kv, D]) added to the drafter's context

    def tokens(self) -> list[list[int]]:
        """Each row's committed tokens: the accepted drafts and the emitted token."""
        return [row[: a + 1] for row, a in zip(self.emitted.tolist(), self.accepted.tolist())]


def speculative_round(target, drafter, state, anchor: torch.Tensor, params: RoundParams, *,
                      limit: Callable[[torch.Tensor], torch.Tensor] | None = None,
                      phase: Phase = _untimed) -> RoundOutput:
    """Draft, verify and commit one round for every row (module docstring); anchor [B] at ``state.ctx_len``.

    ``limit(n) -> n``: caps the drafts verified per row ([B] int64, after the confidence threshold), e.g. a
    fixed L, the verify policy's choice, the room left in the KV cache. ``target`` and ``state`` end committed."""
    N = drafter.config.num_draft_tokens
    dev = target.device
    temp, seed, truncation = params.temperature, params.seed, params.truncation
    with phase("draft"):
        ctx_k, ctx_v = state.context()
        p = state.ctx_len  # [B] anchor position
        res = drafter.draft(anchor.to(state.k.device), ctx_k, ctx_v, p, topk=params.topk, temperature=temp,
                            seed=seed, ctx_start=state.start, **params.union)
    with phase("verify"):
        drafts = res.tokens.to(dev)  # [B, N]
        n = torch.full((drafts.shape[0],), N, dtype=torch.int64, device=dev)  # [B] drafts to verify
        if params.threshold is not None:
            sure = (res.confidence.to(dev) >= params.threshold).to(torch.int64)  # [B, N]
            n = torch.cumprod(sure, dim=1).sum(1)
        if limit is not None:
            n = limit(n)
        width = int(n.max()) + 1
        cand = draft_to_target(res.cand_ids, params.d2t).to(dev)  # [B, N, k] target ids
        q = draft_probs(res.cand_logits.to(dev), cand, drafts, temp)  # [B, N, k]
        fed = torch.cat((anchor.view(-1, 1).to(dev), drafts[:, : width - 1]), dim=1)  # [B, W]
        ver = target.verify(fed)  # logits [B, W, V], taps [B, W, m·d]
        p = p.to(dev)
        accepted = torch.zeros_like(n)
        emitted = torch.full((fed.shape[0], N + 1), -1, dtype=torch.int64, device=dev)
        for m in torch.unique(n).tolist():  # requests verifying the same number of drafts, together
            rows = (n == m).nonzero().view(-1)
            r = verify_drafts(ver.logits[rows, : m + 1], drafts[rows, :m], cand[rows, :m], q[rows, :m],
                              temperature=None if temp is None else temp[rows], seed=seed[rows],
                              positions=p[rows] + 1, **{k: v[rows] for k, v in truncation.items()})
            accepted[rows] = r.num_accepted
            emitted[rows, : m + 1] = r.tokens
    with phase("other"):
        target.commit(accepted + 1)  # the anchor and the accepted drafts stay; rejected drafts roll back
        nxt = emitted.gather(1, accepted.view(-1, 1)).squeeze(1)  # [B] the correction / bonus token
    with phase("draft"):
        pos = p.view(-1, 1) + torch.arange(width, device=p.device)  # [B, W] positions of a, d_1, ...
        k, v = drafter.context_kv(ver.taps, pos)
        state.append(k, v, (accepted + 1).to(state.ctx_len.device))
    return RoundOutput(n=n, accepted=accepted, emitted=emitted, next_anchor=nxt, width=width, drafts=drafts,
                       draft=res, context=(ver.taps, k, v))


def target_round(target, anchor: torch.Tensor, params: RoundParams, *, phase: Phase = _untimed) -> RoundOutput:
    """One token per row from the target alone (the baseline), with the same sampler and noise keys."""
    with phase("verify"):
        p = target.lengths.clone()  # [B] anchor position
        logits = target.verify(anchor.view(-1, 1).to(target.device), with_taps=False).logits  # [B, 1, V]
        nxt = sample_tokens(logits[:, 0], params.temperature, params.seed, p + 1, **params.truncation)  # [B]
    with phase("other"):
        target.commit(torch.ones_like(p))
        zeros = torch.zeros_like(p)
    return RoundOutput(n=zeros, accepted=zeros, emitted=nxt.view(-1, 1), next_anchor=nxt, width=1)
