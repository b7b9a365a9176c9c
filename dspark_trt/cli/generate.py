"""Speculative decoding with a DSpark drafter beside a Hugging Face target model.

With no --drafter/--target, runs on the embedded demo pair (a byte-level tiny target that has read a short
text and a drafter distilled from it), built once into ~/.cache/dspark-trt, offline.

  dspark generate --prompt "Speculative decoding"
  dspark generate --drafter DRAFTER --target TARGET --input-ids "1 2 3" --max-new-tokens 64 --json
  dspark generate --prompt "The verifier" --temperature 1 --seed 7 --batch-size 4 --no-draft
  dspark generate --prompt "The verifier" --temperature 0.8 --top-p 0.9 --top-k 50 --stop "."
  dspark generate --export OUT --prompt "The verifier"     (the exported target + drafter, no transformers model)

Request i of a batch uses seed S + i. Text needs a tokenizer in the target directory; --input-ids works always.
"""

from __future__ import annotations

import argparse
import json

from ..errors import DSparkTrtError
from .common import set_cpu_threads, verify_length


def add_arguments(p: argparse.ArgumentParser) -> None:
    m = p.add_argument_group("models (default: the embedded demo pair)")
    m.add_argument("--drafter", metavar="DIR", default=None, help="DSpark drafter checkpoint directory")
    m.add_argument("--target", metavar="DIR", default=None,
                   help="Hugging Face causal-LM directory (the target; default: a speculators drafter's verifier, "
                        "when it is a local directory)")
    m.add_argument("--export", metavar="OUT", default=None,
                   help="run the exported target and drafter of a dspark-export directory (tokenizer from "
                        "OUT/tokenizer; no transformers model loaded)")
    m.add_argument("--backend", default=None, help="drafter backend: torch (default) or onnxruntime; with --export "
                   "the backend of both graphs: onnxruntime (default) or tensorrt (the engines, on a GPU host)")
    m.add_argument("--device", default=None, help="cpu or cuda[:i] (default: cuda when available)")
    m.add_argument("--dtype", default=None, choices=("fp32", "fp16", "bf16"),
                   help="model dtype (default: fp32 on CPU, bf16 on CUDA)")
    m.add_argument("--threads", type=int, default=None,
                   help="CPU threads of torch and the CPU kernels (default: the idle cores — all cores minus the "
                        "load average, at least 1)")
    i = p.add_argument_group("requests")
    src = i.add_mutually_exclusive_group()
    src.add_argument("--prompt", action="append", metavar="TEXT", default=None,
                     help="text prompt (repeatable: one request each); needs a tokenizer in the target dir")
    src.add_argument("--input-ids", action="append", metavar='"ID ID ..."', default=None,
                     help="prompt as space/comma-separated token ids (repeatable)")
    i.add_argument("--batch-size", type=int, default=None,
                   help="requests per batch: prompts are repeated to fill it, or run in chunks of it")
    i.add_argument("--max-new-tokens", type=int, default=None, help="new tokens per request (default 64)")
    i.add_argument("--temperature", type=float, default=None, help="0 = greedy (default)")
    i.add_argument("--topk", default=None, metavar="K|off",
                   help="top-k Markov head candidates per slot, or 'off' for the dense head (default: config)")
    i.add_argument("--markov-topm", type=int, default=None, metavar="M",
                   help="candidate union: each slot also scores the M tokens the Markov head favours most after "
                        "its predecessor (needs --topk; torch backend, or an export made with --markov-topm M; "
                        "0 = top-k only; default: the export's M, else the config's draft_markov_topm where it "
                        "applies)")
    i.add_argument("--top-p", type=float, default=None, metavar="P",
                   help="nucleus sampling of the target's distribution at --temperature, 0 < P <= 1 (default 1 = "
                        "off); lossless: the output follows the truncated target exactly")
    i.add_argument("--top-k", type=int, default=None, metavar="K",
                   help="sample among the target's K most likely tokens (default 0 = off); not --topk, which "
                        "sizes the drafter's candidate sets")
    i.add_argument("--stop", action="append", default=None, metavar="TEXT",
                   help="stop string (repeatable, up to 4; needs a tokenizer): the text ends before it")
    i.add_argument("--seed", type=int, default=None, help="noise seed of request 0; request i uses seed + i")
    i.add_argument("--confidence-threshold", type=float, default=None,
                   help="verify only the leading drafts with confidence >= this")
    i.add_argument("--verify-drafts", type=verify_length, default=None, metavar="L|auto",
                   help="verify at most L drafts per round (1 … N; default all N): faster where a target forward "
                        "costs more with more tokens, e.g. on a CPU (see 'dspark bench report'); 'auto' chooses L "
                        "each round from the verify cost measured here and the acceptance so far")
    i.add_argument("--eos-id", type=int, action="append", default=None, help="stop token id (repeatable; "
                   "default: the target's eos ids)")
    i.add_argument("--ignore-eos", action="store_true", help="never stop before --max-new-tokens")
    o = p.add_argument_group("output")
    o.add_argument("--no-draft", action="store_true", help="target-only baseline with the same sampler")
    o.add_argument("--json", action="store_true", help="print one JSON object {tokens, stats[, texts]}")


