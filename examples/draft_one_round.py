"""One DSpark draft round on a tiny random checkpoint: dense vs top-k Markov walk.

Run: python examples/draft_one_round.py [OUT_DIR]
"""

from __future__ import annotations

import sys

import torch

from dspark_trt import load_drafter
from dspark_trt.synthetic import write_tiny_checkpoint


def main(out_dir: str = "out/example") -> None:
    drafter_dir, target_dir = write_tiny_checkpoint(out_dir, force=True)
    drafter = load_drafter(drafter_dir, target_dir=target_dir)
    c = drafter.config
    gen = torch.Generator().manual_seed(0)
    taps = torch.randn(2, 6, c.num_taps * c.hidden_size, generator=gen)  # [B, T, m·d] target taps
    k, v = drafter.context_kv(taps, torch.arange(6).expand(2, 6))  # [L, B, T, H_kv, D]
    anchor, ctx_len = torch.tensor([11, 12]), torch.tensor([6, 4])  # request 1 uses only 4 context tokens
    dense = drafter.draft(anchor, k, v, ctx_len, topk=None)
    top = drafter.draft(anchor, k, v, ctx_len, topk=512)
    print("dense  tokens:", dense.tokens.tolist())
    print("top-k  tokens:", top.tokens.tolist())
    print("confidence:   ", [[round(x, 3) for x in row] for row in top.confidence.tolist()])


if __name__ == "__main__":
    main(*sys.argv[1:])
