"""gpu-check's plan on the CPU: the budget (a fake clock), the report rewritten after every row, the dry run,
the --perf decision, the fresh-process child's verdicts, and the TensorRT tolerance rule."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from dspark_trt.tools.gpu_check import (Checks, Options, ReportWriter, Step, build_plan, exit_status, format_plan,
                                        main as gpu_check, run_plan, schedule)


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class FakeRun:
    def __init__(self, checks):
        self.checks, self.budget_left = checks, 0.0


def _step(name, expected, clock, *, took=None, fails=False, needs=(), skip=None):
    """A step that adds one row and advances the fake clock by ``took`` (default: its expected time)."""
    def run(r):
        def body():
            clock.now += expected if took is None else took
            assert not fails, f"{name} disagrees"
            return f"{name} ok"
        r.checks.run(name, body)
    return Step(name, expected, f"proves {name}", run, needs=needs, skip=skip)


def test_steps_that_would_not_fit_the_budget_are_listed_as_not_run():
    clock = FakeClock()
    steps = [_step("a", 100, clock), _step("b", 300, clock, took=350), _step("c", 100, clock),
             _step("d", 20, clock), _step("e", 5, clock, needs=("c",))]
    run = FakeRun(Checks())
    outcome = run_plan(steps, run, budget=480, clock=clock)
    # a: 100 s; b ran long (350 s): 30 s left — c (100 s) does not fit, d (20 s) still does, e needs c
    assert outcome == {"a": "PASS", "b": "PASS", "c": "NOT RUN", "d": "PASS", "e": "NOT RUN"}
    rows = {r["check"]: r for r in run.checks.rows}
    assert rows["c"]["detail"] == "expected 100 s, 30 s of the 480 s budget left" and rows["c"]["expected_s"] == 100
    assert rows["e"]["detail"] == "needs c (NOT RUN)"
    assert run.checks.passed and not run.checks.complete and exit_status(run.checks) == 0
    assert rows["a"]["step"] == "a" and rows["a"]["expected_s"] == 100


def test_a_failed_prerequisite_leaves_its_dependents_not_run_and_a_skipped_one_skips_them():
    clock = FakeClock()
    steps = [_step("export", 10, clock, fails=True), _step("generate", 10, clock, needs=("export",)),
             _step("trt", 1, clock, skip="--skip-tensorrt"), _step("bf16", 10, clock, needs=("trt",))]
    run = FakeRun(Checks())
    outcome = run_plan(steps, run, budget=480, clock=clock)
    assert outcome == {"export": "FAIL", "generate": "NOT RUN", "trt": "SKIP", "bf16": "SKIP"}
    assert run.checks.rows[-1]["detail"] == "needs trt, which was skipped"
    assert exit_status(run.checks) == 3


def test_a_step_that_crashes_outside_its_checks_is_an_error_row():
    def broken(run):
        raise KeyError("fp32")

    run = FakeRun(Checks())
    assert run_plan([Step("broken", 1, "", broken)], run, budget=10, clock=FakeClock()) == {"broken": "ERROR"}
    assert run.checks.rows[0]["detail"] == "KeyError: 'fp32'"


def test_the_report_is_rewritten_after_every_row(tmp_path):
    """A run killed after its second row leaves a report with both rows in it (written atomically)."""
    clock = FakeClock()
    checks = Checks()
    path = tmp_path / "gpu_check.json"
    writer = ReportWriter(path, lambda: {"checks": checks.rows, "passed": checks.passed, "finished": False})
    checks.on_row = writer.write
    seen = []

    def killed(r):
        seen.append(json.loads(path.read_text()))  # what a reader finds while the third step runs
        raise KeyboardInterrupt

    steps = [_step("a", 1, clock), _step("b", 1, clock, fails=True), Step("c", 1, "", killed)]
    with pytest.raises(KeyboardInterrupt):
        run_plan(steps, FakeRun(checks), budget=480, clock=clock)
    report = json.loads(path.read_text())
    assert [r["check"] for r in report["checks"]] == ["a", "b"] and report["passed"] is False
    assert seen == [report] and writer.writes == 2
    assert [p.name for p in tmp_path.iterdir()] == ["gpu_check.json"]  # no temporary file left behind


def test_the_plan_orders_the_tensorrt_path_before_the_measurements():
    names = [s.name for s in build_plan(Options())]
    assert names[0] == "tensorrt importable"
    assert names.index("tensorrt fp32 generate") < names.index("graphs: replay == eager") < names.index(
        "bench markov --device cuda")
    for row in ("tensorrt fp32 fresh process", "tensorrt fp32 long prompt", "tensorrt fp32 K/V growth",
                "tensorrt export bf16", "tensorrt bf16 generate"):
        assert row in names
    assert "perf goals" not in names and "perf goals" in [s.name for s in build_plan(Options(perf=True))]
    skipped = {s.name: s.skip for s in build_plan(Options(skip_tensorrt=True, skip_bench=True))}
    assert skipped["tensorrt export fp32"] == "--skip-tensorrt"
    assert skipped["bench markov --device cuda"] == "--skip-bench"


def test_schedule_follows_the_budget_on_the_estimates():
    steps = [Step("a", 100, ""), Step("b", 300, ""), Step("c", 100, "", needs=("b",)), Step("d", 50, ""),
             Step("e", 10, "", skip="--skip-e")]
    assert schedule(steps, 480) == ["run", "run", "not run", "run", "skip"]  # c past it, d still fits
    assert schedule(steps, 420) == ["run", "run", "not run", "not run", "skip"]
    assert schedule(steps, 300) == ["run", "not run", "not run", "run", "skip"]


def test_dry_run_prints_the_plan_on_a_cpu_host(capsys, tmp_path):
    assert gpu_check(["--dry-run", "--budget", "200"]) == 0
    out = capsys.readouterr().out
    assert "gpu-check plan (budget 200 s" in out
    assert " 1. tensorrt importable  ~2 s  done by ~2 s" in out
    assert "proves: the engines deserialize in a process that imports only tensorrt" in out
    assert "NOT RUN: past the budget" in out  # 200 s holds only the first steps
    assert "the gated and RNN head kernels JIT and AOT" in out and "step hooks registered: 0" in out
    assert gpu_check(["--dry-run", "--skip-tensorrt", "--out", str(tmp_path / "x")]) == 0
    assert "skipped: --skip-tensorrt" in capsys.readouterr().out and not (tmp_path / "x").exists()
    assert gpu_check(["--dry-run", "--budget", "0"]) == 1  # a budget must be positive


def test_format_plan_names_every_step_with_its_time():
    steps = [Step("a", 100, "proves a"), Step("b", 400, "proves b", needs=("a",)), Step("c", 10, "x", skip="--no")]
    text = format_plan(steps, 480)
    assert " 1. a  ~100 s  done by ~100 s" in text and " 2. b  ~400 s  NOT RUN: past the budget (needs a)" in text
    assert " 3. c  ~10 s  skipped: --no" in text and "expected total 100 s of the 480 s budget" in text


BENCH = [{"topk": 512, "batch": b, "kernel_ms": 0.1, "kernel_speedup": s, "kernel_vs_floor": f}
         for b, s, f in ((1, 14.0, 2.0), (8, 11.5, 1.7), (64, 6.0, 1.3))]
GRAPHS = [{"kind": "eager_vs_graph", "batch": 1, "speedup": 3.4},
          {"kind": "eager_vs_graph", "batch": 8, "speedup": 1.2}]


def test_perf_goals_met():
    from dspark_trt.tools.gpu_check.goals import perf_verdicts

    verdicts = perf_verdicts(BENCH, GRAPHS)
    assert [met for _, met, _ in verdicts] == [True, True, True]
    assert verdicts[0][2] == "B=1: 14.0x, B=8: 11.5x"


def test_perf_goals_missed_or_not_measured_are_fail_rows():
    from dspark_trt.tools.gpu_check.goals import perf_step, perf_verdicts

    slow = [dict(r, kernel_speedup=9.9) if r["batch"] == 8 else dict(r) for r in BENCH]
    slow[2]["kernel_vs_floor"] = 1.6
    assert [met for _, met, _ in perf_verdicts(slow, [dict(GRAPHS[0], speedup=2.9)])] == [False, False, False]
    verdicts = perf_verdicts(None, [])
    assert all(not met for _, met, _ in verdicts) and verdicts[0][2] == "not measured: bench markov did not run"
    run = FakeRun(Checks())
    run.results = {"bench_markov": slow, "graphs": GRAPHS}
    perf_step(run)
    assert [r["status"] for r in run.checks.rows] == ["FAIL", "FAIL", "PASS"]
    assert run.checks.rows[0]["detail"] == "B=1: 14.0x, B=8: 9.9x" and exit_status(run.checks) == 3


@pytest.mark.parametrize("dtype, build, rules", [("fp32", {"tf32": False}, "fp32"), ("fp32", {"tf32": True}, "fp16"),
                                                 ("fp32", {}, "fp16"), ("bf16", {"tf32": True}, "bf16")])
def test_engine_tolerance_holds_fp32_engines_to_fp32_rules_only_without_tf32(dtype, build, rules):
    from dspark_trt.tools.gpu_check.steps_tensorrt import engine_tolerance

    assert engine_tolerance(dtype, build) == rules


def test_the_target_capacities_captured_are_read_from_every_capture():
    from types import SimpleNamespace

    from dspark_trt.runtime.cuda_graphs import GraphKey
    from dspark_trt.tools.gpu_check.steps_long import capacities_captured

    runners = {"target Q=4": SimpleNamespace(captured_keys=[GraphKey("target", 2, 160), GraphKey("target", 2, 192)]),
               "target Q=8": SimpleNamespace(captured_keys=[GraphKey("target", 2, 160)])}
    assert capacities_captured(runners) == [160, 192]


# ------------------------------------------------------------------------------------------ fresh process
FAKE_TENSORRT = textwrap.dedent('''
    """A stand-in for the binding: deserialize_cuda_engine returns None for a plan it cannot read (and logs)."""
    __version__ = "10.13.0.35"

    class Logger:
        ERROR = 1
        def __init__(self, severity): pass

    class _Engine:
        num_io_tensors, num_optimization_profiles = 12, 2
        def create_execution_context(self): return object()

    class Runtime:
        def __init__(self, logger): pass
        def deserialize_cuda_engine(self, data):
            return _Engine() if bytes(data).startswith(b"ftrt") else None
''')


def _bare_child(tmp_path, engines: dict[str, bytes]):
    from dspark_trt.tools.gpu_check.fresh_load import BARE_SCRIPT, child_command, parse_result

    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "tensorrt.py").write_text(FAKE_TENSORRT)
    export = tmp_path / "export"
    (export / "engines").mkdir(parents=True)
    manifest = {"engines": {}}
    for name, data in engines.items():
        (export / "engines" / f"{name}.plan").write_bytes(data)
        manifest["engines"][f"{name}.tensorrt"] = {"file": f"engines/{name}.plan", "flavor": "tensorrt"}
    manifest["engines"]["draft.tensorrt-rtx"] = {"file": "engines/x.rtx.plan", "flavor": "tensorrt-rtx"}
    (export / "manifest.json").write_text(json.dumps(manifest))
    proc = subprocess.run(child_command(BARE_SCRIPT, export), capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(tmp_path / "fake"), "PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return parse_result(proc.stdout)


def test_the_bare_child_loads_every_engine_with_tensorrt_alone(tmp_path):
    from dspark_trt.tools.gpu_check.fresh_load import check_bare

    result = _bare_child(tmp_path, {"context": b"ftrt1", "draft": b"ftrt2", "target": b"ftrt3"})
    assert set(result["engines"]) == {"context.tensorrt", "draft.tensorrt", "target.tensorrt"}  # RTX left out
    assert result["dspark_modules"] == [] and result["engines"]["target.tensorrt"]["profiles"] == 2
    assert check_bare(result) == "3 engines deserialized by TensorRT 10.13.0.35 alone"


def test_an_engine_a_fresh_process_cannot_deserialize_fails_the_row(tmp_path):
    from dspark_trt.tools.gpu_check.fresh_load import check_bare

    result = _bare_child(tmp_path, {"context": b"ftrt1", "draft": b"needs a plugin creator"})
    assert result["engines"]["draft.tensorrt"] == {"deserialized": False}
    checks = Checks()
    checks.run("fresh", lambda: check_bare(result))
    assert checks.rows[0]["status"] == "FAIL" and "could not deserialize draft.tensorrt" in checks.rows[0]["detail"]
    with pytest.raises(AssertionError, match="imported"):
        check_bare({"engines": {"a": {"deserialized": True, "context": True}}, "dspark_modules": ["dspark_trt"]})


def test_a_child_without_a_result_line_is_a_failure():
    from dspark_trt.tools.gpu_check.fresh_load import parse_result

    assert parse_result("noise\nRESULT {\"a\": 1}\nRESULT {\"a\": 2}\n") == {"a": 2}
    with pytest.raises(AssertionError, match="printed no result: Traceback"):
        parse_result("Traceback (most recent call last): ...")
    assert sys.executable  # the children run this interpreter
