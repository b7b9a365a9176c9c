"""Distil a DSpark drafter for a Hugging Face target on the CPU or a GPU (DeepSpec's recipe at small scale).

  dspark distill --target OUT/target -o OUT/drafter --minutes 30
  dspark distill --target TARGET -o DRAFTER --steps 400 --seed 1 --layers 1 --markov-rank 64 --context-window 0
  dspark distill --target OUT/target -o OUT/drafter-rnn --markov-head-type rnn --minutes 30
  dspark distill --target OUT/target -o MORE --init-from OUT/drafter --bank-prompts 2000 --minutes 40
  dspark distill --target OUT/target -o OUT/drafter-gpu --device cuda      # the GPU preset (≤ 8 min on an H200)

The target writes its own training text (one continuation per prompt of dspark_trt/training/prompts.py and
the prompt bank: greedy, or sampled at T 0.7 / top-p 0.8 / top-k 20), kept in a text store (--data, default
DRAFTER/../dspark-text) that later runs reuse and append to; the drafter learns block prediction from its
taps, validated on held-out prompts every --val-every steps (the best step is written). Deterministic for a
seed, a step count and the text; rerunning after an interruption resumes from the last checkpoint.
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
    p.add_argument("--markov-head-type", choices=("vanilla", "gated", "rnn"), default=None,
                   help="Markov head: vanilla (W2·W1[prev]), gated or rnn (they also read the slot's hidden state; "
                        "docs/dspark.md §5; default vanilla)")
    p.add_argument("--context-window", type=int, default=None, metavar="W",
                   help="context rows each draft layer reads, the last W (default 256; 0 = the whole context)")
    p.add_argument("--taps", default=None, metavar="I,J,K", help="target layer ids (DeepSeek convention)")
    p.add_argument("--draft-vocab", type=int, default=None, help="draft vocabulary size (default: the target's)")
    p.add_argument("--new-tokens", type=int, default=None, help="tokens the target writes per prompt (default 128)")
    p.add_argument("--bank-prompts", type=int, default=None, metavar="N",
                   help="also continue N prompts of the prompt bank (dspark_trt/training/prompt_bank.py; default 0)")
    p.add_argument("--data", default=None, metavar="DIR",
                   help="the text store, shared between runs (default: dspark-text beside the drafter's directory)")
    p.add_argument("--temperature", type=float, default=None, help="sampled continuations' temperature (default 0.7)")
    p.add_argument("--top-p", type=float, default=None, help="sampled continuations' top-p (default 0.8; 1 = off)")
    p.add_argument("--top-k", type=int, default=None, help="sampled continuations' top-k (default 20; 0 = off)")
    p.add_argument("--greedy-share", type=float, default=None, metavar="F",
                   help="share of the prompts continued greedily, the rest sampled (default 0.5)")
    p.add_argument("--val-every", type=int, default=None, metavar="STEPS",
                   help="validate every STEPS steps on held-out prompts (default 200; 0 = never)")
    p.add_argument("--val-prompts", type=int, default=None, metavar="N",
                   help="held-out validation prompts (default 48; 0 = no validation, the last step is written)")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default 1e-3)")
    p.add_argument("--data-batch", type=int, default=None, metavar="B",
                   help="prompts the target continues at once (default 64; the GPU preset 512)")
    p.add_argument("--device", default="cpu", help="where the target writes and the drafter trains (cpu, cuda, cuda:1)")
    p.add_argument("--preset", choices=("cpu", "gpu"), default=None,
                   help="budget numbers (default: gpu with a cuda --device, else cpu); explicit options override them")
    p.add_argument("--position-decay", type=float, default=4.0, metavar="G",
                   help="slot j's loss weight is exp(-j / G) (default 4; smaller favours the first slots)")
    p.add_argument("--init-from", default=None, metavar="DRAFTER",
                   help="start from this drafter's weights, shape and draft vocabulary (e.g. to train it on more text)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--force", action="store_true", help="replace an existing drafter")


#: option → setting (the options a preset may fill when not given)
SETTING_OPTIONS = {"minutes": "minutes", "steps": "steps", "seed": "seed", "new_tokens": "new_tokens",
                   "bank_prompts": "bank_prompts", "threads": "threads", "position_decay": "position_decay",
                   "init_from": "init_from", "data": "data_dir", "temperature": "temperature", "top_p": "top_p",
                   "top_k": "top_k", "greedy_share": "greedy_share", "val_every": "val_every",
                   "val_prompts": "val_prompts", "lr": "lr", "data_batch": "data_batch", "device": "device"}


def settings_from_args(args: argparse.Namespace):
    """``DistillSettings``: the defaults, then the preset (``--preset``, or gpu for a cuda ``--device``), then the
    options given. ``--steps`` replaces a preset's ``--minutes``."""
    from ..errors import DSparkTrtError
    from ..training import DistillSettings
    from ..training.presets import PRESETS

    if args.minutes is not None and args.steps is not None:
        raise DSparkTrtError("pass --minutes or --steps, not both")
    if args.bank_prompts is not None and args.bank_prompts < 0:
        raise DSparkTrtError(f"--bank-prompts {args.bank_prompts}: use N >= 0 (0 = only the built-in prompts)")
    if not args.position_decay > 0:
        raise DSparkTrtError(f"--position-decay {args.position_decay}: use G > 0 (slot j weighs exp(-j / G))")
    preset = args.preset or ("gpu" if str(args.device).startswith("cuda") else "cpu")
    values = dict(PRESETS[preset])
    given = {name: getattr(args, opt) for opt, name in SETTING_OPTIONS.items() if getattr(args, opt, None) is not None}
    if "steps" in given:
        values.pop("minutes", None)
    return DistillSettings(**{**values, **given})


def run(args: argparse.Namespace) -> int:
    from ..training import distill

    settings = settings_from_args(args)
    shape = _shape(args)
    out = distill(args.target, args.out, shape=shape, settings=settings, force=args.force)
    print(f"drafter {out}")
    return 0


SHAPE_OPTIONS = {"layers": "--layers", "block_size": "--block-size", "markov_rank": "--markov-rank",
                 "markov_head_type": "--markov-head-type", "taps": "--taps",
                 "draft_vocab": "--draft-vocab", "context_window": "--context-window"}


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
    chosen = {"num_layers": args.layers, "markov_rank": args.markov_rank, "block_size": args.block_size,
              "markov_head_type": args.markov_head_type}
    chosen = {k: v for k, v in chosen.items() if v is not None}
    if args.context_window is not None:
        if args.context_window < 0:
            raise DSparkTrtError(f"--context-window {args.context_window}: use W >= 1 context rows, or 0 for all")
        chosen["context_window"] = args.context_window or None  # 0: the whole context
    return DrafterShape(target_layer_ids=taps, draft_vocab_size=args.draft_vocab, **chosen)
