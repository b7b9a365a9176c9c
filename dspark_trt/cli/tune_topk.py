"""``dspark tune-topk DRAFTER --target TARGET``: sweep (top-k, union width M) on real prompts and recommend one.

    dspark tune-topk out/smollm2/drafter --target out/smollm2/target --prompts out/smollm2/prompts.json \\
        --plot tune.png [--write]

Prints the table (acceptance length, draft/verify ms per request-round, modelled and measured tokens/s) and
the recommendation; ``--write`` records it as the drafter's default (``draft_topk``, ``draft_markov_topm``).
How tokens/s is modelled: ``dspark_trt/bench/tune_topk.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import DSparkTrtError


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..bench.tune_topk import DEFAULT_TOPKS, DEFAULT_TOPMS

    p.add_argument("drafter", metavar="DRAFTER", help="drafter checkpoint directory")
    p.add_argument("--target", required=True, help="target model directory")
    p.add_argument("--prompts", default=None, metavar="FILE",
                   help="prompts: JSON list (or dspark smollm2's prompts.json), or one per line "
                        "(default: DRAFTER/../prompts.json when present)")
    p.add_argument("--topk", type=_ints, default=DEFAULT_TOPKS, metavar="K,K,...",
                   help=f"top-k grid (default {','.join(map(str, DEFAULT_TOPKS))})")
    p.add_argument("--markov-topm", type=_ints, default=None, metavar="M,M,...",
                   help=f"union width grid, 0 = top-k only (default {','.join(map(str, DEFAULT_TOPMS))}; a gated or "
                        f"RNN drafter has no union: 0)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per prompt and setting (default 64)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--dtype", default=None, choices=["fp32", "bf16", "fp16"])
    p.add_argument("--threads", type=int, default=None, help="CPU threads")
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                   help="write {rows, recommended} as JSON to PATH (or stdout) instead of the table")
    p.add_argument("--plot", default=None, metavar="PNG", help="plot acceptance and modelled tokens/s vs k")
    p.add_argument("--force", action="store_true", help="replace existing --json/--plot files")
    p.add_argument("--write", action="store_true",
                   help="record the recommendation in DRAFTER/config.json (draft_topk, draft_markov_topm)")


def run(args: argparse.Namespace) -> int:
    from ..bench import tune_topk as tune
    from ..runtime import SpeculativeDecoder
    from .common import set_cpu_threads

    for path in (args.json, args.plot):
        if path not in (None, "-") and Path(path).exists() and not args.force:
            raise DSparkTrtError(f"{path} exists; pass --force to replace it (or choose another path)")
    if args.max_new_tokens < 1:
        raise DSparkTrtError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    prompts_path = args.prompts
    if prompts_path is None:
        guess = Path(args.drafter).parent / "prompts.json"
        if not guess.is_file():
            raise DSparkTrtError("pass --prompts FILE (a JSON list of prompts, or one prompt per line)")
        prompts_path = guess
    prompts = tune.load_prompts(prompts_path)
    if args.threads is not None:
        set_cpu_threads(args.threads)
    from ..config import DSparkConfig

    # the union widths from the drafter's head, before the (long) load: a gated / RNN head has no union
    topms = tune.union_widths(DSparkConfig.from_pretrained(args.drafter).markov_head_type, args.markov_topm)
    options = {k: v for k, v in dict(device=args.device, dtype=args.dtype).items() if v is not None}
    decoder = SpeculativeDecoder.from_pretrained(args.drafter, args.target, backend="torch", **options)
    rows = tune.sweep(decoder, prompts, args.topk, topms, max_new_tokens=args.max_new_tokens,
                      temperature=args.temperature, seed=args.seed)
    best = tune.recommend(rows)
    if args.plot:
        tune.plot_sweep(rows, args.plot)
    written = tune.write_default(args.drafter, best) if args.write else None
    if args.json == "-":
        json.dump({"rows": rows, "recommended": best}, sys.stdout, indent=1)
        print()
        return 0
    if args.json:
        from ..atomic import atomic_write_text

        atomic_write_text(args.json, json.dumps({"rows": rows, "recommended": best}, indent=1) + "\n")
    print(tune.format_table(rows, best))
    print(f"recommended: --topk {best['topk']} --markov-topm {best['markov_topm']} "
          f"({best['modelled_tokens_per_second']} tokens/s modelled, acceptance length {best['acceptance_length']})"
          + (f"; recorded in {written}" if written else ""))
    return 0
