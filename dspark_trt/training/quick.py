"""Quick distillation: train a tiny DSpark drafter in place on its target's own outputs, in seconds on the CPU.

The in-memory entry point of the training package (``dspark distill``, ``distill.py``, is the full recipe
with its text store, prompts, validation and resumable checkpoints). It builds the same teacher-forced blocks
(``blocks.block_logits``) and freezes the same shared tensors (``FROZEN``), with a small recipe of its own:

    data     sequences the target itself writes from random prompts (greedy and T = 1 samples), or from
             random slices of a corpus
    inputs   context = taps of positions 0 … p-1, block = [x_p, M, …] (the reference ``block_hidden``)
    loss     slot j, teacher-forced Markov predecessor x_{p+j}:  Z_j = U_j + s · W2 · u_j, u_j = W1[x_{p+j}]
             (vanilla) or the gated / RNN head's feature of it (``blocks.block_logits``, every head)
             cross-entropy of softmax(Z_j) against the target's own distribution for x_{p+j+1}, + the
             cross-entropy against its greedy token

A random drafter is almost never right, so losslessness against it proves little: the embedded demo pair
(``demo/``) and the tests' distilled pairs train theirs with ``distill_drafter`` so acceptance paths are really
taken. ``embed_tokens`` and ``lm_head`` stay frozen (real drafters copy them from the target). Deterministic
for a given seed on one machine.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import torch
from torch.nn import functional as F

from ..atomic import atomic_output_dir, write_marker
from ..errors import DSparkTrtError
from .blocks import FROZEN, block_logits

__all__ = ["copy_shared_from_target", "distill_drafter", "save_drafter_like", "single_thread", "target_sequences"]


@contextmanager
def single_thread():
    """Run tiny CPU training on one thread: with many small ops, a second thread mostly waits on a busy core
    (4x slower on a loaded 2-core machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@single_thread()
@torch.no_grad()
def target_sequences(model, *, num: int, length: int, prompt_len: int = 4, seed: int = 0,
                     sample_fraction: float = 0.5, avoid: tuple[int, ...] = (),
                     corpus: torch.Tensor | None = None) -> torch.Tensor:
    """[num, length] int64: prompts continued by the target (a ``1 - sample_fraction`` share greedily, the rest
    sampled at T=1). Prompts are random tokens, or random slices of ``corpus`` (1-D token ids) when given."""
    gen = torch.Generator().manual_seed(seed)
    V = int(model.config.vocab_size)
    if corpus is not None:
        starts = torch.randint(0, len(corpus) - prompt_len, (num,), generator=gen)
        seq = torch.stack([corpus[s: s + prompt_len] for s in starts.tolist()])
    else:
        allowed = torch.tensor([t for t in range(V) if t not in set(avoid)])
        seq = allowed[torch.randint(0, len(allowed), (num, prompt_len), generator=gen)]
    sample = torch.arange(num) >= int(round(num * (1 - sample_fraction)))  # [num] which rows sample
    for _ in range(length - prompt_len):
        logits = model(input_ids=seq).logits[:, -1].to(torch.float32)  # [num, V]; tiny: no cache needed
        if avoid:
            logits[:, list(avoid)] = float("-inf")
        greedy = logits.argmax(-1)
        u = torch.rand(logits.shape, generator=gen).clamp_min(1e-20)
        sampled = (logits - torch.log(-torch.log(u))).argmax(-1)
        seq = torch.cat((seq, torch.where(sample, sampled, greedy).view(-1, 1)), dim=1)
    return seq


@single_thread()
def distill_drafter(drafter, target_model, *, steps: int = 200, num_sequences: int = 48, length: int = 40,
                    batch: int = 12, anchors: int = 8, lr: float = 3e-3, hard_weight: float = 1.0, seed: int = 0,
                    sequences: torch.Tensor | None = None, corpus: torch.Tensor | None = None,
                    progress: Callable[[], object] | None = None) -> dict:
    """Train ``drafter`` (a reference ``DSparkDrafter``, fp32, CPU) in place on its target's own outputs.

    Returns ``{"loss_first": ..., "loss_last": ...}`` (mean cross-entropy of the first / last 10 steps).
    ``progress`` is called after every step.
    """
    c = drafter.config
    N = c.num_draft_tokens
    if length < N + 3:
        raise DSparkTrtError(f"distillation sequences of length {length} are too short for {N} draft tokens")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed + 7)
    copy_shared_from_target(drafter, target_model)
    if sequences is None:
        sequences = target_sequences(target_model, num=num_sequences, length=length, seed=seed,
                                     avoid=(c.mask_token_id,), corpus=corpus, prompt_len=8 if corpus is not None else 4)
    S, L = sequences.shape
    hs_idx = c.hf_hidden_state_indices
    with torch.no_grad():
        out = target_model(input_ids=sequences, output_hidden_states=True)
        taps = torch.cat([out.hidden_states[i] for i in hs_idx], dim=-1).to(torch.float32)  # [S, L, m·d]
        target_logp = torch.log_softmax(out.logits.to(torch.float32), dim=-1)  # [S, L, V]
    draft_ids = torch.arange(c.draft_vocab_size) + (drafter.d2t if c.has_reduced_vocab else 0)  # [V_d] target ids
    soft = torch.softmax(target_logp[..., draft_ids], dim=-1)  # [S, L, V_d] renormalised on the draft vocab

    params = [p for n, p in drafter.named_parameters() if n not in FROZEN]
    for n, p in drafter.named_parameters():
        p.requires_grad_(n not in FROZEN)
    opt = torch.optim.Adam(params, lr=lr)
    data = {"ids": sequences, "taps": taps}  # [S, L], [S, L, m·d]: what ``block_logits`` reads
    losses = []
    drafter.train()
    try:
        for _ in range(steps):
            rows = torch.randint(0, S, (batch,), generator=gen)  # [b]
            p = torch.randint(1, L - N, (batch, anchors), generator=gen)  # [b, a] anchor positions
            blk = block_logits(drafter, data, rows, p)  # z [M, N, V_d]: base + teacher-forced Markov bias
            labels = soft[blk.m.view(-1, 1), blk.slot_pos]  # [M, N, V_d] target's distribution for x_{p+j+1}
            logq = F.log_softmax(blk.z, dim=-1)
            loss = -(labels * logq).sum(-1).mean()  # soft: match the target's distribution (T = 1)
            if hard_weight:
                loss = loss + hard_weight * F.nll_loss(logq.flatten(0, 1), labels.argmax(-1).flatten())  # greedy
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            if progress is not None:
                progress()
    finally:
        drafter.eval().requires_grad_(False)
    head = losses[: min(10, len(losses))] or [0.0]
    tail = losses[-min(10, len(losses)):] or [0.0]
    return {"loss_first": sum(head) / len(head), "loss_last": sum(tail) / len(tail)}


