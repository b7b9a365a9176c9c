"""End-to-end tokens/s with and without speculation, plus acceptance statistics, measured in one run.

Default pair: the embedded demo pair (see ``dspark generate``). Each repeat runs the speculative decoder
and the target-only baseline back to back on each batch of requests (``paired_runs``); the report gives the
median tokens/s of each, their ratio, and the acceptance of the speculative runs. Reported, never asserted.

  dspark bench e2e
  dspark bench e2e --drafter DRAFTER --target TARGET --input-ids "1 2 3" --max-new-tokens 256 --json
  dspark bench e2e --export OUT     the exported (onnxruntime) target next to the transformers one, same drafter
  dspark bench e2e --export OUT --heldout 2     the first 2 of the pair's held-out prompts only

--prompt text goes through the target tokenizer's chat template when it has one (--raw: as is), as in
'dspark generate'; the report says which. A run with fewer than 5 draft rounds (e.g. a chat model that
answers EOS at once) says so instead of printing ratios (JSON: enough_rounds false, the ratios null).
"""

from __future__ import annotations

import argparse
import json
import statistics

PROMPT_FORMATS = {"chat": "text through the chat template", "raw": "text as is", "ids": "token ids",
                  "held-out": "chat turns through the chat template, text as is"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..args.decoding import add_arguments as add_decoding_arguments

    add_decoding_arguments(p)
    p.add_argument("--repeats", type=int, default=3, help="timed repeats of each mode (median reported)")
    p.add_argument("--heldout", type=int, default=None, metavar="N",
                   help="the first N of the pair's held-out prompts (default: all of them)")


def paired_runs(decoder, batches, options: dict, *, seed: int = 0, both: bool = True):
    """Each batch speculative and target-only back to back, the first of the two alternating from batch to
    batch, so that the machine's speed drift (large on shared CPUs) falls on both modes alike →
    (speculative, target-only or None), each the merge of all ``batches``. Request i of the whole run has seed
    ``seed + i``, whatever the batch size."""
    from ..runtime.stats import GenerationResult

    runs = {True: [], False: []}
    first = 0
    for n, b in enumerate(batches):
        seeds = [seed + first + i for i in range(len(b))]
        for draft in ((True, False) if n % 2 == 0 else (False, True)) if both else (True,):
            runs[draft].append(decoder.generate(b, draft=draft, **{**options, "seed": seeds}))
        first += len(b)
    merge = lambda rs: (rs[0] if len(rs) == 1 else GenerationResult.merge(rs)) if rs else None  # noqa: E731
    return merge(runs[True]), merge(runs[False])


def _measure(decoder, batches, options, repeats: int):
    """Warm up, then ``repeats`` × ``paired_runs`` → the lists of speculative and target-only results."""
    decoder.generate(batches[0], **{**options, "max_new_tokens": 8})  # warm-up (allocations, lazy inits)
    decoder.generate(batches[0], draft=False, **{**options, "max_new_tokens": 8})
    spec, base = [], []
    for _ in range(max(1, repeats)):
        s, b = paired_runs(decoder, batches, {k: v for k, v in options.items() if k != "seed"},
                           seed=options["seed"][0])
        spec.append(s)
        base.append(b)
    return spec, base


def batches_of(args, decoder) -> tuple[list, str, str]:
    """(batches, where the prompts come from, their format): the held-out prompts of the pair in chunks of
    --batch-size (default 1) when no prompt is given and the pair has them (format ``"held-out"``: as
    ``dspark smollm2`` rendered them, chat turns through the chat template and text as is; the first --heldout N
    of them when given), else one batch of exactly --batch-size requests (``"chat"``/``"raw"`` text, or ``"ids"``:
    ``args/decoding.requests``)."""
    from ..args.decoding import requests
    from .heldout import find_heldout

    if args.prompt is None and args.input_ids is None:
        found = find_heldout(drafter=args.drafter, target=args.target, export=getattr(args, "export", None))
        if found is not None:
            prompts, path = found
            prompts = prompts[: args.heldout] if args.heldout else prompts
            size = args.batch_size or 1
            prompts = prompts[: len(prompts) - len(prompts) % size] or prompts[:size]
            return [prompts[i: i + size] for i in range(0, len(prompts), size)], f"held-out prompts {path}", "held-out"
    batch = requests(args, decoder)
    prompts = batch.prompts[: args.batch_size] if args.batch_size else batch.prompts  # one batch of exactly that size
    return [prompts], "given prompts", batch.prompt_format


#: fewer speculative rounds (request-rounds, one repeat) than this and the run measured too little for a ratio
MIN_ROUNDS = 5


def _report(decoder, prompts, args, spec, base, batch_size: int, prompt_format: str) -> dict:
    spec_tps = statistics.median(r.stats.tokens_per_second for r in spec)
    base_tps = statistics.median(r.stats.tokens_per_second for r in base)
    last = spec[-1].stats
    enough = last.rounds >= MIN_ROUNDS
    return {
        "device": str(decoder.target.device),
        "backend": decoder.backend.name,
        "target": type(decoder.target).__name__,
        "requests": len(prompts),
        "batch_size": batch_size,
        "prompt_format": prompt_format,
        "max_new_tokens": args.max_new_tokens,
        "num_draft_tokens": last.num_draft_tokens,
        "rounds": last.rounds,
        "generated_tokens": last.generated_tokens,
        "enough_rounds": enough,  # False: the ratios below are null (too few rounds to mean anything)
        "speculative_tokens_per_second": spec_tps if enough else None,
        "target_only_tokens_per_second": base_tps if enough else None,
        "speedup": spec_tps / base_tps if enough and base_tps else None,
        "mean_acceptance_length": last.mean_acceptance_length if enough else None,
        "per_position_acceptance": last.per_position_acceptance if enough else None,
        "time_split": {k: getattr(last, f"{k}_seconds") / last.total_seconds for k in
                       ("prefill", "draft", "verify", "other")} if last.total_seconds else {},
        "same_tokens": all(s.tokens == b.tokens for s, b in zip(spec, base)),
    }


def too_few_rounds(report: dict) -> str:
    """The line printed instead of the ratios when a run measured fewer than ``MIN_ROUNDS`` rounds."""
    return (f"  only {report['rounds']} draft round(s) for {report['generated_tokens']} tokens (EOS or "
            f"--max-new-tokens came first): too few to measure a speed-up or an acceptance; ask for more tokens "
            f"(--max-new-tokens, --ignore-eos) or give prompts the model continues")


def _transformers_twin(decoder, export_dir):
    """The export's drafter beside the transformers model it was exported from (the manifest's target source)."""
    from pathlib import Path

    from ..errors import DSparkTrtError
    from ..artifact.export_dir import ExportDir
    from ..runtime import HFTarget, SpeculativeDecoder

    section = ExportDir(export_dir).target
    source = Path(section.get("source") or "")
    if not (source / "config.json").is_file():
        raise DSparkTrtError(f"the export's target source {source} is gone; the transformers comparison needs it "
                             f"(re-export, or run dspark bench e2e with --drafter/--target)")
    target = HFTarget.from_pretrained(source, dtype=section["dtype"], device="cpu")
    twin = SpeculativeDecoder(target, decoder.backend, tokenizer=decoder.tokenizer)
    twin.default_topk = decoder.default_topk
    return twin


def run(args: argparse.Namespace) -> int:
    from ..errors import DSparkTrtError
    from ..args.decoding import build_decoder, generation_options
    from ..demo.pair import embedded_pair
    from ..export import on_demand

    on_demand.install()  # --backend onnxruntime with a checkpoint: the drafter is exported on demand
    if args.no_draft:
        raise DSparkTrtError("dspark bench e2e always runs both modes; drop --no-draft")
    if args.heldout is not None and args.heldout < 1:
        raise DSparkTrtError(f"--heldout must be >= 1 (the first N held-out prompts), got {args.heldout}")
    if args.max_new_tokens is None:
        args.max_new_tokens = 128
    decoder = build_decoder(args, default_pair=embedded_pair)
    batches, source, prompt_format = batches_of(args, decoder)
    prompts = [p for b in batches for p in b]
    decoder.check_context(prompts, args.max_new_tokens)  # before the warm-up
    options = generation_options(args, max(len(b) for b in batches))
    decoders = {"exported target (onnxruntime)" if args.export else "target": decoder}
    if args.export:
        decoders["transformers target"] = _transformers_twin(decoder, args.export)
    reports, results = {}, {}
    for name, dec in decoders.items():
        results[name] = _measure(dec, batches, options, args.repeats)
        reports[name] = _report(dec, prompts, args, *results[name], max(len(b) for b in batches), prompt_format)
    if args.export:
        names = list(reports)
        reports[names[0]]["same_tokens_as_transformers"] = all(
            a.tokens == b.tokens for a, b in zip(results[names[0]][0], results[names[1]][0]))
    if args.json:
        print(json.dumps(reports if args.export else next(iter(reports.values()))))
        return 0
    first = next(iter(reports.values()))
    print(f"{source} ({PROMPT_FORMATS.get(prompt_format, prompt_format)}): {len(batches)} batch(es) of "
          f"{first['batch_size']}")
    print(f"device {first['device']}, drafter backend {first['backend']}, {len(prompts)} request(s) x "
          f"{args.max_new_tokens} tokens, N = {first['num_draft_tokens']}, median of {max(1, args.repeats)}")
    for name, report in reports.items():
        if args.export:
            print(f"{name}:")
        if not report["enough_rounds"]:
            print(too_few_rounds(report))
            continue
        print(f"  speculative : {report['speculative_tokens_per_second']:8.1f} tok/s   acceptance "
              f"{report['mean_acceptance_length']:.2f} tok/round, per slot "
              f"{' '.join(f'{a:.2f}' for a in report['per_position_acceptance'])}")
        print(f"  target only : {report['target_only_tokens_per_second']:8.1f} tok/s")
        print(f"  speedup     : {report['speedup']:.2f}x   time split (speculative): "
              + ", ".join(f"{k} {v:.0%}" for k, v in report["time_split"].items()))
        if not (args.temperature or 0) > 0:
            print(f"  greedy outputs identical with and without speculation: {report['same_tokens']}")
    if args.export:
        print(f"  same tokens with the exported and the transformers target: {first['same_tokens_as_transformers']}")
    return 0
