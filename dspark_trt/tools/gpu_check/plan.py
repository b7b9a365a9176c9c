"""The plan of a gpu-check run: its steps, most valuable first, each with the time it is expected to take and
what it proves; ``run_plan`` runs them within ``--budget`` and ``format_plan`` prints them (``--dry-run``).

Order: what has never run anywhere comes first — the kernel's correctness (cheap, and what every engine
embeds), then the TensorRT path end to end (export, generate, a fresh process, the references, long prompts,
cache growth), then the torch CUDA graphs at Qwen3-8B shapes, bf16 engines, and the measurements last (bench,
timings, ``--perf``) with the marked pytest suite. A step runs only if its expected time fits what is left of
the budget (a later, shorter one may still fit); one left out is a ``NOT RUN`` row naming its expected time,
and so is a step whose prerequisite did not pass (one whose prerequisite was skipped is skipped).

Expected times are estimates for one H100/H200, not measurements (no GPU run yet): each row records its real
``seconds`` and the plan's ``expected_s``, so a run's report is what the next estimate is taken from.

Hook: ``register_steps(factory)`` adds steps from elsewhere (``factory(options) -> [Step, ...]``, run before
the measurements). The gated and RNN drafters' plugin rows go there once those plugins exist; none is
registered now, and the plan says so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

__all__ = ["Options", "Step", "build_plan", "run_plan", "schedule", "format_plan", "register_steps", "STEP_HOOKS",
           "DEFAULT_BUDGET"]

DEFAULT_BUDGET = 480.0  # seconds: the 8 minutes a GPU host may be lent for


@dataclass(frozen=True)
class Options:
    """What ``dspark gpu-check`` was asked for (``cli``)."""

    out: str | None = None
    ptx_dir: str | None = None
    quick: bool = False
    skip_bench: bool = False
    skip_graphs: bool = False
    layers: int = 5
    context: int = 1024
    topk: int = 512
    skip_tensorrt: bool = False
    skip_pytest: bool = False
    require_tensorrt: bool = True
    budget: float = DEFAULT_BUDGET
    perf: bool = False
    skip_bf16: bool = False


@dataclass
class Step:
    """One step: ``run(run)`` adds its rows to ``run.checks`` (one or more)."""

    name: str
    expected_s: float
    proves: str
    run: Callable | None = None
    needs: tuple[str, ...] = ()
    skip: str | None = None  # why this run leaves it out (a --skip flag), or None
    group: str = ""


#: factories of more steps (module docstring, "Hook")
STEP_HOOKS: list[Callable[[Options], list[Step]]] = []


def register_steps(factory: Callable[[Options], list[Step]]) -> Callable[[Options], list[Step]]:
    STEP_HOOKS.append(factory)
    return factory


TRT = "tensorrt importable"
EXPORT32 = "tensorrt export fp32"
EXPORT16 = "tensorrt export bf16"
REPLAY = "graphs: replay == eager"
BENCH = "bench markov --device cuda"
TIMINGS = "graphs: timings"


def build_plan(o: Options) -> list[Step]:
    """The steps of a run with options ``o``, in the order they run."""
    from . import fresh_load, goals, steps_bench, steps_graphs, steps_kernel, steps_long, steps_pytest
    from . import steps_tensorrt as trt

    no_trt = "--skip-tensorrt" if o.skip_tensorrt else None
    no_graphs = "--skip-graphs" if o.skip_graphs else None
    steps = [
        Step(TRT, 2, "full TensorRT imports on this GPU host (a FAIL with the import error under "
             "--require-tensorrt, the default with a GPU)", lambda run: trt.tensorrt_requirement(
                 run.checks, required=o.require_tensorrt, skip=no_trt), skip=None, group="tensorrt"),
        Step("kernel: JIT vs reference", 25 if o.quick else 50, "the Triton top-k Markov kernel and its candidate-"
             "union variant equal the CPU reference at Qwen3-8B shapes (bf16/fp32, greedy/sampled), tie-robust",
             steps_kernel.jit_step, group="kernel"),
        Step("kernel: AOT PTX through the driver", 35, "the PTX a TensorRT engine embeds (built here, and "
             "--ptx-dir's) loads with cuModuleLoadDataEx and computes the reference's walk in TensorRT's AOT "
             "parameter order; the gated and RNN head kernels JIT and AOT against their reference ops",
             steps_kernel.aot_step, group="kernel"),
        Step(EXPORT32, 75, "dspark-export builds the three engines through the ONNX parser (draft with the AOT "
             "plugin inside, target with two profiles), fp32 with TF32 cleared", trt.export_step("fp32"),
             needs=(TRT,), skip=no_trt, group="tensorrt"),
        Step("tensorrt fp32 generate", 30, "SpeculativeDecoder with backend=tensorrt, eager and CUDA graphs "
             "(drafter copied and bound, target; every capture asserted), generates onnxruntime's tokens exactly",
             trt.generate_step("fp32"), needs=(EXPORT32,), skip=no_trt, group="tensorrt"),
        Step("tensorrt fp32 fresh process", 25, "the engines deserialize in a process that imports only tensorrt "
             "(as Triton's tensorrt_plan does: the plugin is in the engine), and dspark generate's path in a new "
             "process, without the plugin registration, gives the same tokens", fresh_load.fresh_process_step,
             needs=(EXPORT32,), skip=no_trt, group="tensorrt"),
        Step("tensorrt fp32 engines vs references", 35, "the drafter engines (eager, graph) pass the export "
             "validation's checks against the reference drafter; the target engine (prefill, verify, rollback) "
             "matches transformers, fp32 rules (TF32 off)", trt.validate_step("fp32"), needs=(EXPORT32,),
             skip=no_trt, group="tensorrt"),
        Step("tensorrt fp32 long prompt", 15, "prompts over 16 tokens prefill on the target's profile 0 in "
             "chunks, verify rounds on profile 1, logits match transformers and tokens onnxruntime's",
             steps_long.long_prompt_step, needs=(EXPORT32,), skip=no_trt, group="tensorrt"),
        Step("tensorrt fp32 K/V growth", 25, "a cache growing across capacity buckets: the target's graphs are "
             "captured again at the new capacity (buffers moved) and the tokens stay onnxruntime's",
             steps_long.kv_growth_step, needs=(EXPORT32,), skip=no_trt, group="tensorrt"),
        Step(REPLAY, 50, "the torch backend's CUDA-graph draft round at Qwen3-8B shapes replays the padded eager "
             "round token for token at buckets 1/4/8, context copied and bound (no capture fell back)",
             steps_graphs.replay_step, skip=no_graphs, group="graphs"),
        Step(EXPORT16, 75, "the same three engines from a bf16 export", trt.export_step("bf16"), needs=(TRT,),
             skip=no_trt or ("--skip-bf16" if o.skip_bf16 else None), group="tensorrt"),
        Step("tensorrt bf16 engines vs references", 20, "bf16 engines through CUDA graphs pass the bf16 rules "
             "against the reference drafter and transformers (bf16)", trt.validate_step("bf16", ("graph",)),
             needs=(EXPORT16,), skip=no_trt or ("--skip-bf16" if o.skip_bf16 else None), group="tensorrt"),
        Step("tensorrt bf16 generate", 25, "bf16 generation eager and graph (captures asserted); agreement with "
             "onnxruntime's bf16 twin recorded", trt.generate_step("bf16"), needs=(EXPORT16,),
             skip=no_trt or ("--skip-bf16" if o.skip_bf16 else None), group="tensorrt"),
    ]
    for factory in STEP_HOOKS:
        steps += factory(o)
    steps += [
        Step(BENCH, 35 if o.quick else 70, "the fused walk's time against the dense cuBLAS round and its bytes "
             "floor (the goals' measurements)", steps_bench.bench_step,
             skip="--skip-bench" if o.skip_bench else None, group="bench"),
        Step(TIMINGS, 30, "a draft round's time eager vs replayed, and context copied vs bound, per bucket",
             steps_graphs.timing_step, needs=(REPLAY,), skip=no_graphs, group="graphs"),
        Step("kernel: union vs plain time", 10, "the candidate union's cost over the plain kernel (recorded)",
             steps_kernel.union_timing_step, group="kernel"),
    ]
    if o.perf:
        steps.append(Step("perf goals", 1, f"walk >= {goals.WALK_VS_DENSE:g}x dense at B <= 8 and <= "
                          f"{goals.WALK_VS_FLOOR:g}x its floor at B = 64, graph >= {goals.GRAPH_VS_EAGER:g}x eager at "
                          f"B = 1, else FAIL rows", goals.perf_step, group="perf"))
    pytest_skip = "--skip-pytest" if o.skip_pytest else (
        None if steps_pytest.tests_dir().is_dir() else
        f"no tests/ beside the package ({steps_pytest.tests_dir()}): run gpu-check from a source checkout")
    steps.append(Step(f"pytest -m \"{steps_pytest.PYTEST_MARKERS}\"", 60, "the marked GPU and TensorRT tests pass "
                      "(at most 300 s, never past the budget)", steps_pytest.pytest_step, skip=pytest_skip,
                      group="pytest"))
    return steps


def _step_status(rows: list[dict]) -> str:
    statuses = {r["status"] for r in rows}
    for status in ("ERROR", "FAIL", "NOT RUN"):
        if status in statuses:
            return status
    return "PASS" if "PASS" in statuses else ("SKIP" if statuses else "ERROR")


def run_plan(steps: list[Step], run, budget: float, clock: Callable[[], float] = time.monotonic) -> dict[str, str]:
    """Run ``steps`` in order on ``run`` (its ``checks`` get the rows; ``run.budget_left`` is set before each
    step) → each step's outcome (PASS, FAIL, ERROR, SKIP, NOT RUN). A step runs when its expected time fits
    what is left of ``budget`` and every step it needs passed (module docstring)."""
    checks = run.checks
    start = clock()
    outcome: dict[str, str] = {}
    for step in steps:
        if step.skip:
            checks.skip(step.name, step.skip)
            outcome[step.name] = "SKIP"
            continue
        unmet = [(n, outcome.get(n, "not in the plan")) for n in step.needs if outcome.get(n) != "PASS"]
        if unmet:
            need, why = unmet[0]
            if why == "SKIP":
                checks.skip(step.name, f"needs {need}, which was skipped")
                outcome[step.name] = "SKIP"
            else:
                checks.not_run(step.name, f"needs {need} ({why})", step.expected_s)
                outcome[step.name] = "NOT RUN"
            continue
        left = budget - (clock() - start)
        if step.expected_s > left:
            checks.not_run(step.name, f"expected {step.expected_s:g} s, {max(left, 0):.0f} s of the {budget:g} s "
                                      f"budget left", step.expected_s)
            outcome[step.name] = "NOT RUN"
            continue
        run.budget_left = left
        before = len(checks.rows)
        try:
            step.run(run)
        except Exception as e:  # a bug in a step's own code (its checks catch what they run): the step's row
            def crashed(e=e):
                raise e
            checks.run(step.name, crashed)
        rows = checks.rows[before:]
        for row in rows:
            row.setdefault("step", step.name)
        if rows:
            rows[0]["expected_s"] = step.expected_s
        outcome[step.name] = _step_status(rows)
    return outcome


def schedule(steps: list[Step], budget: float) -> list[str]:
    """What ``run_plan`` would do if every step took exactly its expected time and passed: per step "run",
    "skip" or "not run" (past the budget, or a prerequisite not run)."""
    total, out, outcome = 0.0, [], {}
    for step in steps:
        if step.skip or any(outcome.get(n) == "skip" for n in step.needs):
            verdict = "skip"
        elif any(outcome.get(n) != "run" for n in step.needs) or total + step.expected_s > budget:
            verdict = "not run"
        else:
            verdict = "run"
            total += step.expected_s
        outcome[step.name] = verdict
        out.append(verdict)
    return out


def format_plan(steps: list[Step], budget: float) -> str:
    """The plan as text (``--dry-run``): per step its order, expected time, the time by then on the estimates,
    what it proves, and whether it would be skipped or left out by the budget."""
    lines = [f"gpu-check plan (budget {budget:g} s; expected times are estimates for one H100/H200, not measured)", ""]
    total = 0.0
    for i, (step, verdict) in enumerate(zip(steps, schedule(steps, budget)), 1):
        if verdict == "skip":
            mark = f"skipped: {step.skip or 'a step it needs is skipped'}"
        elif verdict == "not run":
            past = total + step.expected_s > budget
            mark = "NOT RUN: past the budget" if past else "NOT RUN: a step it needs is not run"
        else:
            total += step.expected_s
            mark = f"done by ~{total:.0f} s"
        needs = f" (needs {', '.join(step.needs)})" if step.needs else ""
        lines.append(f"{i:2}. {step.name}  ~{step.expected_s:g} s  {mark}{needs}")
        lines.append(f"      proves: {step.proves}")
    hooks = len(STEP_HOOKS)
    lines += ["", f"expected total {total:.0f} s of the {budget:g} s budget; step hooks registered: {hooks}"]
    return "\n".join(lines)
