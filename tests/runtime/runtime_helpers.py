"""Small helpers shared by the runtime tests (fixtures live in tests/conftest.py)."""

from __future__ import annotations

import torch


def make_decoder(pair, **target_options):
    """A CPU fp32 SpeculativeDecoder (HFTarget + torch backend) for a TinyCheckpoint pair."""
    from dspark_trt.runtime import HFTarget, SpeculativeDecoder
    from dspark_trt.runtime.drafters.torch import TorchDrafterBackend

    target = HFTarget.from_pretrained(pair.target, dtype="fp32", device="cpu", **target_options)
    backend = TorchDrafterBackend.from_pretrained(pair.drafter, target_dir=pair.target, dtype="fp32", device="cpu")
    return SpeculativeDecoder(target, backend)


def random_prompts(n: int, vocab: int, *, seed: int, min_len: int = 2, max_len: int = 12, avoid=()) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    allowed = torch.tensor([t for t in range(vocab) if t not in set(avoid)])
    out = []
    for _ in range(n):
        length = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
        out.append(allowed[torch.randint(0, len(allowed), (length,), generator=g)].tolist())
    return out
