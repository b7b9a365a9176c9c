"""Distillation data: sequences the target writes itself, and what the trainer needs from the target on them.

``target_sequences`` continues each prompt greedily and once at T = 1 (seeded), so the drafter learns the
target's own distribution on text like the text it will draft at run time. ``target_features`` runs the
target once over all sequences (right-padded: causal attention never looks at the padding) and keeps

    taps        [S, L, m·d] bf16   the drafter's context (outputs of ``target_layer_ids``)
    top_ids     [S, L, K]   int64  the target's K most likely next tokens at each position
    top_logp    [S, L, K]   fp32   their log-probabilities (T = 1)

which is all the loss needs (the full [S, L, V] distribution would not fit in memory).
"""

from __future__ import annotations

import logging

import torch

__all__ = ["target_sequences", "target_features", "random_prompts"]

log = logging.getLogger("dspark")


def random_prompts(vocab_size: int, num: int, length: int, *, seed: int, avoid: tuple[int, ...] = ()) -> list[list[int]]:
    """Prompts of random token ids (targets without a tokenizer, e.g. the tiny test pairs)."""
    gen = torch.Generator().manual_seed(seed)
    allowed = torch.tensor([t for t in range(vocab_size) if t not in set(avoid)])
    return allowed[torch.randint(0, len(allowed), (num, length), generator=gen)].tolist()


@torch.no_grad()
def _continue(model, prompts: list[list[int]], *, new_tokens: int, temperature: float, seed: int,
              eos: tuple[int, ...], avoid: tuple[int, ...]) -> list[list[int]]:
    """Continue every prompt (one batch, incremental decoding with the HF cache); stop a row at EOS."""
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
    out = [list(p) for p in prompts]
    done = torch.zeros(B, dtype=torch.bool)
    x, pos = ids, positions
    import inspect

    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    for _ in range(new_tokens):
        logits = model(input_ids=x, attention_mask=mask, position_ids=pos, use_cache=True,
                       **{cache_arg: cache}).logits[:, -1].to(torch.float32)  # [B, V]
        if avoid:
            logits[:, list(avoid)] = float("-inf")
        if temperature > 0:
            u = torch.rand(logits.shape, generator=gen).clamp_min(1e-20)
            nxt = (logits / temperature - torch.log(-torch.log(u))).argmax(-1)  # Gumbel-max sample
        else:
            nxt = logits.argmax(-1)
        for b in range(B):
            if not done[b]:
                out[b].append(int(nxt[b]))
                done[b] = int(nxt[b]) in eos
        if bool(done.all()):
            break
        x = nxt.view(B, 1)
        pos = pos[:, -1:] + 1
        mask = torch.cat((mask, torch.ones(B, 1, dtype=torch.int64)), dim=1)
    return out


def target_sequences(model, prompts: list[list[int]], *, new_tokens: int, seed: int, batch: int = 16,
                     eos: tuple[int, ...] = (), avoid: tuple[int, ...] = (), progress=None) -> list[list[int]]:
    """Each prompt continued greedily and at T = 1: ``2 * len(prompts)`` token lists (prompt + continuation)."""
    seqs = []
    jobs = [(0.0, s) for s in range(0, len(prompts), batch)] + [(1.0, s) for s in range(0, len(prompts), batch)]
    for temperature, start in jobs:
        seqs += _continue(model, prompts[start: start + batch], new_tokens=new_tokens, temperature=temperature,
                          seed=seed * 1000003 + start, eos=eos, avoid=avoid)
        if progress is not None:
            progress(1)
    return seqs


@torch.no_grad()
def target_features(model, sequences: list[list[int]], hf_indices: list[int], *, top: int = 32,
                    batch: int = 8, pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Run the target over ``sequences`` (right-padded to the longest); see the module docstring."""
    S = len(sequences)
    L = max(len(s) for s in sequences)
    ids = torch.full((S, L), pad_id, dtype=torch.int64)
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.int64)
    for i, s in enumerate(sequences):
        ids[i, : len(s)] = torch.tensor(s)
    taps, top_ids, top_logp = [], [], []
    for start in range(0, S, batch):
        x = ids[start: start + batch]
        out = model(input_ids=x, output_hidden_states=True)
        taps.append(torch.cat([out.hidden_states[i] for i in hf_indices], dim=-1).to(torch.bfloat16))
        logp = torch.log_softmax(out.logits.to(torch.float32), dim=-1)  # [b, L, V]
        v, i = logp.topk(top, dim=-1)
        top_ids.append(i)
        top_logp.append(v)
    return {"ids": ids, "lengths": lengths, "taps": torch.cat(taps), "top_ids": torch.cat(top_ids),
            "top_logp": torch.cat(top_logp)}
