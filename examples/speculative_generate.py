"""Speculative decoding on a tiny random pair: the output equals the target's own greedy continuation.

Run: python examples/speculative_generate.py [OUT_DIR]
"""

from __future__ import annotations

import sys

from dspark_trt.runtime import SpeculativeDecoder
from dspark_trt.synthetic import write_tiny_checkpoint


def main(out_dir: str = "out/example-generate") -> None:
    drafter_dir, target_dir = write_tiny_checkpoint(out_dir, force=True)
    decoder = SpeculativeDecoder.from_pretrained(drafter_dir, target_dir, device="cpu")
    prompts = [[11, 12, 13, 14], [7, 8]]  # two requests of different lengths
    spec = decoder.generate(prompts, max_new_tokens=24, topk=512)
    alone = decoder.generate(prompts, max_new_tokens=24, draft=False)
    print("tokens:", spec.tokens)
    print("identical to the target alone:", spec.tokens == alone.tokens)
    print(f"mean acceptance length: {spec.stats.mean_acceptance_length:.2f} (a random drafter is rarely right)")


if __name__ == "__main__":
    main(*sys.argv[1:])
