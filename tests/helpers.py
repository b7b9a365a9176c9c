"""Small shared test utilities: random Markov-walk cases, tie-robust top-k comparisons, truncated sampling."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class WalkCase:
    base: torch.Tensor  # [B, N, V_d] fp32 base logits (already × scale)
    anchor: torch.Tensor  # [B] int64 target ids
    w1: torch.Tensor  # [V, r]
    w2: torch.Tensor  # [V_d, r]
    d2t: torch.Tensor | None  # [V_d] int64 offsets, None when V_d = V
    temperature: torch.Tensor  # [B] fp32, mixed greedy / sampling
    seed: torch.Tensor  # [B] int64
    positions: torch.Tensor  # [B] int64
    conf_base: torch.Tensor  # [B, N] fp32
    conf_w: torch.Tensor  # [r] fp32
    scale: float

    def kwargs(self, sampling: bool = True) -> dict:
        out = dict(logit_scale=self.scale, d2t=self.d2t, conf_base=self.conf_base, conf_w_markov=self.conf_w)
        if sampling:
            out.update(temperature=self.temperature, seed=self.seed, positions=self.positions)
        return out


def walk_case(B=3, N=7, V=257, Vd=None, r=8, *, seed=0, scale=0.5, dtype=torch.float32) -> WalkCase:
    gen = torch.Generator().manual_seed(seed)
    Vd = Vd or V
    d2t = None
    if Vd < V:
        ids = torch.randperm(V, generator=gen)[:Vd].sort().values
        d2t = ids - torch.arange(Vd)
    temperature = torch.tensor([0.0, 0.7, 1.3, 1.0, 0.0][:B] + [1.0] * max(0, B - 5))
    return WalkCase(
        base=(2.0 * torch.randn(B, N, Vd, generator=gen)).to(dtype),
        anchor=torch.randint(0, V, (B,), generator=gen),
        w1=(0.5 * torch.randn(V, r, generator=gen)).to(dtype),
        w2=(0.5 * torch.randn(Vd, r, generator=gen)).to(dtype),
        d2t=d2t,
        temperature=temperature,
        seed=torch.randint(0, 2**31 - 1, (B,), generator=gen),
        positions=torch.randint(1, 5000, (B,), generator=gen),
        conf_base=torch.randn(B, N, generator=gen),
        conf_w=0.1 * torch.randn(r, generator=gen),
        scale=scale,
    )


def scatter_dense(cand_ids: torch.Tensor, cand_logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B, N, k] candidates → dense rows [B, N, vocab] filled with −inf outside the candidates."""
    out = torch.full((*cand_ids.shape[:-1], vocab), float("-inf"), dtype=cand_logits.dtype)
    return out.scatter(-1, cand_ids.to(torch.int64), cand_logits)


def index_overlap(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean fraction of shared ids between two [..., k] index sets (order ignored)."""
    a2, b2 = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    shared = [len(set(x.tolist()) & set(y.tolist())) / a.shape[-1] for x, y in zip(a2, b2)]
    return sum(shared) / len(shared)


def sigint_as_in_a_terminal() -> None:
    """``preexec_fn`` for a child that a test interrupts with SIGINT (Ctrl-C): a shell starts background jobs with
    SIGINT ignored, and a Python started that way never raises KeyboardInterrupt; a terminal's foreground
    command has the default disposition, which this restores in the child."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def truncated_support_ref(z: list[float], k: int, p: float) -> set[int]:
    """Brute-force reading of the definition in sampling.py: the kept token ids of one row (float64)."""
    import math

    order = sorted(range(len(z)), key=lambda v: -z[v])
    tau_k = z[order[k - 1]] if 0 < k < len(z) else -math.inf
    head = order[:k] if 0 < k < len(z) else order
    tau_p = -math.inf
    if p < 1:
        top = max(z[v] for v in head)
        weights = [math.exp(z[v] - top) for v in head]
        total, mass = sum(weights), 0.0
        for v, w in zip(head, weights):
            mass += w / total
            tau_p = z[v]
            if mass >= p:
                break
    return {v for v in range(len(z)) if z[v] >= max(tau_k, tau_p)}


def truncate_probs(probs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """[..., V] fp64 probabilities at temperature T → the truncated, renormalised ones (``truncated_support_ref``)."""
    flat = probs.reshape(-1, probs.shape[-1]).double()
    out = torch.zeros_like(flat)
    for row in range(flat.shape[0]):
        kept = sorted(truncated_support_ref(flat[row].log().tolist(), top_k, top_p))
        out[row, kept] = flat[row, kept] / flat[row, kept].sum()
    return out.view(probs.shape)
