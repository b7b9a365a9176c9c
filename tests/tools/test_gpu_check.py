"""``dspark gpu-check``: a one-line refusal without CUDA (here); the whole check on a GPU host (marked)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dspark_trt.cli.main import main as dspark
from dspark_trt.tools.gpu_check import (Checks, assert_graphs_captured, main as gpu_check, parse_pytest_summary,
                                        pytest_check, pytest_command, qwen3_8b_drafter_config)

REPO = Path(__file__).resolve().parents[2]


def test_without_cuda_it_refuses_in_one_line(capsys, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert dspark(["gpu-check", "--out", str(tmp_path / "out"), "--quick"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no CUDA device is visible" in err[0]
    assert gpu_check(["--out", str(tmp_path / "out")]) == 1
    assert not (tmp_path / "out").exists()  # nothing written


def test_the_drafter_has_the_qwen3_8b_shapes():
    c = qwen3_8b_drafter_config()
    assert (c.hidden_size, c.num_hidden_layers, c.vocab_size, c.markov_rank, c.num_draft_tokens) == (4096, 5, 151936,
                                                                                                    256, 7)
    assert c.num_taps == 5 and c.num_attention_heads // c.num_key_value_heads == 4


def test_checks_record_failures_and_errors_without_stopping(capsys):
    checks = Checks()
    checks.run("ok", lambda: ("fine", {"x": 1}))

    def fail():
        raise AssertionError("tokens differ")

    checks.run("bad", fail)
    checks.run("crash", lambda: 1 / 0)
    assert [r["status"] for r in checks.rows] == ["PASS", "FAIL", "ERROR"] and not checks.passed
    assert checks.rows[0]["data"] == {"x": 1} and "ZeroDivisionError" in checks.rows[2]["detail"]
    json.dumps(checks.rows)
    assert "crash" in checks.table()


def test_a_skipped_check_is_explicit_and_does_not_fail_the_report(capsys):
    checks = Checks()
    checks.run("ok", lambda: "fine")
    checks.skip("tensorrt", "TensorRT not importable: no module")
    assert checks.passed and [r["status"] for r in checks.rows] == ["PASS", "SKIP"]
    assert "SKIP  tensorrt: TensorRT not importable: no module" in capsys.readouterr().out
    assert "tensorrt  SKIP" in checks.table()
    checks.run("bad", lambda: 1 / 0)
    assert not checks.passed


def _runner(role: str, fails: bool):
    """A graph runner claiming graph mode whose capture raises in warm-up (``fails``) or, as on a GPU, succeeds."""
    from dspark_trt.runtime.cuda_graphs import GraphRunner, PadPlan

    def fn(x, key):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    runner = GraphRunner(fn, (), role=role, device="cpu")
    runner.mode = "graph"
    if fails:
        runner._capture(runner._new_entry(PadPlan(4, 4), ()))  # the real fall-back: warns, runs eagerly
    else:
        runner.captures = 2  # what two successful captures leave (CUDA only)
    return runner


def test_a_fall_back_to_eager_is_a_fail_row_where_a_graph_mode_is_claimed(recwarn):
    checks = Checks()
    ok = {"draft (copied)": _runner("draft", False), "target Q=4": _runner("target", False)}
    checks.run("generate graph", lambda: assert_graphs_captured("generate", ok))
    fell = {"draft (copied)": _runner("draft", False), "draft (bound)": _runner("draft", True)}
    checks.run("bound drafter graph", lambda: assert_graphs_captured("generate", fell, need=[tuple(fell)]))
    idle = {"draft (copied)": _runner("draft", False), "target Q=4": _runner("target", False)}
    idle["target Q=4"].captures = 0
    checks.run("target graph", lambda: assert_graphs_captured("target", idle))
    checks.run("any of a group", lambda: assert_graphs_captured("generate", idle, need=[tuple(idle)]))
    assert [r["status"] for r in checks.rows] == ["PASS", "FAIL", "FAIL", "PASS"]
    assert checks.rows[0]["detail"] == "draft (copied) 2 captured, target Q=4 2 captured"
    assert checks.rows[1]["detail"].startswith("generate: draft (bound): the draft round fell back to eager at bucket "
                                               "(batch 4, context 0): RuntimeError: CUDA error")
    assert checks.rows[2]["detail"] == "target: target Q=4: no graph captured (no round ran through the graph runner)"
    assert len([w for w in recwarn if "running it eagerly" in str(w.message)]) == 1  # elsewhere: a warning


def test_a_missing_tensorrt_is_a_fail_row_when_required_and_a_skip_otherwise(monkeypatch):
    """--require-tensorrt (the default on a GPU host): the import error as a FAIL row, and a non-zero exit."""
    import dspark_trt.runtime.tensorrt_engine as engine
    from dspark_trt.tools.gpu_check import exit_status
    from dspark_trt.tools.gpu_check.steps_tensorrt import tensorrt_requirement

    why = "full TensorRT is not importable (libnvinfer.so.10: cannot open shared object file)"
    monkeypatch.setattr(engine, "tensorrt_available", lambda: why)
    checks = Checks()
    assert tensorrt_requirement(checks, required=True) == why
    (row,) = checks.rows
    assert row["status"] == "FAIL" and row["detail"].startswith(f"TensorRT not importable: {why}")
    assert exit_status(checks) == 3
    relaxed = Checks()
    tensorrt_requirement(relaxed, required=False)
    assert [r["status"] for r in relaxed.rows] == ["SKIP"] and exit_status(relaxed) == 0
    skipped = Checks()
    tensorrt_requirement(skipped, required=True, skip="--skip-tensorrt")
    assert skipped.rows[0]["status"] == "SKIP" and skipped.rows[0]["detail"] == "--skip-tensorrt"


def test_require_tensorrt_defaults_to_whether_a_gpu_is_present():
    import argparse

    from dspark_trt.tools.gpu_check import add_arguments
    from dspark_trt.tools.gpu_check.cli import options_from_args

    p = argparse.ArgumentParser()
    add_arguments(p)
    assert options_from_args(p.parse_args([])).require_tensorrt is torch.cuda.is_available()
    assert options_from_args(p.parse_args(["--require-tensorrt"])).require_tensorrt is True
    assert options_from_args(p.parse_args(["--no-require-tensorrt"])).require_tensorrt is False


def test_pytest_command_runs_without_xdist_and_never_runs_gpu_check_inside_itself():
    cmd = pytest_command(["tests"])
    assert cmd[1:5] == ["-m", "pytest", "tests", "-m"] and cmd[5] == "tensorrt or gpu"
    assert "addopts=-ra --strict-markers" in cmd  # the project's --dist (pytest-xdist) replaced
    assert cmd[cmd.index("--deselect") + 1] == "tests/tools/test_gpu_check.py::test_gpu_check_quick_passes"


@pytest.mark.parametrize("text, counts", [
    ("....\n4 passed, 2 skipped, 190 deselected in 12.31s\n", {"passed": 4, "skipped": 2, "deselected": 190}),
    ("F.\nFAILED tests/a.py::t - x\n=== 1 failed, 1 passed, 1 error in 3.0s ===", {"failed": 1, "passed": 1,
                                                                                   "errors": 1}),
    ("\n=== 12 deselected in 0.5s ===", {"deselected": 12}),
    ("ImportError while loading conftest", {}),
])
def test_pytest_summary_is_parsed(text, counts):
    assert parse_pytest_summary(text) == counts


def test_the_pytest_step_runs_the_marked_tests_of_a_checkout():
    """A real child pytest: here the one gpu-marked test of the file is collected and skipped (no CUDA)."""
    detail, data = pytest_check(REPO, paths=[REPO / "tests" / "runtime" / "test_device_memory.py"], timeout=120)
    want = {"passed": 1, "deselected": 6} if torch.cuda.is_available() else {"skipped": 1, "deselected": 6}
    assert data["counts"] == want and data["returncode"] == 0 and data["failing"] == [], detail


@pytest.mark.gpu
@pytest.mark.triton
@pytest.mark.slow
def test_gpu_check_quick_passes(tmp_path):
    assert gpu_check(["--out", str(tmp_path), "--quick", "--skip-bench", "--layers", "1", "--context", "256",
                      "--skip-pytest", "--budget", "1800"]) == 0
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["passed"] and report["complete"] and report["finished"]
    by_kind = {kind: [g["batch"] for g in report["graphs"] if g["kind"] == kind]
               for kind in ("eager_vs_graph", "copied_vs_bound")}
    assert by_kind == {"eager_vs_graph": [1, 4, 8], "copied_vs_bound": [1, 4, 8]} and len(report["graphs"]) == 6
    assert all("speedup" in g for g in report["graphs"] if g["kind"] == "eager_vs_graph")
    assert all("bound_over_copied" in g for g in report["graphs"] if g["kind"] == "copied_vs_bound")


@pytest.mark.triton
def test_the_union_checks_run_in_the_interpreter():
    """The GPU check's union pieces on CPU tensors (Triton's interpreter, small shapes): the correctness check
    passes and sees masked duplicates, and the timing rows are shaped as the report expects."""
    from dspark_trt.plugins.kernel import interpreting
    from dspark_trt.plugins.walk_compare import WalkCase
    from dspark_trt.tools.gpu_check.steps_kernel import jit_union_case, union_timing

    if not interpreting():
        pytest.skip("the interpreter is off (a GPU host runs the real check)")
    case = WalkCase(batch=3, steps=3, vocab=257, rank=8, topk=16, mode="mixed", seed=1)
    detail = jit_union_case(case, 5, device="cpu")
    assert "9 steps" in detail and "masked duplicates" in detail
    detail, data = union_timing((2,), k=16, M=5, shapes=dict(vocab=257, rank=8, steps=3), device="cpu", repeats=1)
    (row,) = data["rows"]
    assert row["batch"] == 2 and row["markov_topm"] == 5 and row["union_ms"] > 0 and row["plain_ms"] > 0
    assert row["union_vs_plain"] == pytest.approx(row["union_ms"] / row["plain_ms"], rel=1e-2) and "x plain" in detail
