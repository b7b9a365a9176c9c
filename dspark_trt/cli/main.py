"""``dspark``: the umbrella command. Subcommands live in their own modules and are imported on demand."""

from __future__ import annotations

import argparse
import sys

from .. import __version__
from .bench import BENCHMARKS
from .common import EXIT_USAGE, add_verbosity, import_optional, run_guarded, setup_logging

#: subcommand → (module under dspark_trt.cli, one-line help)
SUBCOMMANDS = {
    "tiny-checkpoint": ("tiny_checkpoint", "write a tiny random drafter + target pair (offline demos and tests)"),
    "make-checkpoint": ("make_checkpoint", "write a real-shape drafter and/or target with random weights (presets, "
                                           "streamed, sharded)"),
    "generate": ("generate", "speculative decoding with a DSpark drafter beside a target model"),
    "export": ("export", "checkpoint → ONNX → TensorRT engine (same as dspark-export)"),
    "build-engine": ("build_engine", "build the TensorRT engine for an export directory on a GPU host"),
    "smollm2": ("smollm2", "SmolLM2-135M-Instruct as a Hugging Face directory (+ a distilled drafter), offline"),
    "distill": ("distill", "train a DSpark drafter for a Hugging Face target on the CPU"),
    "bench": ("bench", '|'.join(BENCHMARKS)),  # the names only: they must fit one help line
    "tune-topk": ("tune_topk", "sweep top-k and the candidate union on real prompts; recommend (and --write) one"),
    "env": ("env", "versions of everything a bug report needs"),
    "gpu-check": ("gpu_check", "kernel, TensorRT, CUDA-graph and benchmark checks on a GPU host within a budget "
                                "(JSON report; --dry-run: the plan)"),
    "triton-repo": ("triton_repo", "write a Triton model repository serving an export (or a checkpoint pair)"),
    "serve": ("serve", "serve a Triton model repository with tritonserver until Ctrl-C"),
}


def no_abbreviations(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Turn argparse's prefix matching off in ``parser`` and every subparser below it: ``--version`` must
    never be read as ``--version-compatible``, and a new flag must never change what an old prefix meant."""
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                no_abbreviations(sub)
    return parser


def _configure(parser: argparse.ArgumentParser, mod) -> None:
    mod.add_arguments(parser)
    add_verbosity(parser)
    parser.add_argument("--version", action="version", version=f"dspark-trt {__version__}")
    parser.set_defaults(_run=mod.run, _status_line=getattr(mod, "STATUS_LINE", False))


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
        _configure(sub, mod)
    return no_abbreviations(parser)


def build_command_parser(name: str, prog: str) -> argparse.ArgumentParser:
    """One subcommand as a program of its own (``dspark-export`` is ``dspark export``)."""
    mod = import_optional(f"dspark_trt.cli.{SUBCOMMANDS[name][0]}")
    parser = argparse.ArgumentParser(prog=prog, description=getattr(mod, "__doc__", None),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    _configure(parser, mod)
    return no_abbreviations(parser)


def main(argv: list[str] | None = None, *, command: str | None = None, prog: str = "dspark") -> int:
    """``dspark ARGS``; with ``command``, the program ``prog`` that runs only that subcommand."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if command is not None:
        args = build_command_parser(command, prog).parse_args(argv)
    else:
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return EXIT_USAGE
        if getattr(args, "_unavailable", None):
            print(f"error: 'dspark {args._unavailable}' is not yet available in this version", file=sys.stderr)
            return EXIT_USAGE
    setup_logging(args)
    return run_guarded(args._run, args, status_line=args._status_line, argv=[prog, *argv])


if __name__ == "__main__":
    sys.exit(main())
