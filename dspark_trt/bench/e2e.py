"""End-to-end tokens/s with and without speculation, plus acceptance statistics, measured in one run.

Default pair: the embedded demo pair (see ``dspark generate``). Each repeat runs the speculative decoder
and the target-only baseline back to back on the same requests; the report gives the median tokens/s of
each, their ratio, and the acceptance of the speculative runs. Reported, never asserted.

  dspark bench e2e
  dspark bench e2e --drafter DRAFTER --target TARGET --input-ids "1 2 3" --max-new-tokens 256 --json
"""

from __future__ import annotations

import argparse
import json
import statistics


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..cli.generate import add_arguments as add_generate_arguments

    add_generate_arguments(p)
    p.add_argument("--repeats", type=int, default=3, help="timed repeats of each mode (median reported)")


def run(args: argparse.Namespace) -> int:
    from ..cli.generate import build_decoder, generation_options, requests
    from ..errors import DSparkTrtError

    if args.no_draft:
        raise DSparkTrtError("dspark bench e2e always runs both modes; drop --no-draft")
    if args.max_new_tokens is None:
        args.max_new_tokens = 128
    decoder = build_decoder(args)
    prompts = requests(args, decoder)
    prompts = prompts[: args.batch_size] if args.batch_size else prompts  # one batch of exactly that size
    options = generation_options(args, len(prompts))
    decoder.generate(prompts, **{**options, "max_new_tokens": 8})  # warm-up (allocations, lazy inits)
    decoder.generate(prompts, draft=False, **{**options, "max_new_tokens": 8})
    spec, base = [], []
    for _ in range(max(1, args.repeats)):
        spec.append(decoder.generate(prompts, **options))
        base.append(decoder.generate(prompts, draft=False, **options))
    spec_tps = statistics.median(r.stats.tokens_per_second for r in spec)
    base_tps = statistics.median(r.stats.tokens_per_second for r in base)
    last = spec[-1].stats
    report = {
        "device": str(decoder.target.device),
        "backend": decoder.backend.name,
        "requests": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "num_draft_tokens": last.num_draft_tokens,
        "speculative_tokens_per_second": spec_tps,
        "target_only_tokens_per_second": base_tps,
        "speedup": spec_tps / base_tps if base_tps else None,
        "mean_acceptance_length": last.mean_acceptance_length,
        "per_position_acceptance": last.per_position_acceptance,
        "time_split": {k: getattr(last, f"{k}_seconds") / last.total_seconds for k in
                       ("prefill", "draft", "verify", "other")} if last.total_seconds else {},
        "same_tokens": all(s.tokens == b.tokens for s, b in zip(spec, base)),
    }
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"device {report['device']}, backend {report['backend']}, {len(prompts)} request(s) x "
          f"{args.max_new_tokens} tokens, N = {last.num_draft_tokens}, median of {len(spec)}")
    print(f"  speculative : {spec_tps:8.1f} tok/s   acceptance {last.mean_acceptance_length:.2f} tok/round, "
          f"per slot {' '.join(f'{a:.2f}' for a in last.per_position_acceptance)}")
    print(f"  target only : {base_tps:8.1f} tok/s")
    print(f"  speedup     : {report['speedup']:.2f}x   time split (speculative): "
          + ", ".join(f"{k} {v:.0%}" for k, v in report["time_split"].items()))
    if not (args.temperature or 0) > 0:
        print(f"  greedy outputs identical with and without speculation: {report['same_tokens']}")
    return 0
