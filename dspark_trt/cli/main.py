"""``dspark``: the umbrella command. Subcommands live in their own modules and are imported on demand."""

from __future__ import annotations

import argparse
import sys

from .. import __version__
from .common import EXIT_USAGE, add_verbosity, import_optional, run_guarded, setup_logging

#: subcommand → (module under dspark_trt.cli, one-line help)
SUBCOMMANDS = {
    "tiny-checkpoint": ("tiny_checkpoint", "write a tiny random drafter + target pair (offline demos and tests)"),
    "generate": ("generate", "speculative decoding with a DSpark drafter beside a target model"),
    "export": ("export", "checkpoint → ONNX → TensorRT engine (same as dspark-export)"),
    "build-engine": ("build_engine", "build the TensorRT engine for an export directory on a GPU host"),
    "bench": ("bench", "benchmarks: the Markov round, end to end"),
    "tune-topk": ("tune_topk", "sweep top-k and the candidate union on real prompts; recommend (and --write) one"),
    "env": ("env", "versions of everything a bug report needs"),
    "gpu-check": ("gpu_check", "kernel, AOT PTX, benchmark and CUDA-graph checks on a GPU host (JSON report)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dspark", description="DSpark speculative-decoding drafters on NVIDIA's stack.")
    parser.add_argument("--version", action="version", version=f"dspark-trt {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        mod = import_optional(f"dspark_trt.cli.{module}")
        if mod is None:
            sub = subparsers.add_parser(name, help=f"{help_text} (not yet available)")
            sub.set_defaults(_unavailable=name)
            continue
        sub = subparsers.add_parser(name, help=help_text, description=getattr(mod, "__doc__", None),
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(sub)
        add_verbosity(sub)
        sub.set_defaults(_run=mod.run, _status_line=getattr(mod, "STATUS_LINE", False))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    if getattr(args, "_unavailable", None):
        print(f"error: 'dspark {args._unavailable}' is not yet available in this version", file=sys.stderr)
        return EXIT_USAGE
    setup_logging(args)
    return run_guarded(args._run, args, status_line=args._status_line, argv=["dspark", *argv])


if __name__ == "__main__":
    sys.exit(main())
