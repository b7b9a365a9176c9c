"""Distil a DSpark drafter for a Hugging Face target on the CPU (DeepSpec's recipe at small scale).

  dspark distill --target OUT/target -o OUT/drafter --minutes 30
  dspark distill --target TARGET -o DRAFTER --steps 400 --seed 1 --layers 1 --markov-rank 64
  dspark distill --target OUT/target -o MORE --init-from OUT/drafter --bank-prompts 2000 --minutes 40

The target writes its own training text (greedy and T = 1 continuations of the prompts in
dspark_trt/training/prompts.py); the drafter learns block prediction from its taps. Deterministic for a
seed and a step count; rerunning after an interruption resumes from the last checkpoint.
"""

from __future__ import annotations

import argparse

STATUS_LINE = True


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, metavar="DIR", help="Hugging Face causal-LM directory")
    p.add_argument("-o", "--out", required=True, metavar="DRAFTER", help="output drafter directory (DeepSeek format)")
    p.add_argument("--minutes", type=float, default=None, help="training budget (sets the step count)")
    p.add_argument("--steps", type=int, default=None, help="exact training steps (default 300 without --minutes)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=None, help="drafter decoder layers (default 1)")
    p.add_argument("--block-size", type=int, default=None, help="draft slots N (default 7)")
    p.add_argument("--markov-rank", type=int, default=None, help="Markov head rank (default 64)")
    p.add_argument("--taps", default=None, metavar="I,J,K", help="target layer ids (DeepSeek convention)")
    p.add_argument("--draft-vocab", type=int, default=None, help="draft vocabulary size (default: the target's)")
    p.add_argument("--new-tokens", type=int, default=128, help="tokens the target writes per prompt")
    p.add_argument("--bank-prompts", type=int, default=0, metavar="N",
                   help="also continue N prompts of the prompt bank (dspark_trt/training/prompt_bank.py; default 0)")
    p.add_argument("--position-decay", type=float, default=4.0, metavar="G",
                   help="slot j's loss weight is exp(-j / G) (default 4; smaller favours the first slots)")
    p.add_argument("--init-from", default=None, metavar="DRAFTER",
                   help="start from this drafter's weights, shape and draft vocabulary (e.g. to train it on more text)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--force", action="store_true", help="replace an existing drafter")


def run(args: argparse.Namespace) -> int:
    from ..errors import DSparkTrtError
    from ..training import DistillSettings, distill

    if args.minutes is not None and args.steps is not None:
        raise DSparkTrtError("pass --minutes or --steps, not both")
    if args.bank_prompts < 0:
        raise DSparkTrtError(f"--bank-prompts {args.bank_prompts}: use N >= 0 (0 = only the built-in prompts)")
    if not args.position_decay > 0:
        raise DSparkTrtError(f"--position-decay {args.position_decay}: use G > 0 (slot j weighs exp(-j / G))")
    settings = DistillSettings(steps=args.steps, minutes=args.minutes, seed=args.seed, new_tokens=args.new_tokens,
                               threads=args.threads, bank_prompts=args.bank_prompts,
                               position_decay=args.position_decay, init_from=args.init_from)
    shape = _shape(args)
    out = distill(args.target, args.out, shape=shape, settings=settings, force=args.force)
    print(f"drafter {out}")
    return 0


SHAPE_OPTIONS = {"layers": "--layers", "block_size": "--block-size", "markov_rank": "--markov-rank", "taps": "--taps",
                 "draft_vocab": "--draft-vocab"}


def _shape(args: argparse.Namespace):
    """The drafter's shape: from the options, or from ``--init-from``'s config (then no shape option is allowed)."""
    from ..config import DSparkConfig
    from ..errors import DSparkTrtError
    from ..training import DrafterShape
    from ..training.drafter_init import shape_of

    given = [flag for name, flag in SHAPE_OPTIONS.items() if getattr(args, name) is not None]
    if args.init_from is not None:
        if given:
            raise DSparkTrtError(f"{', '.join(given)} with --init-from: the drafter's shape comes from --init-from "
                                 f"{args.init_from}; drop {given[0]}")
        return shape_of(DSparkConfig.from_pretrained(args.init_from))
    taps = None
    if args.taps:
        try:
            taps = tuple(int(t) for t in args.taps.replace(",", " ").split())
        except ValueError:
            raise DSparkTrtError(f"--taps {args.taps!r}: expected layer ids like 2,15,28") from None
    chosen = {"num_layers": args.layers, "markov_rank": args.markov_rank, "block_size": args.block_size}
    return DrafterShape(target_layer_ids=taps, draft_vocab_size=args.draft_vocab,
                        **{k: v for k, v in chosen.items() if v is not None})
