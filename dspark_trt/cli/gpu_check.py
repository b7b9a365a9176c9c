"""Everything that needs a GPU, in one command, within a time budget: the fused kernel (JIT and driver-loaded AOT
PTX) against the reference, the TensorRT path end to end (fp32 and bf16 engines, generation against onnxruntime,
a fresh-process load, long prompts, K/V growth), CUDA-graph replay against eager, `dspark bench markov --device
cuda` and the timings, written to DIR/gpu_check.json after every row (docs/kernel.md, tools/gpu_check/).

    PYTHONPATH=. python -m dspark_trt.cli.main gpu-check --dry-run          # the plan, on any host
    PYTHONPATH=. python -m dspark_trt.cli.main gpu-check --out gpu-check [--ptx-dir ptx] [--quick] [--perf]
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..tools.gpu_check import add_arguments as tool_arguments

    tool_arguments(p)


def run(args: argparse.Namespace) -> int:
    from ..tools.gpu_check import run as tool_run

    return tool_run(args)
