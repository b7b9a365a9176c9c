"""`dspark-export` / `dspark build-engine`: refusals (one line, exit 1, nothing written), exit 3 on a validation
mismatch, atomic --force, the PASSED/FAILED status line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dspark_trt.cli.main import main
from dspark_trt.synthetic import write_tiny_checkpoint
from tests.helpers import sigint_as_in_a_terminal

pytestmark = [pytest.mark.onnx, pytest.mark.triton]


def dspark(*args):
    return subprocess.run([sys.executable, "-m", "dspark_trt.cli.main", *map(str, args)], capture_output=True,
                          text=True, timeout=600)


def dspark_here(capsys, *args):
    """``dspark ARGS`` in this process → (returncode, stderr), as ``dspark`` gives them."""
    from types import SimpleNamespace

    capsys.readouterr()
    code = main([str(a) for a in args])
    return SimpleNamespace(returncode=code, stderr=capsys.readouterr().err)


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
    ("missing", "nope does not exist: pass a DSpark drafter checkpoint directory"),
    ("file", "model.safetensors is a file, not a checkpoint directory: pass the DSpark drafter checkpoint directory"),
    ("not-dspark", "not a DSpark config"),
    ("k>Vd", "top-k 3000 is outside [1, draft_vocab_size=2500]"),
    ("k>3840", "exceeds TensorRT's TopK limit of 3840"),
    ("dtype", "unknown dtype 'int4'"),
    ("batch", "--opt-batch-size 9 must be in [1, --max-batch-size 4]"),
    ("union+off", "--markov-topm 5 needs a top-k export"),
    ("union>Vd", "--markov-topm 2501 must be an integer in [0, draft_vocab_size=2500]"),
    ("union<0", "--markov-topm -1: use an integer M >= 0"),
    ("vc+plugin", "--version-compatible with the DSparkTopKMarkov AOT plugin is not supported"),
    ("vc+union", "--version-compatible with the DSparkTopKMarkovUnion AOT plugin is not supported"),
])
def test_bad_input_is_one_line_exit_1_and_writes_nothing(case, message, tiny_pair, big_vocab_pair, tmp_path, capsys):
    """In this process (``main``, as the entry point runs it): a refusal needs no process of its own; the ones
    below run ``python -m dspark_trt.cli.main`` whole."""
    out = tmp_path / "out"
    args = {
        "missing": [tmp_path / "nope"],
        "file": [tiny_pair.drafter / "model.safetensors"],
        "not-dspark": [tiny_pair.target],
        "k>Vd": [tiny_pair.drafter, "--topk", "3000"],
        "k>3840": [big_vocab_pair.drafter, "--topk", "3841"],
        "dtype": [tiny_pair.drafter, "--dtype", "int4"],
        "batch": [tiny_pair.drafter, "--topk", "16", "--engine", "none", "--max-batch-size", "4",
                  "--opt-batch-size", "9"],
        "union+off": [tiny_pair.drafter, "--topk", "off", "--markov-topm", "5"],
        "union>Vd": [tiny_pair.drafter, "--topk", "16", "--markov-topm", "2501"],
        "union<0": [tiny_pair.drafter, "--topk", "16", "--markov-topm=-1"],
        "vc+plugin": [tiny_pair.drafter, "--topk", "16", "--engine", "none", "--version-compatible"],
        "vc+union": [tiny_pair.drafter, "--topk", "16", "--markov-topm", "4", "--engine", "none",
                     "--version-compatible"],
    }[case]
    proc = dspark_here(capsys, "export", *args, "-o", out)
    assert proc.returncode == 1, proc.stderr
    assert message in one_error_line(proc)
    assert proc.stderr.rstrip().splitlines()[-1].startswith("FAILED | ")
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.rtx
def test_version_compatible_with_tensorrt_rtx_is_refused_up_front(tiny_pair, tmp_path):
    """It used to fail after the whole ONNX export with a raw libnvinfer_lean.so.1 error."""
    proc = dspark("export", tiny_pair.drafter, "--engine", "tensorrt-rtx", "--version-compatible", "-o",
                  tmp_path / "out")
    assert proc.returncode == 1 and "--version-compatible is a full-TensorRT option" in one_error_line(proc)
    assert "exporting ONNX" not in proc.stderr and list(tmp_path.iterdir()) == []


def test_engine_tensorrt_without_tensorrt_is_refused(tiny_pair, tmp_path):
    from tests.conftest import have_tensorrt

    if have_tensorrt():
        pytest.skip("TensorRT is importable here")
    proc = dspark("export", tiny_pair.drafter, "--engine", "tensorrt", "-o", tmp_path / "out")
    assert proc.returncode == 1 and "full TensorRT is not importable" in one_error_line(proc)
    assert list(tmp_path.iterdir()) == []


FAST = ["--topk", "off", "--dtype", "fp32", "--engine", "none", "--no-validate", "--skip-target"]


@pytest.mark.slow
def test_force_replaces_only_an_earlier_export_and_dot_is_the_working_directory(tiny_pair, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("keep")
    args = ["export", str(tiny_pair.drafter), *FAST, "-o", str(out)]
    for force in ([], ["--force"]):  # the user's directory is refused either way, before any work
        assert main(args + force) == 1
        assert "holds no earlier dspark output (no manifest.json); --force replaces only" in capsys.readouterr().err
        assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "keep"
    (out / "notes.txt").unlink()
    # `dspark-export -o .` in an empty working directory: the export lands there, nothing else is left
    proc = subprocess.run([sys.executable, "-m", "dspark_trt.cli.main", *args[:-1], "."], capture_output=True,
                          text=True, cwd=out, timeout=600)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    first = (out / "manifest.json").read_text()
    assert main(args) == 1 and "holds an earlier output; pass --force" in capsys.readouterr().err
    assert main(args + ["--force"]) == 0
    err = capsys.readouterr().err
    assert err.rstrip().splitlines()[-1].startswith("PASSED | ")
    assert "no engine was built (--engine none)" in err and "importable" not in err  # it may well be importable
    assert "[1/3] trace ONNX graphs (not validated)" in err and "validate ONNX" not in err  # --no-validate
    assert (out / "manifest.json").read_text() != first  # (its creation time differs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary or old directories left
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "onnx"]


def test_output_below_a_file_is_one_line(tiny_pair, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    proc = dspark("export", tiny_pair.drafter, *FAST, "-o", tmp_path / "notes.txt" / "sub")
    assert proc.returncode == 1
    assert f"{tmp_path / 'notes.txt'} is a file, not a directory" in one_error_line(proc)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


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
@pytest.mark.rtx
def test_ctrl_c_during_the_engine_build_stops_cleans_up_and_exits_130(tiny_pair, tmp_path):
    """A real TensorRT-RTX build of the tiny pair, interrupted by SIGINT once TensorRT reports its first phase:
    TensorRT's callbacks must not swallow it (the export used to go on and print PASSED)."""
    import signal

    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "dspark_trt.cli.main", "export", str(tiny_pair.drafter), "--topk",
                             "off", "--dtype", "fp32", "--no-validate", "--engine", "tensorrt-rtx", "-o", str(out)],
                            stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, preexec_fn=sigint_as_in_a_terminal)
    lines = []
    for line in proc.stderr:  # [I] engine build: <phase> (n steps) — emitted from inside the build
        lines.append(line)
        if "engine build:" in line:
            proc.send_signal(signal.SIGINT)
            break
    rest, _ = proc.communicate(timeout=600)[::-1]
    stderr = "".join(lines) + rest
    assert proc.returncode == 130, stderr
    assert "error: interrupted" in stderr and "PASSED" not in stderr and "Traceback" not in stderr, stderr
    assert stderr.rstrip().splitlines()[-1].startswith("FAILED | ")
    assert list(tmp_path.iterdir()) == []  # nothing written, no temporary directory left


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