@torch.no_grad()
def copy_shared_from_target(drafter, target_model) -> None:
    """Set the drafter's ``embed_tokens`` / ``lm_head`` to the target's (rows ``d2t``-mapped), as real drafters."""
    draft_ids = torch.arange(drafter.config.draft_vocab_size) + drafter.d2t.cpu()  # [V_d] target ids
    emb = target_model.get_input_embeddings().weight
    head = target_model.get_output_embeddings().weight
    drafter.embed_tokens.weight.copy_(emb.to(drafter.embed_tokens.weight))
    drafter.lm_head.weight.copy_(head[draft_ids].to(drafter.lm_head.weight))


def save_drafter_like(drafter, source_dir: str | Path, out_dir: str | Path, *, force: bool = False) -> Path:
    """Write ``drafter``'s weights with the tensor names, dtypes and config of the checkpoint at ``source_dir``
    (single-file safetensors), atomically."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    source_dir = Path(source_dir)
    source = source_dir / "model.safetensors"
    if not source.is_file():
        raise DSparkTrtError(f"expected a single-file checkpoint at {source}")
    state = drafter.state_dict()
    with safe_open(str(source), framework="pt") as f:
        tensors = {n: (state[n].to(f.get_tensor(n).dtype) if n in state else f.get_tensor(n)) for n in f.keys()}
    with atomic_output_dir(out_dir, force=force) as tmp:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "model.safetensors"),
                  metadata={"format": "pt"})
        (tmp / "config.json").write_text((source_dir / "config.json").read_text())
        write_marker(tmp, "save_drafter_like", source=str(source_dir))
    return Path(out_dir)
