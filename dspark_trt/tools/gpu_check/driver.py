"""A gpu-check run: the device's description, the plan run within the budget, the JSON report rewritten after
every row (``report.ReportWriter``), and the summary printed last."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ...errors import DSparkTrtError
from .goals import recorded_goals
from .plan import Options, build_plan, run_plan
from .report import OUT_FILE, Checks, ReportWriter, exit_status

__all__ = ["Run", "run_gpu_check", "device_info"]


@dataclass
class Run:
    """What the steps share: the options, the output directory, the rows, and what they measured."""

    options: Options
    out: Path
    info: dict
    checks: Checks = field(default_factory=Checks)
    results: dict = field(default_factory=dict)  # bench_markov, graphs, union_timing, tensorrt, torch_max_reserved
    exports: dict = field(default_factory=dict)  # dtype → the tiny pair's TensorRT export
    state: dict = field(default_factory=dict)  # objects steps share (the graph drafter)
    budget_left: float = 0.0
    started: float = field(default_factory=time.time)
    finished: bool = False

    def report(self) -> dict:
        r = self.results
        trt = r.get("tensorrt") or {}
        generated = trt.get("generate_fp32") if isinstance(trt.get("generate_fp32"), dict) else None
        memory = {"torch_max_reserved": r.get("torch_max_reserved"),
                  "tensorrt": generated["graph"]["reserved"] if generated and "graph" in generated else None}
        return {**self.info, "options": {k: v for k, v in vars(self.options).items()},
                "checks": self.checks.rows, "bench_markov": r.get("bench_markov"), "graphs": r.get("graphs") or [],
                "union_timing": r.get("union_timing"), "tensorrt": trt, "device_memory": memory,
                "goals": recorded_goals(r.get("bench_markov"), r.get("graphs"), r.get("union_timing")),
                "passed": self.checks.passed, "complete": self.checks.complete, "finished": self.finished,
                "elapsed_s": round(time.time() - self.started, 1)}


def device_info() -> dict:
    import triton

    from ...plugins.ptx_launch import driver_version

    cap = torch.cuda.get_device_capability()
    return {"device": torch.cuda.get_device_name(), "capability": cap[0] * 10 + cap[1],
            "driver_cuda": driver_version(), "torch": torch.__version__, "triton": triton.__version__,
            "python": sys.version.split()[0]}


def run_gpu_check(options: Options, *, clock: Callable[[], float] = time.monotonic) -> int:
    """The whole check (module docstring of the package) → exit status: 0 when every row passed (SKIP and
    NOT RUN rows included), 3 when one failed, 1 (a ``DSparkTrtError``) without a CUDA device."""
    if not torch.cuda.is_available():
        raise DSparkTrtError("no CUDA device is visible; dspark gpu-check runs on a GPU host (--dry-run prints "
                             "the plan anywhere)")
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    info = device_info()
    print(" ".join(f"{k}={v}" for k, v in info.items()), flush=True)
    run = Run(options, out, info)
    writer = ReportWriter(out / OUT_FILE, run.report)
    run.checks.on_row = writer.write
    writer.write()  # the plan has begun: a report exists from the first second
    run_plan(build_plan(options), run, options.budget, clock)
    run.finished = True
    writer.write()
    print_summary(run)
    print(f"wrote {out / OUT_FILE}")
    return exit_status(run.checks)


def print_summary(run: Run) -> None:
    from ...runtime.device_memory import describe_reserved, format_bytes

    report = run.report()
    print("\n" + run.checks.table())
    peak, trt = report["device_memory"]["torch_max_reserved"], report["device_memory"]["tensorrt"]
    print(f"\ndevice memory: torch peak reserved {format_bytes(peak) if peak is not None else 'not measured'}; "
          f"TensorRT runtime: {describe_reserved(trt) if trt else 'not run'}")
    not_run = [r["check"] for r in run.checks.rows if r["status"] == "NOT RUN"]
    if not_run:
        print(f"\nnot run ({len(not_run)}): {', '.join(not_run)}")
    print(f"\ngoals: {json.dumps(report['goals'])}")
