"""Distillation data: sequences the target writes itself, and what the trainer needs from the target on them.

``target_sequences`` continues each prompt greedily and once at T = 1 (seeded), so the drafter learns the
target's own distribution on text like the text it will draft at run time. The same forward passes that
write the text keep, per position (``stack_rows`` right-pads them)

    taps        [S, L, m·d] bf16   the drafter's context (outputs of ``target_layer_ids``)
    top_ids     [S, L, K]   int64  the target's K most likely next tokens at each position
    top_logp    [S, L, K]   fp32   their log-probabilities (T = 1)
    starts      [S]         int64  the prompt's last position (training anchors start there)

which is all the loss needs (the full [S, L, V] distribution would not fit in memory).
"""

from __future__ import annotations

import logging

import torch

__all__ = ["target_sequences", "stack_rows", "random_prompts"]

log = logging.getLogger("dspark")


def random_prompts(vocab_size: int, num: int, length: int, *, seed: int, avoid: tuple[int, ...] = ()) -> list[list[int]]:
    """Prompts of random token ids (targets without a tokenizer, e.g. the tiny test pairs)."""
    gen = torch.Generator().manual_seed(seed)
    allowed = torch.tensor([t for t in range(vocab_size) if t not in set(avoid)])
    return allowed[torch.randint(0, len(allowed), (num, length), generator=gen)].tolist()


@torch.no_grad()
def _continue(model, prompts: list[list[int]], *, new_tokens: int, temperature: float, seed: int,
              eos: tuple[int, ...], avoid: tuple[int, ...], hf_indices: list[int] | None = None,
              top: int = 32) -> list[dict]:
    """Continue every prompt (one batch, incremental decoding with the HF cache); stop a row at EOS.

    Returns per prompt ``{"ids": [T] int64, "taps": [T, m·d] bf16, "top_ids": [T, K], "top_logp": [T, K]}``:
    the features come from the same forward passes that wrote the text (no second pass); the last token
    written is dropped (nothing was computed on it).
    """
    import inspect

    from transformers import DynamicCache

    B = len(prompts)
    T = max(len(p) for p in prompts)
    ids = torch.zeros(B, T, dtype=torch.int64)
    mask = torch.zeros(B, T, dtype=torch.int64)
    for b, p in enumerate(prompts):  # left-padded
        ids[b, T - len(p):] = torch.tensor(p)
        mask[b, T - len(p):] = 1
    gen = torch.Generator().manual_seed(seed)
    cache = DynamicCache()
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    rows = [{"ids": list(p), "start": len(p) - 1, "taps": [], "top_ids": [], "top_logp": []} for p in prompts]
    done = torch.zeros(B, dtype=torch.bool)
    x, pos = ids, positions
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    for step in range(new_tokens):
        out = model(input_ids=x, attention_mask=mask, position_ids=pos, use_cache=True,
                    output_hidden_states=hf_indices is not None, **{cache_arg: cache})
        all_logits = out.logits.to(torch.float32)  # [B, q, V]
        if hf_indices is not None:
            taps = torch.cat([out.hidden_states[i] for i in hf_indices], dim=-1).to(torch.bfloat16)  # [B, q, m·d]
            tv, ti = torch.log_softmax(all_logits, dim=-1).topk(top, dim=-1)  # [B, q, K]
            for b in range(B):
                if step == 0:
                    n = len(prompts[b])
                    rows[b]["taps"].append(taps[b, T - n:])
                    rows[b]["top_ids"].append(ti[b, T - n:])
                    rows[b]["top_logp"].append(tv[b, T - n:])
                elif not done_before[b]:
                    rows[b]["taps"].append(taps[b])
                    rows[b]["top_ids"].append(ti[b])
                    rows[b]["top_logp"].append(tv[b])
        logits = all_logits[:, -1]  # [B, V]
        if avoid:
            logits[:, list(avoid)] = float("-inf")
        if temperature > 0:
            u = torch.rand(logits.shape, generator=gen).clamp_min(1e-20)
            nxt = (logits / temperature - torch.log(-torch.log(u))).argmax(-1)  # Gumbel-max sample
        else:
            nxt = logits.argmax(-1)
        done_before = done.clone()
        for b in range(B):
            if not done[b]:
                rows[b]["ids"].append(int(nxt[b]))
                done[b] = int(nxt[b]) in eos
        if bool(done.all()):
            break
        x = nxt.view(B, 1)
        pos = pos[:, -1:] + 1
        mask = torch.cat((mask, torch.ones(B, 1, dtype=torch.int64)), dim=1)
    for r in rows:
        if hf_indices is not None:
            for k in ("taps", "top_ids", "top_logp"):
                r[k] = torch.cat(r[k])
            r["ids"] = r["ids"][: len(r["taps"])]
    return rows


def target_sequences(model, prompts: list[list[int]], *, new_tokens: int, seed: int, batch: int = 16,
                     eos: tuple[int, ...] = (), avoid: tuple[int, ...] = (), progress=None,
                     hf_indices: list[int] | None = None, top: int = 32) -> list[dict]:
    """Each prompt continued greedily and at T = 1: ``2 * len(prompts)`` rows (see ``_continue``)."""
    seqs = []
    jobs = [(0.0, s) for s in range(0, len(prompts), batch)] + [(1.0, s) for s in range(0, len(prompts), batch)]
    for temperature, start in jobs:
        seqs += _continue(model, prompts[start: start + batch], new_tokens=new_tokens, temperature=temperature,
                          seed=seed * 1000003 + start, eos=eos, avoid=avoid, hf_indices=hf_indices, top=top)
        if progress is not None:
            progress(1)
    return seqs


def stack_rows(rows: list[dict], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Right-pad the rows of ``target_sequences`` into the trainer's tensors (module docstring)."""
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
