"""``dspark gpu-check --out DIR``: everything that needs a GPU, in one command, within ``--budget`` (480 s).

    # anywhere (no GPU): the plan — each step, its expected time, what it proves
    PYTHONPATH=. python -m dspark_trt.cli.main gpu-check --dry-run
    # optional, on the CPU machine: the PTX a TensorRT engine would embed (ISA 8.0: CUDA >= 12.0 drivers)
    python -m dspark_trt.plugins.aot --out ptx --n 7 --k 512 --rank 256 --dtypes fp32-bf16,bf16-bf16 --validate
    # on the GPU host, from the repository root, with its own torch/Triton (installs nothing)
    PYTHONPATH=. python -m dspark_trt.cli.main gpu-check --out gpu-check [--ptx-dir ptx] [--quick] [--perf]

The steps (``plan.build_plan``, most valuable first; docs/kernel.md lists what each proves): TensorRT
importable (``--require-tensorrt``, default with a GPU: a FAIL row with the import error otherwise); the JIT
kernel and the union kernel against the reference (``steps_kernel``); their AOT PTX through the driver API; the
tiny pair exported with TensorRT engines in fp32 (TF32 cleared) and generation eager/graph against the
onnxruntime backend's tokens (``steps_tensorrt``); the engines deserialized in a fresh process
(``fresh_load``); the engines against the reference drafter and transformers; a prompt over 16 tokens
(profile 0, chunked prefill) and a K/V cache growing across capacity buckets (``steps_long``); the torch
backend's CUDA graphs at Qwen3-8B shapes (``steps_graphs``); the bf16 export end to end; ``bench markov``
(``steps_bench``), the graph timings, the union's time; ``--perf``: the goals as rows (``goals``); ``pytest -m
"tensorrt or gpu"`` (``steps_pytest``). Wherever a graph mode is claimed, a capture that fell back to eager is
a FAIL row (``common.assert_graphs_captured``).

``DIR/gpu_check.json`` is rewritten after every row (``report``): device, versions, options, every row (with
its step's expected and real seconds), the benchmark rows, the graph timings, the TensorRT section, the device
memory, the goals, ``passed``, ``complete`` (no step left out) and ``finished``. The table of rows is printed
last. Exit status 0 when every row passes (``SKIP`` and ``NOT RUN`` rows do not fail it), 3 when one fails,
1 without a CUDA device (one line) or on a setup error.
"""

from __future__ import annotations

from .cli import add_arguments, main, run
from .common import GRAPH_BUCKETS, QWEN3_8B, UNION_M, assert_graphs_captured, qwen3_8b_drafter_config
from .driver import run_gpu_check
from .plan import DEFAULT_BUDGET, Options, Step, build_plan, format_plan, register_steps, run_plan, schedule
from .report import OUT_FILE, Checks, ReportWriter, exit_status
from .steps_pytest import PYTEST_MARKERS, parse_pytest_summary, pytest_check, pytest_command

__all__ = ["main", "run", "add_arguments", "run_gpu_check", "Options", "Step", "build_plan", "run_plan",
           "schedule", "format_plan", "register_steps", "DEFAULT_BUDGET", "Checks", "ReportWriter", "exit_status",
           "OUT_FILE", "GRAPH_BUCKETS", "QWEN3_8B", "UNION_M", "assert_graphs_captured", "qwen3_8b_drafter_config",
           "PYTEST_MARKERS", "parse_pytest_summary", "pytest_check", "pytest_command"]
