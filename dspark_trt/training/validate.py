"""Validation while training: the simulated greedy acceptance length on held-out target text.

The validation rows are greedy continuations, written by the target, of prompts the drafter never trains on
(``prompt_bank.validation_bank``: subjects and code tasks left out of the training bank — split by prompt,
never by token). At ``anchors`` evenly spaced positions p of each continuation, a round drafts N tokens
(dense argmax over the draft vocabulary, the Markov walk fed its own previous draft) and verifies all of them
greedily: the round accepts the leading slots whose draft equals the target's greedy token, plus the
target's own token. Because the text is greedy, the walk's predecessors on the accepted prefix are the text
itself, so one teacher-forced pass (``blocks.block_logits``) gives every round exactly. The acceptance length
is the mean tokens per round (1 + accepted); the confidence head is not used (every slot is verified).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from .blocks import block_logits

__all__ = ["validation_anchors", "greedy_acceptance", "plot_curve"]

log = logging.getLogger("dspark")


def validation_anchors(lengths: torch.Tensor, starts: torch.Tensor, N: int,
                       anchors: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows [R], anchors [R, a]): ``anchors`` positions spread evenly over start … len − N of every row with
    room for a block (the same range as the training anchors)."""
    lo = starts.clamp_min(1)
    hi = lengths - N
    rows = torch.nonzero(hi >= lo).flatten()
    frac = (torch.arange(anchors, dtype=torch.float64) + 0.5) / anchors  # [a]
    span = (hi[rows] - lo[rows] + 1).to(torch.float64).view(-1, 1)
    p = lo[rows].view(-1, 1) + (frac * span).long()  # [R, a]
    return rows, torch.minimum(p, hi[rows].view(-1, 1))


@torch.no_grad()
def greedy_acceptance(drafter, data: dict, t2d: torch.Tensor, *, anchors: int = 16, chunk: int = 16) -> dict:
    """{"acceptance_length": mean tokens per round, "slots": per-slot acceptance [N], "rounds": count} of
    ``drafter`` on the stacked greedy validation rows ``data`` (module docstring)."""
    N = drafter.config.num_draft_tokens
    dev = data["ids"].device
    was_training = drafter.training
    drafter.eval()
    rows, p = validation_anchors(data["lengths"].cpu(), data["starts"].cpu(), N, anchors)
    accepted = []
    for i in range(0, len(rows), chunk):
        r, a = rows[i: i + chunk].to(dev), p[i: i + chunk].to(dev)
        blk = block_logits(drafter, data, r, a)
        draft = blk.z.argmax(-1)  # [M, N] draft ids
        label = t2d[data["top_ids"][blk.m.view(-1, 1), blk.slot_pos, 0]]  # [M, N] the target's greedy token
        accepted.append((draft == label).to(torch.int64).cumprod(-1).cpu())  # [M, N] 1 while all slots so far match
    drafter.train(was_training)
    if not accepted:
        return {"acceptance_length": float("nan"), "slots": [], "rounds": 0}
    acc = torch.cat(accepted).to(torch.float64)  # [rounds, N]
    return {"acceptance_length": float(1 + acc.sum(-1).mean()), "slots": [round(float(x), 4) for x in acc.mean(0)],
            "rounds": int(acc.shape[0])}


def plot_curve(curve: list[dict], path: Path, *, best_step: int | None = None) -> Path | None:
    """The validation curve (acceptance length per step) as a PNG; None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from ..optional import pip_install

        log.warning("matplotlib missing (%s): no validation plot", pip_install("bench"))
        return None
    from ..atomic import atomic_output_file

    fig, ax = plt.subplots(figsize=(6.4, 4))
    steps = [c["step"] for c in curve]
    ax.plot(steps, [c["acceptance_length"] for c in curve], "o-", label="acceptance length (greedy, held out)")
    slots = [c["slots"] for c in curve if c["slots"]]
    for j in range(min(3, len(slots[0]) if slots else 0)):
        ax.plot(steps, [1 + c["slots"][j] for c in curve], ":", label=f"1 + slot {j} acceptance")
    if best_step is not None:
        ax.axvline(best_step, color="grey", linestyle="--", label=f"written: step {best_step}")
    ax.set_xlabel("training step")
    ax.set_ylabel("tokens per round")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_output_file(path) as tmp:
        fig.savefig(tmp, dpi=100)
    plt.close(fig)
    return path
