"""The probability mass a top-k draft head drops, measured on real drafter states.

For each anchor p of a sequence the target wrote, the drafter's block (context = the target's taps at
0 … p-1) gives base logits U_j and, with the true predecessor x_{p+j} (teacher-forced), the corrected
distribution q_j = softmax(U_j + s · W2 · W1[x_{p+j}]). The top-k head only ever proposes the k best
tokens of U_j, so its drafts come from q_j restricted to them; the mass it drops is

    dropped_j(k) = 1 - Σ_{i ∈ top-k(U_j)} q_j(i)

reported as the mean (and the 99th percentile) over anchors, per slot and overall.
"""

from __future__ import annotations

import torch

__all__ = ["topk_dropped_mass"]


@torch.no_grad()
def topk_dropped_mass(drafter, target_model, sequences: list[list[int]], ks: list[int], *, starts: list[int] | None = None,
                      anchors_per_sequence: int = 16) -> dict:
    """``{k: {"mean": float, "p99": float, "per_slot": [N floats]}}`` for each k (k ≥ V_d is dense: 0)."""
    from ..config import hf_hidden_state_indices

    c = drafter.config
    N = c.num_draft_tokens
    dev = drafter.fc.weight.device
    drops = {k: [] for k in ks}  # k -> list of [M, N]
    for i, seq in enumerate(sequences):
        ids = torch.tensor(seq, dtype=torch.int64, device=dev).view(1, -1)
        L = ids.shape[1]
        first = max(1, (starts[i] if starts else 1))
        if L - N < first:
            continue
        out = target_model(input_ids=ids, output_hidden_states=True)
        taps = torch.cat([out.hidden_states[h] for h in hf_hidden_state_indices(c.target_layer_ids)], dim=-1)
        k_ctx, v_ctx = drafter.context_kv(taps.to(drafter.fc.weight.dtype), torch.arange(L, device=dev).view(1, L))
        p = torch.linspace(first, L - N, min(anchors_per_sequence, L - N - first + 1), device=dev).round().long()
        M = p.numel()
        hidden = drafter.block_hidden(ids[0, p], k_ctx.expand(-1, M, -1, -1, -1), v_ctx.expand(-1, M, -1, -1, -1), p)
        u = drafter.base_logits(hidden).to(torch.float32)  # [M, N, V_d]
        prev = ids[0, p.view(-1, 1) + torch.arange(N, device=dev)]  # [M, N]
        w1, w2 = drafter.markov_head.markov_w1.weight, drafter.markov_head.markov_w2.weight
        q = torch.softmax(u + c.logit_scale * (w1[prev] @ w2.T).to(torch.float32), dim=-1)  # [M, N, V_d]
        order = u.argsort(dim=-1, descending=True)
        cum = q.gather(-1, order).cumsum(-1)  # [M, N, V_d]
        for k in ks:
            kk = min(int(k), cum.shape[-1])
            drops[k].append((1 - cum[..., kk - 1]).clamp_min(0))
    result = {}
    for k, parts in drops.items():
        d = torch.cat(parts) if parts else torch.zeros(0, N)
        result[k] = {"mean": float(d.mean()) if d.numel() else 0.0,
                     "p99": float(d.flatten().quantile(0.99)) if d.numel() else 0.0,
                     "per_slot": d.mean(0).tolist() if d.numel() else [0.0] * N}
    return result
