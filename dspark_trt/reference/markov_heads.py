"""The gated and RNN Markov heads: what each walk step multiplies with ``W2``, split into the part the walk needs
and the part it does not (docs/dspark.md §5).

The vanilla head biases slot j by ``W2 · e_j`` with ``e_j = W1[d_j]`` (the predecessor's embedding). The other
two heads the field trains (speculators ``MarkovHead``, NeMo AutoModel ``GatedMarkovHead`` / ``RNNHead``,
DeepSpec) replace ``e_j`` by a feature ``u_j`` [r] that also reads slot j's final-normed backbone state ``h_j``
(the features the confidence head reads)::

    gated:  g_j  = σ(G · [h_j ; e_j] + b_G)                     G = gate_proj  [r, d + r]
            u_j  = g_j ⊙ e_j
    rnn:    s_0  = 0 (anchor-first) | one update on (e(a), h_anchor) (bonus-anchor: slot 0 carries the anchor)
            (γ, c, o) = split₃(J · [s_j ; e_j ; h_j] + b_J)     J = joint_proj [3r, 2r + d]
            u_j  = tanh(o)
            s_{j+1} = σ(γ) ⊙ s_j + (1 − σ(γ)) ⊙ tanh(c)
    bias_j = W2 · u_j            (top-k: only the k candidate rows of W2, as for vanilla)

``h_j`` does not depend on the walk, so its share of the projection is computed for every slot at once before
the walk (``hidden_part``: ``G_h · h_j + b_G`` [B, N, r], ``J_h · h_j + b_J`` [B, N, 3r]); a walk step adds only
the r-sized products ``G_e · e_j`` ([r, r]) or ``J_{s,e} · [s_j ; e_j]`` ([3r, 2r]). ``HeadFeatures`` holds
those walk inputs; ``head_features`` builds them from the head's weights. Everything is fp32.

Training applies the same steps block-wise with teacher forcing (``block_features``: every slot's predecessor is
the true token), which is how speculators' ``MarkovHead.block_bias`` trains them; ``training/blocks.py`` uses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from ..errors import DSparkTrtError

__all__ = ["HeadFeatures", "block_features", "head_features", "rnn_initial_state"]


@dataclass(frozen=True)
class HeadFeatures:
    """The walk inputs of a gated or RNN head for one round (module docstring)."""

    kind: Literal["gated", "rnn"]
    hidden_part: torch.Tensor  # [B, N, r] gated (G_h·h + b_G) | [B, N, 3r] rnn (J_h·h + b_J), fp32
    weight: torch.Tensor  # [r, r] gated (G_e) | [3r, 2r] rnn (J over [state ; e]), layout [out, in]
    state0: torch.Tensor | None = None  # [B, r] fp32 rnn start state (None = zeros); unused by gated

    def __post_init__(self) -> None:
        B, N, width = self.hidden_part.shape
        r = width if self.kind == "gated" else width // 3
        want = (r, r) if self.kind == "gated" else (3 * r, 2 * r)
        if self.kind not in ("gated", "rnn") or (self.kind == "rnn" and width % 3):
            raise DSparkTrtError(f"HeadFeatures: kind {self.kind!r} with hidden_part width {width}: use 'gated' "
                                 f"([B, N, r]) or 'rnn' ([B, N, 3r])")
        if tuple(self.weight.shape) != want:
            raise DSparkTrtError(f"HeadFeatures({self.kind}): weight has shape {list(self.weight.shape)}, expected "
                                 f"{list(want)} for rank {r}")
        if self.state0 is not None and tuple(self.state0.shape) != (B, r):
            raise DSparkTrtError(f"HeadFeatures(rnn): state0 has shape {list(self.state0.shape)}, expected [{B}, {r}]")

    @property
    def rank(self) -> int:
        return self.hidden_part.shape[-1] // (1 if self.kind == "gated" else 3)

    def start(self) -> torch.Tensor | None:
        """The walk's state before slot 0: [B, r] fp32 for rnn, None for gated."""
        if self.kind == "gated":
            return None
        B = self.hidden_part.shape[0]
        zeros = torch.zeros(B, self.rank, dtype=torch.float32, device=self.hidden_part.device)
        return zeros if self.state0 is None else self.state0.to(torch.float32)

    def step(self, e: torch.Tensor, j: int, state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One walk step: the predecessor embeddings ``e`` [B, r] fp32 → (u [B, r] fp32, the next state)."""
        w = self.weight.to(torch.float32)
        pre = self.hidden_part[:, j].to(torch.float32)  # [B, r | 3r]
        if self.kind == "gated":
            return torch.sigmoid(pre + e @ w.T) * e, None
        gate, cand, out = (pre + torch.cat((state, e), dim=-1) @ w.T).chunk(3, dim=-1)  # 3 × [B, r]
        gate = torch.sigmoid(gate)
        return torch.tanh(out), gate * state + (1.0 - gate) * torch.tanh(cand)


def block_features(head: HeadFeatures | None, e: torch.Tensor) -> torch.Tensor:
    """[B, N, r]: what multiplies ``W2`` at every slot with the predecessors' embeddings ``e`` [B, N, r] given
    (teacher forcing): ``e`` itself for vanilla (``head`` None), else the walk's own steps over the block.
    Differentiable; the dtype of ``e`` for vanilla, fp32 otherwise."""
    if head is None:
        return e
    state = head.start()
    out = []
    for j in range(e.shape[1]):
        u, state = head.step(e[:, j].to(torch.float32), j, state)
        out.append(u)
    return torch.stack(out, dim=1)


def head_features(
    kind: str,
    hidden: torch.Tensor,  # [B, N, d] final-normed backbone states of the N prediction slots
    proj_weight: torch.Tensor,  # gated [r, d + r] gate_proj | rnn [3r, 2r + d] joint_proj
    proj_bias: torch.Tensor,  # [r] | [3r]
    *,
    state0: torch.Tensor | None = None,  # [B, r] rnn start state (None = zeros)
) -> HeadFeatures:
    """Split a gated or RNN head's projection into the per-slot hidden part and the walk's weight (docstring)."""
    d = hidden.shape[-1]
    w = proj_weight.to(torch.float32)
    h = hidden.to(torch.float32)
    if kind == "gated":  # inputs [h ; e]
        hidden_w, walk_w = w[:, :d], w[:, d:]
    elif kind == "rnn":  # inputs [s ; e ; h]
        walk_w, hidden_w = w[:, :-d], w[:, -d:]
    else:
        raise DSparkTrtError(f"head_features: {kind!r} has no hidden part; only 'gated' and 'rnn' heads do")
    part = h @ hidden_w.T + proj_bias.to(torch.float32)  # [B, N, r | 3r]
    return HeadFeatures(kind, part, walk_w.contiguous(), state0)  # type: ignore[arg-type]


def rnn_initial_state(
    anchor_embedding: torch.Tensor,  # [B, r] W1[a]
    anchor_hidden: torch.Tensor,  # [B, d] final-normed state of the anchor slot (bonus-anchor layout's slot 0)
    proj_weight: torch.Tensor,  # [3r, 2r + d] joint_proj
    proj_bias: torch.Tensor,  # [3r]
) -> torch.Tensor:
    """[B, r] fp32: the RNN state after the anchor slot of the bonus-anchor layout, which trains slot 0 on
    (W1[a], h_0) from a zero state; its output is never drafted, only its state update carries on."""
    B, r = anchor_embedding.shape
    z = torch.cat((torch.zeros(B, r, dtype=torch.float32, device=anchor_embedding.device),
                   anchor_embedding.to(torch.float32), anchor_hidden.to(torch.float32)), dim=-1)  # [B, 2r + d]
    gate, cand, _ = (z @ proj_weight.to(torch.float32).T + proj_bias.to(torch.float32)).chunk(3, dim=-1)
    return (1.0 - torch.sigmoid(gate)) * torch.tanh(cand)  # σ(γ)·0 + (1 − σ(γ))·tanh(c)
