"""`dspark-export` / `dspark build-engine`: refusals (one line, exit 1, nothing written), exit 3 on a validation
mismatch, atomic --force, the PASSED/FAILED status line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dspark_trt.cli.main import main
from dspark_trt.testing import write_tiny_checkpoint

pytestmark = [pytest.mark.onnx, pytest.mark.triton]


def dspark(*args):
    return subprocess.run([sys.executable, "-m", "dspark_trt.cli.main", *map(str, args)], capture_output=True,
                          text=True, timeout=600)


def one_error_line(proc) -> str:
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return errors[0]


@pytest.fixture(scope="module")
def big_vocab_pair(tmp_path_factory):
    """Draft vocabulary 4000 > TensorRT's TopK limit (3840), tiny otherwise."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("big") / "pair", vocab_size=4000, hidden_size=32,
                                 intermediate_size=48, head_dim=8, markov_rank=8)


@pytest.mark.parametrize("case, message", [
    ("missing", "no config.json"),
    ("not-dspark", "not a DSpark config"),
    ("k>Vd", "top-k 3000 is outside [1, draft_vocab_size=2500]"),
    ("k>3840", "exceeds TensorRT's TopK limit of 3840"),
    ("dtype", "unknown dtype 'int4'"),
    ("batch", "--opt-batch-size 9 must be in [1, --max-batch-size 4]"),
])
def test_bad_input_is_one_line_exit_1_and_writes_nothing(case, message, tiny_pair, big_vocab_pair, tmp_path):
    out = tmp_path / "out"
    args = {
        "missing": [tmp_path / "nope"],
        "not-dspark": [tiny_pair.target],
        "k>Vd": [tiny_pair.drafter, "--topk", "3000"],
        "k>3840": [big_vocab_pair.drafter, "--topk", "3841"],
        "dtype": [tiny_pair.drafter, "--dtype", "int4"],
        "batch": [tiny_pair.drafter, "--topk", "16", "--engine", "none", "--max-batch-size", "4",
                  "--opt-batch-size", "9"],
    }[case]
    proc = dspark("export", *args, "-o", out)
    assert proc.returncode == 1, proc.stderr
    assert message in one_error_line(proc)
    assert proc.stderr.rstrip().splitlines()[-1].startswith("FAILED | ")
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_engine_tensorrt_without_tensorrt_is_refused(tiny_pair, tmp_path):
    from tests.conftest import have_tensorrt

    if have_tensorrt():
        pytest.skip("TensorRT is importable here")
    proc = dspark("export", tiny_pair.drafter, "--engine", "tensorrt", "-o", tmp_path / "out")
    assert proc.returncode == 1 and "full TensorRT is not importable" in one_error_line(proc)
    assert list(tmp_path.iterdir()) == []


def test_existing_output_needs_force_and_force_replaces_it(tiny_pair, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    args = ["export", str(tiny_pair.drafter), "--topk", "16", "--dtype", "fp32", "--engine", "none", "--no-validate",
            "-o", str(out)]
    assert main(args) == 1
    assert "is not empty; pass --force" in capsys.readouterr().err
    assert (out / "mine.txt").read_text() == "keep"
    assert main(args + ["--force"]) == 0
    err = capsys.readouterr().err
    assert err.rstrip().splitlines()[-1].startswith("PASSED | ")
    assert not (out / "mine.txt").exists() and (out / "manifest.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary or old directories left


def test_validation_mismatch_exits_3_and_writes_nothing(tiny_pair, tmp_path, monkeypatch, capsys):
    from dspark_trt.export import validate

    real = validate.compare_context

    def off_by_a_bit(got_k, got_v, ref_k, ref_v, tol, label="context"):
        return real(got_k + 1.0, got_v, ref_k, ref_v, tol, label)  # as if the graph computed wrong keys

    monkeypatch.setattr(validate, "compare_context", off_by_a_bit)
    out = tmp_path / "out"
    status = main(["export", str(tiny_pair.drafter), "--topk", "16", "--dtype", "fp32", "--engine", "none", "-o",
                   str(out)])
    err = capsys.readouterr().err
    assert status == 3 and "exported ONNX disagrees with the reference" in err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_dspark_export_entry_point_is_the_export_subcommand(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "import sys; from dspark_trt.cli.export_entry import main; "
                           "sys.exit(main(['--help']))"], capture_output=True, text=True)
    assert proc.returncode == 0 and "--topk" in proc.stdout and "--engine" in proc.stdout


@pytest.mark.slow
def test_target_validation_mismatch_exits_3_and_writes_nothing(tiny_pair, tmp_path, monkeypatch, capsys):
    """Zero tolerance: onnxruntime's fp32 sums differ from torch's by ~1e-7, so the target check must fail."""
    from dspark_trt.export import validate_target
    from dspark_trt.export.validate import Tolerance

    monkeypatch.setitem(validate_target.TARGET_TOLERANCES, "fp32", Tolerance(0.0, 0.0, "zero, to fail"))
    out = tmp_path / "out"
    status = main(["export", str(tiny_pair.drafter), "--target", str(tiny_pair.target), "--topk", "off", "--dtype",
                   "fp32", "--engine", "none", "-o", str(out)])
    err = capsys.readouterr().err
    assert status == 3 and "the exported target graph disagrees with transformers" in err
    assert not out.exists() and list(tmp_path.iterdir()) == []
