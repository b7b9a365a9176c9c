"""Write OUT_DIR/drafter (a random DSpark drafter) and OUT_DIR/target (a matching tiny Hugging Face model).

Deterministic for a given --seed; the whole pipeline runs on the pair offline.
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out_dir", metavar="OUT_DIR", help="directory to create (refused if non-empty unless --force)")
    p.add_argument("--format", choices=("deepseek", "speculators"), default=None, help="drafter layout (default deepseek)")
    p.add_argument("--target-family", choices=("qwen3", "qwen2", "llama"), default=None,
                   help="target architecture (default qwen3)")
    p.add_argument("--vocab-size", type=int, default=None)
    p.add_argument("--draft-vocab-size", type=int, default=None, help="reduced draft vocabulary (writes d2t)")
    p.add_argument("--hidden-size", type=int, default=None)
    p.add_argument("--markov-rank", type=int, default=None)
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--num-layers", type=int, default=None, help="drafter decoder layers")
    p.add_argument("--num-target-layers", type=int, default=None)
    p.add_argument("--bonus-anchor", action="store_true", help="bonus-anchor layout (sample_from_anchor=false)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--force", action="store_true", help="replace a non-empty OUT_DIR")


def run(args: argparse.Namespace) -> int:
    from ..synthetic import write_tiny_checkpoint

    options = {
        "vocab_size": args.vocab_size,
        "draft_vocab_size": args.draft_vocab_size,
        "hidden_size": args.hidden_size,
        "markov_rank": args.markov_rank,
        "block_size": args.block_size,
        "num_layers": args.num_layers,
        "num_target_layers": args.num_target_layers,
        "format": args.format,
        "target_family": args.target_family,
        "seed": args.seed,
    }
    options = {k: v for k, v in options.items() if v is not None}  # library defaults stay the single source
    if args.bonus_anchor:
        options["sample_from_anchor"] = False
    paths = write_tiny_checkpoint(args.out_dir, force=args.force, **options)
    print(f"drafter: {paths.drafter}\ntarget:  {paths.target}")
    return 0
