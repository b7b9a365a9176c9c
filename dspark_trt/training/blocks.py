"""One teacher-forced draft block per anchor, as training and validation both see it.

For sequence rows ``m`` [M] and anchors ``p`` [M]: context = the target's taps at positions 0 … p−1, block =
anchor x_p then N − 1 mask slots, slot j's Markov bias W2 · u_j from the true predecessor x_{p+j}: u_j = W1[x_{p+j}]
(vanilla), or the gated / RNN head's feature of it and the slot's hidden state, the head stepped over the
block as the walk steps it (``reference.markov_heads.block_features``; rnn in the bonus-anchor layout starts
from the state after the anchor slot). With greedy target text that predecessor is also what the drafter's own
walk feeds slot j whenever slots 0 … j−1 were accepted, so these logits give the exact greedy acceptance of a
round (``validate.py``), for every head.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..reference.markov_heads import block_features

__all__ = ["Block", "FROZEN", "block_logits"]

#: the drafter's tensors training leaves alone: shared with (copied from) the target, rows ``d2t``-mapped
FROZEN = ("embed_tokens.weight", "lm_head.weight", "d2t")


class Block(NamedTuple):
    z: torch.Tensor  # [M, N, V_d] logits (base + Markov bias)
    hidden: torch.Tensor  # [M, N, d] slot hidden states
    e: torch.Tensor  # [M, N, r] W1 rows of the predecessors (what the confidence head reads, for every head)
    slot_pos: torch.Tensor  # [M, N] position of slot j's predecessor x_{p+j}
    m: torch.Tensor  # [M] sequence of each block


def block_logits(drafter, data: dict, rows: torch.Tensor, p: torch.Tensor) -> Block:
    """``rows`` [b] sequences, ``p`` [b, a] anchors (on the data's device) → the blocks' logits (``Block``)."""
    c = drafter.config
    N = c.num_draft_tokens
    ids = data["ids"]  # [S, L]
    dev = ids.device
    b, a = p.shape
    L = ids.shape[1]
    positions = torch.arange(L, device=dev).expand(b, L)
    k, v = drafter.context_kv(data["taps"][rows].to(torch.float32), positions)  # [Ld, b, L, H, D]
    seq_i = torch.arange(b, device=dev).repeat_interleave(a)  # [M]
    m = rows[seq_i]  # [M] sequence of each block
    pf = p.reshape(-1)  # [M]
    anchor = ids[m, pf]  # [M]
    states = drafter.block_states(anchor, k[:, seq_i], v[:, seq_i], pf)  # [M, Q, d] every query slot
    hidden = drafter.prediction_slots(states)  # [M, N, d]
    slot_pos = pf.view(-1, 1) + torch.arange(N, device=dev)  # [M, N]
    prev = ids[m.view(-1, 1), slot_pos]  # [M, N] teacher-forced Markov predecessors
    w1, w2 = drafter.markov_head.markov_w1.weight, drafter.markov_head.markov_w2.weight
    e = w1[prev]  # [M, N, r]
    u = block_features(drafter.head_features(anchor, states), e)  # [M, N, r]: e itself for vanilla
    z = drafter.base_logits(hidden) + c.logit_scale * (u.to(w2.dtype) @ w2.T)  # [M, N, V_d]
    return Block(z, hidden, e, slot_pos, m)