def parse_topk(value: str | None) -> int | None:
    """``--topk``: None → the checkpoint's draft_topk; ``off`` → 0 (dense); K >= 1 (``contract.parse_topk``)."""
    if value is None:
        return None
    from ..plugins.contract import parse_topk as parse

    k = parse(value)
    return 0 if k is None else k


def parse_ids(text: str) -> list[int]:
    parts = text.replace(",", " ").split()
    try:
        return [int(t) for t in parts]
    except ValueError:
        raise DSparkTrtError(f"--input-ids {text!r}: expected integers separated by spaces or commas") from None


def resolve_pair(args: argparse.Namespace):
    """(drafter_dir, target_dir): the given pair, or the embedded demo pair when neither is given."""
    if args.drafter is None and args.target is None:
        from ..testing.embedded import embedded_pair

        pair = embedded_pair()
        return pair.drafter, pair.target
    target = args.target
    if args.drafter is not None and target is None:
        from ..loader import resolve_target_dir

        target = resolve_target_dir(args.drafter, None)  # a speculators drafter's local verifier
    if args.drafter is None or target is None:
        raise DSparkTrtError("pass both --drafter and --target (or neither, for the embedded demo pair; --target "
                             "defaults to a speculators drafter's verifier when that is a local directory)")
    return args.drafter, target


def build_decoder(args: argparse.Namespace):
    from ..runtime import SpeculativeDecoder
    from ..threads import default_cpu_threads

    set_cpu_threads(args.threads if args.threads is not None else default_cpu_threads())
    if getattr(args, "export", None) is not None:
        if args.drafter is not None or args.target is not None:
            raise DSparkTrtError("--export runs the exported drafter and target; drop --drafter/--target")
        if args.dtype is not None:
            raise DSparkTrtError("--dtype cannot change an export's dtype; export again with dspark-export --dtype")
        options = {k: v for k, v in dict(device=args.device, threads=args.threads).items() if v is not None}
        return SpeculativeDecoder.from_export(args.export, backend=args.backend or "onnxruntime", **options)
    drafter, target = resolve_pair(args)
    options = {k: v for k, v in dict(backend=args.backend, device=args.device, dtype=args.dtype).items()
               if v is not None}
    return SpeculativeDecoder.from_pretrained(drafter, target, **options)


def requests(args: argparse.Namespace, decoder) -> list:
    """The prompts (text or id lists) of all requests, repeated to fill --batch-size."""
    if args.input_ids is not None:
        prompts = [parse_ids(t) for t in args.input_ids]
    elif args.prompt is not None:
        prompts = list(args.prompt)
    elif decoder.tokenizer is not None:
        prompts = ["Speculative decoding"]
    else:
        raise DSparkTrtError("pass --prompt TEXT or --input-ids \"1 2 3\" (the target has no tokenizer)")
    if args.batch_size is not None:
        if args.batch_size < 1:
            raise DSparkTrtError(f"--batch-size must be >= 1, got {args.batch_size}")
        while len(prompts) < args.batch_size:
            prompts = prompts + prompts[: args.batch_size - len(prompts)]
    return prompts


def generation_options(args: argparse.Namespace, n: int, offset: int = 0) -> dict:
    options = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, topk=parse_topk(args.topk),
                   confidence_threshold=args.confidence_threshold, verify_drafts=args.verify_drafts)
    for name in ("top_p", "top_k", "stop"):  # sampling truncation and stop strings (absent from bench e2e)
        options[name] = getattr(args, name, None)
    options = {k: v for k, v in options.items() if v is not None}
    if getattr(args, "markov_topm", None) is not None:  # 0 forces plain top-k (over a config or export default)
        if args.markov_topm < 0:
            raise DSparkTrtError(f"--markov-topm must be >= 0 (0 = top-k only), got {args.markov_topm}")
        options["markov_topm"] = args.markov_topm
    options["seed"] = [(args.seed or 0) + offset + i for i in range(n)]
    if args.ignore_eos:
        options["eos_token_id"] = []
    elif args.eos_id is not None:
        options["eos_token_id"] = args.eos_id
    return options


def run(args: argparse.Namespace) -> int:
    from ..runtime.stats import GenerationResult

    decoder = build_decoder(args)
    prompts = requests(args, decoder)
    size = args.batch_size or len(prompts)
    results = []
    for start in range(0, len(prompts), size):
        chunk = prompts[start: start + size]
        results.append(decoder.generate(chunk, draft=not args.no_draft,
                                        **generation_options(args, len(chunk), offset=start)))
    result = results[0] if len(results) == 1 else GenerationResult.merge(results)
    if args.json:
        print(json.dumps(result.to_dict()))
        return 0
    for i, tokens in enumerate(result.tokens):
        if result.texts is not None:
            body = (prompts[i] if isinstance(prompts[i], str) else "") + result.texts[i]
        else:
            body = " ".join(map(str, tokens))
        print(f"[{i}] {body}")
    print(result.stats.summary())
    return 0
