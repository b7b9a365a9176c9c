"""``dspark gpu-check``'s arguments, and ``python -m dspark_trt.tools.gpu_check``."""

from __future__ import annotations

import argparse
import sys

from ...errors import DSparkTrtError
from .plan import DEFAULT_BUDGET, Options

__all__ = ["add_arguments", "options_from_args", "run", "main"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .steps_pytest import PYTEST_MARKERS

    p.add_argument("--out", default=None, help="directory for gpu_check.json (required unless --dry-run)")
    p.add_argument("--ptx-dir", default=None, help="PTX built elsewhere by `python -m dspark_trt.plugins.aot`")
    p.add_argument("--quick", action="store_true", help="fewer kernel shapes and top-k values")
    p.add_argument("--budget", type=float, default=DEFAULT_BUDGET, metavar="SECONDS",
                   help=f"run the steps, most valuable first, that fit in SECONDS (default {DEFAULT_BUDGET:g}); "
                        f"the rest are listed as not run")
    p.add_argument("--dry-run", action="store_true", help="print the plan (steps, expected times, what each "
                                                          "proves) and exit; needs no GPU")
    p.add_argument("--perf", action="store_true", help="enforce the performance goals as FAIL rows")
    p.add_argument("--require-tensorrt", action=argparse.BooleanOptionalAction, default=None,
                   help="a TensorRT that does not import is a FAIL row (default: on when a GPU is present)")
    p.add_argument("--skip-bench", action="store_true", help="skip dspark bench markov")
    p.add_argument("--skip-graphs", action="store_true", help="skip the CUDA-graph checks and timings")
    p.add_argument("--skip-bf16", action="store_true", help="skip the bf16 TensorRT export")
    p.add_argument("--layers", type=int, default=5, help="draft layers of the Qwen3-8B-shaped drafter (default 5)")
    p.add_argument("--context", type=int, default=1024, help="context length of the graph rounds (default 1024)")
    p.add_argument("--topk", type=int, default=512, help="top-k of the graph rounds (default 512)")
    p.add_argument("--skip-tensorrt", action="store_true", help="skip the TensorRT steps")
    p.add_argument("--skip-pytest", action="store_true", help=f"skip pytest -m \"{PYTEST_MARKERS}\"")


def options_from_args(args: argparse.Namespace) -> Options:
    require = args.require_tensorrt
    if require is None:  # default: on when a GPU is present
        import torch

        require = torch.cuda.is_available()
    if args.budget <= 0:
        raise DSparkTrtError(f"--budget {args.budget:g} must be > 0 seconds")
    return Options(out=args.out, ptx_dir=args.ptx_dir, quick=args.quick, skip_bench=args.skip_bench,
                   skip_graphs=args.skip_graphs, layers=args.layers, context=args.context, topk=args.topk,
                   skip_tensorrt=args.skip_tensorrt, skip_pytest=args.skip_pytest, require_tensorrt=require,
                   budget=args.budget, perf=args.perf, skip_bf16=args.skip_bf16)


def run(args: argparse.Namespace) -> int:
    options = options_from_args(args)
    if args.dry_run:
        from .plan import build_plan, format_plan

        print(format_plan(build_plan(options), options.budget))
        return 0
    if not options.out:
        raise DSparkTrtError("--out DIR is required (the report's directory), unless --dry-run")
    from .driver import run_gpu_check

    return run_gpu_check(options)


def main(argv: list[str] | None = None) -> int:
    from . import __doc__ as doc

    p = argparse.ArgumentParser(prog="python -m dspark_trt.tools.gpu_check", description=(doc or "").split("\n\n")[0])
    add_arguments(p)
    try:
        return run(p.parse_args(argv))
    except DSparkTrtError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
