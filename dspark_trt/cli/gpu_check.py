"""Everything that needs a GPU, in one command: the fused kernel (JIT and driver-loaded AOT PTX) against the
reference, `dspark bench markov --device cuda`, CUDA-graph replay against eager at batch buckets 1/4/8, and
a draft round's time eager vs graph per bucket, written to DIR/gpu_check.json (docs/kernel.md).

    PYTHONPATH=. python -m dspark_trt.cli.main gpu-check --out gpu-check [--ptx-dir ptx] [--quick]
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..tools.gpu_check import add_arguments as tool_arguments

    tool_arguments(p)


def run(args: argparse.Namespace) -> int:
    from ..tools.gpu_check import run as tool_run

    return tool_run(args)
