"""The decoding options ``dspark generate`` and ``dspark bench e2e`` share: their command-line arguments, the
decoder they select, the requests they send and the ``generate`` options they give.

It sits below both the CLI and the benchmarks (a benchmark builds on the library, never on the CLI), above the
runtime it builds a decoder from (argparse stays out of the runtime). The default pair (none of --drafter/
--target/--export given) is the caller's: both pass the embedded demo pair, which the runtime does not import.

    add_arguments(parser)                       the models / requests / output argument groups
    decoder = build_decoder(args, default_pair=embedded_pair)
    batch = requests(args, decoder)             prompts (token ids), how text was fed (chat template or raw)
    decoder.generate(batch.prompts, **generation_options(args, len(batch.prompts)))
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable

from ..errors import DSparkTrtError
from ..runtime.draft_options import verify_length
from ..topk import parse_topk

__all__ = ["DEFAULT_PROMPT", "Requests", "add_arguments", "build_decoder", "generation_options", "parse_ids",
           "requests", "resolve_pair"]

DEFAULT_PROMPT = "Speculative decoding"  # the prompt when none is given and the target has a tokenizer



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
                     help="text prompt (repeatable: one request each); needs a tokenizer in the target dir. Fed "
                          "through the tokenizer's chat template (one user turn) when it has one; see --raw")
    src.add_argument("--input-ids", action="append", metavar='"ID ID ..."', default=None,
                     help="prompt as space/comma-separated token ids (repeatable), fed as they are")
    i.add_argument("--raw", action="store_true",
                   help="feed --prompt text as it is, without the tokenizer's chat template")
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
    o.add_argument("--json", action="store_true", help="print one JSON object {tokens, stats, prompt_format[, texts]}")


def parse_ids(text: str) -> list[int]:
    parts = text.replace(",", " ").split()
    try:
        return [int(t) for t in parts]
    except ValueError:
        raise DSparkTrtError(f"--input-ids {text!r}: expected integers separated by spaces or commas") from None


def resolve_pair(args: argparse.Namespace, default_pair: Callable | None = None):
    """(drafter_dir, target_dir): the given pair, or ``default_pair()`` (an object with ``drafter`` and
    ``target``) when neither is given."""
    if args.drafter is None and args.target is None and default_pair is not None:
        pair = default_pair()
        return pair.drafter, pair.target
    target = args.target
    if args.drafter is not None and target is None:
        from ..loader import resolve_target_dir

        target = resolve_target_dir(args.drafter, None)  # a speculators drafter's local verifier
    if args.drafter is None or target is None:
        raise DSparkTrtError("pass both --drafter and --target (or neither, for the embedded demo pair; --target "
                             "defaults to a speculators drafter's verifier when that is a local directory)")
    return args.drafter, target


def build_decoder(args: argparse.Namespace, *, default_pair: Callable | None = None):
    """The ``SpeculativeDecoder`` the options select: ``--export OUT`` (its graphs), else ``--drafter/--target``
    (transformers target + drafter backend), else ``default_pair()``. Sets the CPU threads first."""
    from ..threads import default_cpu_threads, set_cpu_threads
    from ..runtime.decoder import SpeculativeDecoder

    set_cpu_threads(args.threads if args.threads is not None else default_cpu_threads())
    if getattr(args, "export", None) is not None:
        if args.drafter is not None or args.target is not None:
            raise DSparkTrtError("--export runs the exported drafter and target; drop --drafter/--target")
        if args.dtype is not None:
            raise DSparkTrtError("--dtype cannot change an export's dtype; export again with dspark-export --dtype")
        options = {k: v for k, v in dict(device=args.device, threads=args.threads).items() if v is not None}
        return SpeculativeDecoder.from_export(args.export, backend=args.backend or "onnxruntime", **options)
    drafter, target = resolve_pair(args, default_pair)
    options = {k: v for k, v in dict(backend=args.backend, device=args.device, dtype=args.dtype).items()
               if v is not None}
    return SpeculativeDecoder.from_pretrained(drafter, target, **options)


@dataclass
class Requests:
    """The prompts of a run as token ids, and how they were given: ``"chat"`` / ``"raw"`` (text through the
    chat template, or as it is: ``runtime/prompting.py``) or ``"ids"`` (``--input-ids``)."""

    prompts: list[list[int]]
    prompt_format: str


def requests(args: argparse.Namespace, decoder) -> Requests:
    """The prompts of all requests as token ids, repeated to fill --batch-size; text is encoded here (the chat
    template unless --raw), so what the model is fed is decided once and can be reported."""
    if args.input_ids is not None:
        prompts, fmt = [parse_ids(t) for t in args.input_ids], "ids"
    else:
        texts = list(args.prompt) if args.prompt is not None else None
        if decoder.tokenizer is None:
            raise DSparkTrtError("--prompt needs a tokenizer, and the target directory has none; pass token ids "
                                 "instead (--input-ids \"1 2 3\")" if texts is not None else
                                 "pass --prompt TEXT or --input-ids \"1 2 3\" (the target has no tokenizer)")
        from ..runtime.prompting import encode_prompts

        prompts, fmt = encode_prompts(decoder.tokenizer, texts or [DEFAULT_PROMPT], raw=getattr(args, "raw", False))
    if args.batch_size is not None:
        if args.batch_size < 1:
            raise DSparkTrtError(f"--batch-size must be >= 1, got {args.batch_size}")
        while len(prompts) < args.batch_size:
            prompts = prompts + prompts[: args.batch_size - len(prompts)]
    return Requests(prompts, fmt)


def generation_options(args: argparse.Namespace, n: int, offset: int = 0) -> dict:
    """``SpeculativeDecoder.generate`` keyword arguments for ``n`` requests; request i gets seed + offset + i."""
    options = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                   confidence_threshold=args.confidence_threshold, verify_drafts=args.verify_drafts,
                   top_p=args.top_p, top_k=args.top_k, stop=args.stop)  # target truncation, stop strings
    options = {k: v for k, v in options.items() if v is not None}
    if args.topk is not None:  # not given: generate's DEFAULT_TOPK (the drafter's or the export's own)
        options["topk"] = parse_topk(args.topk)  # "off" → None: dense
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
