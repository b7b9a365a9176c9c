"""Export a DSpark drafter checkpoint: ONNX (validated against the PyTorch reference in onnxruntime), the
DSparkTopKMarkov plugin's PTX, and a TensorRT or TensorRT-RTX engine when one is importable.

  dspark-export --topk 512 MODEL_DIR --target TARGET -o OUT   (MODEL_DIR omitted: the embedded tiny demo pair)

Exit codes: 0 ok, 1 bad input (one line), 2 usage, 3 the exported graphs disagree with the reference.
"""

from __future__ import annotations

import argparse
import logging

STATUS_LINE = True  # last line: PASSED | <seconds> | <command>

log = logging.getLogger("dspark.export")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model_dir", metavar="MODEL_DIR", nargs="?", default=None,
                   help="drafter checkpoint directory (default: the embedded tiny demo pair, built offline)")
    p.add_argument("-o", "--output", default=None, help="output directory (default: out/dspark-export)")
    p.add_argument("--topk", default=None, metavar="K|off",
                   help="top-k candidates of the Markov walk (default: the checkpoint's draft_topk, else off)")
    p.add_argument("--markov-topm", default=None, metavar="M",
                   help="candidate union: each draft slot also scores the M tokens the Markov head favours most after "
                        "its predecessor (a [V, M] table in the graph; needs --topk; 0 = none; default: the "
                        "checkpoint's draft_markov_topm)")
    p.add_argument("--engine", choices=("auto", "tensorrt", "tensorrt-rtx", "none"), default=None,
                   help="engine to build (default auto: TensorRT, else TensorRT-RTX, else none)")
    p.add_argument("--dtype", default=None, help="fp32 | fp16 | bf16 (default bf16)")
    p.add_argument("--max-batch-size", type=int, default=None, help="engine profile max batch (default 8)")
    p.add_argument("--opt-batch-size", type=int, default=None, help="engine profile opt batch (default: max)")
    p.add_argument("--max-context", type=int, default=None, help="longest context the engine accepts (default 8192)")
    p.add_argument("--target", default=None, metavar="DIR",
                   help="target model directory: exported too (onnx/target.onnx, its engine, tokenizer/), and needed "
                        "when the drafter shares embed_tokens/lm_head with it (default: a speculators drafter's "
                        "verifier, when it is a local directory)")
    p.add_argument("--skip-target", action="store_true", help="export the drafter only (the target stays a "
                   "transformers model at run time)")
    p.add_argument("--version-compatible", action="store_true", default=None,
                   help="TensorRT: engine runs on later TensorRT runtimes of the same major version (dense exports "
                        "only: refused with the top-k AOT plugin, which is unverified in lean-runtime engines)")
    p.add_argument("--compute-capability", default=None, help="TensorRT-RTX target GPU (default SM80)")
    p.add_argument("--no-validate", action="store_true", help="skip the onnxruntime-vs-reference validation")
    p.add_argument("--force", action="store_true", help="replace a non-empty output directory")
    p.add_argument("--triton-repo", metavar="REPO", default=None,
                   help="also write a Triton model repository serving the export (see dspark triton-repo)")


def options_from_args(args: argparse.Namespace):
    """Only the flags the user gave; the library defaults stay the single source of truth."""
    from ..export.pipeline import ExportOptions
    from ..topk import parse_topk

    if args.topk is not None:
        parse_topk(args.topk)  # a bad --topk fails before the demo pair is built
    markov_topm = getattr(args, "markov_topm", None)
    if markov_topm is not None and not str(markov_topm).strip().isdigit():
        from ..errors import DSparkTrtError

        raise DSparkTrtError(f"--markov-topm {markov_topm}: use an integer M >= 0 (union candidates per draft slot; "
                             f"0 = none)")

    given = {
        "topk": args.topk,
        "markov_topm": getattr(args, "markov_topm", None),
        "dtype": args.dtype,
        "engine": getattr(args, "engine", None),
        "max_batch_size": args.max_batch_size,
        "opt_batch_size": args.opt_batch_size,
        "max_context": getattr(args, "max_context", None),
        "version_compatible": args.version_compatible,
        "compute_capability": args.compute_capability,
    }
    options = {k: v for k, v in given.items() if v is not None}
    if getattr(args, "no_validate", False):
        options["validate"] = False
    if getattr(args, "skip_target", False):
        options["export_target"] = False
    return ExportOptions(**options)


def run(args: argparse.Namespace) -> int:
    from ..export.pipeline import export_model

    options = options_from_args(args)  # bad flags fail before anything is built
    model_dir, target_dir = args.model_dir, args.target
    if model_dir is None:
        if target_dir is not None:
            log.warning("--target is ignored without MODEL_DIR (the embedded pair brings its own target)")
        from ..demo.pair import embedded_pair

        model_dir, target_dir = embedded_pair()
        log.info("no MODEL_DIR: exporting the embedded tiny demo drafter %s", model_dir)
    result = export_model(model_dir, args.output or "out/dspark-export", options,
                          target_dir=target_dir, force=args.force)
    m = result.manifest
    union = f", candidate union M={m['markov_topm']}" if m.get("markov_topm") else ""
    print(f"exported {result.out_dir}: top-k {m['topk'] or 'off'}{union}, {m['dtype']}, N={m['num_draft_tokens']}")
    if m.get("target"):
        t = m["target"]
        print(f"  target {t['onnx']} ({t['architecture']}, {t['num_layers']} layers, taps {t['layer_ids']}, "
              f"tokenizer {t['tokenizer'] or 'none'})")
    for entry in m["engines"].values():
        print(f"  engine {entry['file']} ({entry['flavor']} {entry['version']}, {entry['bytes']} bytes)")
    for note in result.notes:
        log.warning(note)
    if args.triton_repo:
        from ..serving.repository import write_model_repository

        repo = write_model_repository(args.triton_repo, export_dir=result.out_dir, force=args.force)
        print(f"Triton model repository {repo}: launch with `dspark serve {repo}`")
    return 0
