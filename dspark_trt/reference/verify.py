"""Rejection sampling against a sparse draft distribution (docs/dspark.md §9): the lossless verifier.

The target scores ``[a, d_1 … d_N]`` and gives ``p_1 … p_{N+1}`` (softmax of its logits at temperature T).
The draft distribution of slot j is sparse: candidate ids (target vocabulary) and their probabilities —
``softmax(Z_j / T)`` over the top-k candidates, or one-hot for a greedy draft::

    for j in 1..N:
        accept d_j  iff  u_j · q_j(d_j) < p_j(d_j)         u_j ~ U(0,1), verifier stream, key (seed, pos(d_j))
        on reject: emit y ~ normalize(max(p_j − q_j, 0)); stop
    all accepted: emit the bonus y ~ p_{N+1}

With top-k / top-p (``sampling.truncation_mask``), p_j is the target's *truncated* distribution p'_j: the
same rule against p'_j keeps the output distributed exactly as the truncated target (the drafts themselves
are drawn as usual; a draft outside p'_j's support is always rejected).

Greedy (T < 1e-5): accept while ``d_j = argmax p_j``; emit ``argmax p_j`` at the first mismatch, or
``argmax p_{N+1}``. Samples are Gumbel-max draws keyed by (seed, position of the emitted token, token id)
in ``SAMPLE_SALT``; ``sample_tokens`` is the same sampler for target-only decoding, so a bonus token equals
what the target alone would have drawn at that position with that seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import ACCEPT_SALT, SAMPLE_SALT, apply_truncation, gumbel_noise, is_greedy, uniform_noise

__all__ = ["VerifyResult", "draft_probs", "verify_drafts", "sample_tokens"]


@dataclass
class VerifyResult:
    num_accepted: torch.Tensor  # [B] int64 in [0, N]: drafts accepted this round
    tokens: torch.Tensor  # [B, N + 1] int64: accepted drafts, then the correction/bonus token; -1 after

    @property
    def num_emitted(self) -> torch.Tensor:  # [B] int64: num_accepted + 1
        return self.num_accepted + 1


def draft_probs(
    cand_logits: torch.Tensor,  # [B, N, k] corrected logits Z (before temperature)
    cand_target_ids: torch.Tensor,  # [B, N, k] int64 candidates as target ids
    tokens: torch.Tensor,  # [B, N] int64 drafted target ids
    temperature: torch.Tensor | None,  # [B] fp32; None = all greedy
) -> torch.Tensor:
    """q over the candidates [B, N, k] fp32: ``softmax(Z / T)``, or one-hot at the drafted token for greedy
    requests (the exact distribution each token was drawn from). A −inf candidate (a duplicate the candidate
    union masked) gets probability 0 in both forms, so a duplicated id counts once."""
    B = cand_logits.shape[0]
    drawable = cand_logits != float("-inf")  # [B, N, k] False at masked duplicates
    onehot = ((cand_target_ids == tokens.unsqueeze(-1)) & drawable).to(torch.float32)
    if temperature is None:
        return onehot
    greedy = is_greedy(temperature).view(B, 1, 1)
    temp = torch.where(greedy, 1.0, temperature.to(torch.float32).view(B, 1, 1))
    soft = torch.softmax(cand_logits.to(torch.float32) / temp, dim=-1)
    return torch.where(greedy, onehot, soft)


def sample_tokens(
    logits: torch.Tensor,  # [B, V] target logits
    temperature: torch.Tensor | None,  # [B] fp32
    seed: torch.Tensor | None,  # [B] int64
    position: torch.Tensor | None,  # [B] int64: sequence position of the token being sampled
    top_k: torch.Tensor | None = None,  # [B] int64, 0 = off
    top_p: torch.Tensor | None = None,  # [B] fp32, 1 = off
) -> torch.Tensor:
    """[B] int64: argmax for greedy requests, Gumbel-max ``argmax(z + G)`` otherwise, with ``z = logits / T``
    and the tokens top-k / top-p drop at −inf."""
    logits = logits.to(torch.float32)
    greedy_tok = logits.argmax(-1)
    if temperature is None:
        return greedy_tok
    B, V = logits.shape
    greedy = is_greedy(temperature)
    temp = torch.where(greedy, 1.0, temperature.to(torch.float32)).view(B, 1)
    vocab = torch.arange(V, device=logits.device).view(1, V)
    g = gumbel_noise(seed.view(B, 1), position.view(B, 1), vocab, SAMPLE_SALT)
    z = apply_truncation(logits / temp, top_k, top_p)  # [B, V]
    return torch.where(greedy, greedy_tok, (z + g).argmax(-1))


def _sample_probs(probs: torch.Tensor, seed: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """Gumbel-max draw from probabilities [B, V] (zeros never win)."""
    B, V = probs.shape
    vocab = torch.arange(V, device=probs.device).view(1, V)
    g = gumbel_noise(seed.view(B, 1), position.view(B, 1), vocab, SAMPLE_SALT)
    return (torch.log(probs) + g).argmax(-1)


def verify_drafts(
    target_logits: torch.Tensor,  # [B, N + 1, V]: target logits at the anchor and each draft position
    draft_tokens: torch.Tensor,  # [B, N] int64 target ids
    cand_target_ids: torch.Tensor,  # [B, N, k] int64: draft candidates as target ids
    cand_probs: torch.Tensor,  # [B, N, k] fp32: q over the candidates (see draft_probs)
    *,
    temperature: torch.Tensor | None = None,  # [B] fp32; None = all greedy
    seed: torch.Tensor | None = None,  # [B] int64
    positions: torch.Tensor | None = None,  # [B] int64: sequence position of d_1
    top_k: torch.Tensor | None = None,  # [B] int64, 0 = off
    top_p: torch.Tensor | None = None,  # [B] fp32, 1 = off
) -> VerifyResult:
    """Accept a prefix of each request's drafts and emit one more token (see the module docstring)."""
    B, N1, V = target_logits.shape
    N = N1 - 1
    device = target_logits.device
    steps = torch.arange(N1, device=device)
    target_logits = target_logits.to(torch.float32)

    # greedy verification
    argmax = target_logits.argmax(-1)  # [B, N+1]
    g_match = draft_tokens == argmax[:, :N]  # [B, N]
    g_accepted = torch.cumprod(g_match.to(torch.int64), dim=1).sum(1)  # [B]
    g_next = argmax.gather(1, g_accepted.view(B, 1)).squeeze(1)  # [B]
    if temperature is None:
        accepted, nxt = g_accepted, g_next
    else:
        greedy = is_greedy(temperature)
        temp = torch.where(greedy, 1.0, temperature.to(torch.float32)).view(B, 1, 1)
        z = apply_truncation(target_logits / temp, None if top_k is None else top_k.view(B, 1),
                             None if top_p is None else top_p.view(B, 1))  # [B, N+1, V]
        p = torch.softmax(z, dim=-1)  # [B, N+1, V] truncated target
        q = torch.zeros(B, N, V, device=device).scatter_add_(-1, cand_target_ids, cand_probs.to(torch.float32))
        p_d = p[:, :N].gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)  # [B, N]
        q_d = q.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)  # [B, N]
        draft_pos = positions.view(B, 1) + steps[:N].view(1, N)  # [B, N] position of d_j
        u = uniform_noise(seed.view(B, 1), draft_pos, torch.zeros_like(draft_pos), ACCEPT_SALT)
        s_accepted = torch.cumprod((u * q_d < p_d).to(torch.int64), dim=1).sum(1)  # [B]
        # residual at the first rejection, or p_{N+1} for the bonus
        p_n = p.gather(1, s_accepted.view(B, 1, 1).expand(B, 1, V)).squeeze(1)  # [B, V]
        q_pad = torch.cat((q, torch.zeros(B, 1, V, device=device)), dim=1)  # q_{N+1} = 0
        q_n = q_pad.gather(1, s_accepted.view(B, 1, 1).expand(B, 1, V)).squeeze(1)
        residual = (p_n - q_n).clamp_min(0)
        mass = residual.sum(-1, keepdim=True)
        residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p_n)  # p == q: fall back to p
        s_next = _sample_probs(residual, seed, positions + s_accepted)  # position of the emitted token
        accepted = torch.where(greedy, g_accepted, s_accepted)
        nxt = torch.where(greedy, g_next, s_next)

    tokens = torch.full((B, N1), -1, dtype=torch.int64, device=device)
    keep = steps[:N].view(1, N) < accepted.view(B, 1)
    tokens[:, :N] = torch.where(keep, draft_tokens, -1)
    tokens.scatter_(1, accepted.view(B, 1), nxt.view(B, 1))
    return VerifyResult(num_accepted=accepted, tokens=tokens)
