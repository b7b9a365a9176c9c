"""Speculative decoding with a DSpark drafter beside a Hugging Face target model.

With no --drafter/--target, runs on the embedded demo pair (a byte-level tiny target that has read a short
text and a drafter distilled from it), built once into ~/.cache/dspark-trt, offline.

  dspark generate --prompt "Speculative decoding"
  dspark generate --drafter DRAFTER --target TARGET --input-ids "1 2 3" --max-new-tokens 64 --json
  dspark generate --prompt "The verifier" --temperature 1 --seed 7 --batch-size 4 --no-draft
  dspark generate --export OUT --prompt "The verifier"     (the exported target + drafter, no transformers model)

Request i of a batch uses seed S + i. Text needs a tokenizer in the target directory; --input-ids works always.
A text prompt goes through the tokenizer's chat template when it has one (a chat model), else as it is
(--raw: always as it is); the output says which. Outputs are the new tokens only, never the prompt (plain
and --json alike, as Triton's text_output).
"""

from __future__ import annotations

import argparse
import json
import logging

from ..args.decoding import add_arguments as add_decoding_arguments

PROMPT_FORMATS = {"chat": "chat (the tokenizer's chat template; --raw feeds the text as it is)",
                  "raw": "raw (the text as it is)"}

log = logging.getLogger("dspark.generate")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_decoding_arguments(p)


def run(args: argparse.Namespace) -> int:
    from ..args.decoding import build_decoder, generation_options, requests
    from ..export import on_demand
    from ..runtime.stats import GenerationResult
    from ..demo.pair import embedded_pair

    on_demand.install()  # --backend onnxruntime with a checkpoint: the drafter is exported on demand
    decoder = build_decoder(args, default_pair=embedded_pair)
    batch = requests(args, decoder)
    prompts = batch.prompts
    size = args.batch_size or len(prompts)
    options = generation_options(args, len(prompts))
    decoder.check_context(prompts, options.get("max_new_tokens", 64))  # every chunk, before any runs
    results = []
    for start in range(0, len(prompts), size):
        chunk = prompts[start: start + size]
        results.append(decoder.generate(chunk, draft=not args.no_draft,
                                        **generation_options(args, len(chunk), offset=start)))
    result = results[0] if len(results) == 1 else GenerationResult.merge(results)
    if log.isEnabledFor(logging.DEBUG):  # -v: what the runtime holds on the device after the run
        from ..runtime.device_memory import describe_reserved, reserved_device_memory

        log.debug("device memory reserved: %s", describe_reserved(reserved_device_memory(decoder)))
    if args.json:
        print(json.dumps({**result.to_dict(), "prompt_format": batch.prompt_format}))
        return 0
    if batch.prompt_format in PROMPT_FORMATS:
        print(f"prompt format: {PROMPT_FORMATS[batch.prompt_format]}")
    for i, tokens in enumerate(result.tokens):
        body = result.texts[i] if result.texts is not None else " ".join(map(str, tokens))
        print(f"[{i}] {body}")
    print(result.stats.summary())
    return 0
