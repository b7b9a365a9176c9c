"""``dspark gpu-check``: a one-line refusal without CUDA (here); the whole check on a GPU host (marked)."""

from __future__ import annotations

import json

import pytest
import torch

from dspark_trt.cli.main import main as dspark
from dspark_trt.tools.gpu_check import Checks, main as gpu_check, qwen3_8b_drafter_config


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


@pytest.mark.gpu
@pytest.mark.triton
@pytest.mark.slow
def test_gpu_check_quick_passes(tmp_path):
    assert gpu_check(["--out", str(tmp_path), "--quick", "--skip-bench", "--layers", "1", "--context", "256"]) == 0
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["passed"] and [g["batch"] for g in report["graphs"]] == [1, 4, 8]


@pytest.mark.triton
def test_the_union_checks_run_in_the_interpreter():
    """The GPU check's union pieces on CPU tensors (Triton's interpreter, small shapes): the correctness check
    passes and sees masked duplicates, and the timing rows are shaped as the report expects."""
    from dspark_trt.plugins.kernel import interpreting
    from dspark_trt.testing.walk import WalkCase
    from dspark_trt.tools.gpu_check import _jit_union_case, _union_timing

    if not interpreting():
        pytest.skip("the interpreter is off (a GPU host runs the real check)")
    case = WalkCase(batch=3, steps=3, vocab=257, rank=8, topk=16, mode="mixed", seed=1)
    detail = _jit_union_case(case, 5, device="cpu")
    assert "9 steps" in detail and "masked duplicates" in detail
    detail, data = _union_timing((2,), k=16, M=5, shapes=dict(vocab=257, rank=8, steps=3), device="cpu", repeats=1)
    (row,) = data["rows"]
    assert row["batch"] == 2 and row["markov_topm"] == 5 and row["union_ms"] > 0 and row["plain_ms"] > 0
    assert row["union_vs_plain"] == pytest.approx(row["union_ms"] / row["plain_ms"], rel=1e-2) and "x plain" in detail
