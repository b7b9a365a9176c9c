"""Distillation data: sequences the target writes itself, and what the trainer needs from the target on them.

``write_rows`` continues each job's prompt — greedily, or sampled like a served request
(``training/sampling.py``: T, top-p, top-k, noise keyed by the row's seed) — batched on the target's device.
The same forward passes that write the text keep, per position (``stack_rows`` right-pads the rows)

    taps        [S, L, m·d] bf16   the drafter's context (outputs of ``target_layer_ids``)
    top_ids     [S, L, K]   int64  the target's K most likely next tokens at each position
    top_logp    [S, L, K]   fp32   their log-probabilities (T = 1)
    starts      [S]         int64  the prompt's last position (training anchors start there)

which is all the loss needs (the full [S, L, V] distribution would not fit in memory).
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import torch

from .sampling import WritingSettings, next_tokens

__all__ = ["Job", "write_rows", "stack_rows", "random_prompts"]

log = logging.getLogger("dspark")


class Job(NamedTuple):
    """One row to write: the prompt's ids, greedy or sampled, and the sampled row's noise seed."""

    prompt: tuple[int, ...]
    greedy: bool
    seed: int = 0


def random_prompts(vocab_size: int, num: int, length: int, *, seed: int, avoid: tuple[int, ...] = ()) -> list[list[int]]:
    """Prompts of random token ids (targets without a tokenizer, e.g. the tiny test pairs)."""
    gen = torch.Generator().manual_seed(seed)
    allowed = torch.tensor([t for t in range(vocab_size) if t not in set(avoid)])
    return allowed[torch.randint(0, len(allowed), (num, length), generator=gen)].tolist()


@torch.no_grad()
def _continue(model, jobs: list[Job], *, new_tokens: int, sampling: WritingSettings, eos: tuple[int, ...],
              avoid: tuple[int, ...], hf_indices: list[int], top: int) -> list[dict]:
    """Continue every job's prompt (one batch, incremental decoding with the HF cache, on the model's device);
    stop a row at EOS.

    Returns per job ``{"ids": [T] int64, "start", "taps": [T, m·d] bf16, "top_ids": [T, K], "top_logp": [T, K]}``
    on the CPU: the features come from the same forward passes that wrote the text (no second pass); the last
    token written is dropped (nothing was computed on it).
    """
    import inspect

    from transformers import DynamicCache

    dev = next(model.parameters()).device
    B = len(jobs)
    lens = torch.tensor([len(j.prompt) for j in jobs])  # [B]
    P = int(lens.max())
    ids = torch.zeros(B, P, dtype=torch.int64)
    mask = torch.zeros(B, P, dtype=torch.int64)
    for b, j in enumerate(jobs):  # left-padded
        ids[b, P - len(j.prompt):] = torch.tensor(j.prompt)
        mask[b, P - len(j.prompt):] = 1
    ids, mask = ids.to(dev), mask.to(dev)
    greedy = torch.tensor([j.greedy for j in jobs], device=dev)  # [B] bool
    seeds = torch.tensor([j.seed for j in jobs], dtype=torch.int64, device=dev)  # [B]
    eos_t = torch.tensor(list(eos) or [-1], device=dev)
    written = torch.zeros(B, P + new_tokens, dtype=torch.int64, device=dev)  # [B, P+n] prompt then text
    written[:, :P] = ids
    taps_buf = top_ids = top_logp = None  # [B, P+n, …] features per buffer position, allocated on first use
    count = torch.zeros(B, dtype=torch.int64, device=dev)  # [B] tokens written per row
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    positions = (mask.cumsum(-1) - 1).clamp_min(0)  # [B, P]
    cache = DynamicCache()
    x, pos = ids, positions
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    for step in range(new_tokens):
        out = model(input_ids=x, attention_mask=mask, position_ids=pos, use_cache=True, output_hidden_states=True,
                    **{cache_arg: cache})
        all_logits = out.logits.to(torch.float32)  # [B, q, V]
        taps = torch.cat([out.hidden_states[i] for i in hf_indices], dim=-1).to(torch.bfloat16)  # [B, q, m·d]
        tv, ti = torch.log_softmax(all_logits, dim=-1).topk(top, dim=-1)  # [B, q, K]
        if taps_buf is None:
            taps_buf = torch.zeros(B, P + new_tokens, taps.shape[-1], dtype=torch.bfloat16, device=dev)
            top_ids = torch.zeros(B, P + new_tokens, top, dtype=torch.int64, device=dev)
            top_logp = torch.zeros(B, P + new_tokens, top, dtype=torch.float32, device=dev)
        at = slice(0, P) if step == 0 else slice(P + step - 1, P + step)  # buffer positions of this pass
        taps_buf[:, at], top_ids[:, at], top_logp[:, at] = taps, ti, tv
        logits = all_logits[:, -1]  # [B, V]
        if avoid:
            logits[:, list(avoid)] = float("-inf")
        nxt = next_tokens(logits, greedy, seeds, lens.to(dev) + step, sampling)  # [B] position of the new token
        written[:, P + step] = nxt
        count += (~done).to(torch.int64)
        done |= torch.isin(nxt, eos_t)
        if bool(done.all()):
            break
        x = nxt.view(B, 1)
        pos = pos[:, -1:] + 1
        mask = torch.cat((mask, torch.ones(B, 1, dtype=torch.int64, device=dev)), dim=1)
    written, taps_buf, top_ids, top_logp = (t.cpu() for t in (written, taps_buf, top_ids, top_logp))
    rows = []
    for b, n in enumerate(lens.tolist()):
        keep = slice(P - n, P + int(count[b]) - 1)  # the prompt and the text, less the last token written
        rows.append({"ids": written[b, keep].tolist(), "start": n - 1, "taps": taps_buf[b, keep].clone(),
                     "top_ids": top_ids[b, keep].clone(), "top_logp": top_logp[b, keep].clone()})
    return rows


def write_rows(model, jobs: list[Job], *, new_tokens: int, sampling: WritingSettings = WritingSettings(),
               batch: int = 16, eos: tuple[int, ...] = (), avoid: tuple[int, ...] = (), hf_indices: list[int],
               top: int = 32, progress=None, on_batch=None) -> list[dict]:
    """The rows of ``jobs`` (see ``_continue``), ``batch`` jobs at a time; ``on_batch(jobs, rows)`` sees each
    batch as it is written (the store keeps it), ``progress(1)`` is called after each."""
    out = []
    for start in range(0, len(jobs), batch):
        chunk = jobs[start: start + batch]
        rows = _continue(model, chunk, new_tokens=new_tokens, sampling=sampling, eos=eos, avoid=avoid,
                         hf_indices=hf_indices, top=top)
        if on_batch is not None:
            on_batch(chunk, rows)
        out += rows
        if progress is not None:
            progress(1)
    return out


def stack_rows(rows: list[dict], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Right-pad rows of ``write_rows`` into the trainer's tensors (module docstring)."""
    S = len(rows)
    L = max(len(r["ids"]) for r in rows)
    K = rows[0]["top_ids"].shape[-1]
    W = rows[0]["taps"].shape[-1]
    ids = torch.full((S, L), pad_id, dtype=torch.int64)
    taps = torch.zeros(S, L, W, dtype=torch.bfloat16)
    top_ids = torch.zeros(S, L, K, dtype=torch.int64)
    top_logp = torch.full((S, L, K), float("-inf"))
    for i, r in enumerate(rows):
        n = len(r["ids"])
        ids[i, :n] = torch.tensor(r["ids"])
        taps[i, :n] = r["taps"]
        top_ids[i, :n] = r["top_ids"]
        top_logp[i, :n] = r["top_logp"]
    return {"ids": ids, "lengths": torch.tensor([len(r["ids"]) for r in rows]), "taps": taps, "top_ids": top_ids,
            "top_logp": top_logp, "starts": torch.tensor([r.get("start", 1) for r in rows])}
