"""Export loaders: argument checks (one-line errors with the fix), laziness, saving, reading back, validation."""

from __future__ import annotations

import json

import pytest
import torch

from dspark_trt.errors import DSparkTrtError
from dspark_trt.export.onnx import ExportSpec, OnnxFromCheckpoint, OnnxFromDir, SaveOnnx
from dspark_trt.synthetic import tiny_config


def one_line_error(excinfo, *fragments):
    message = str(excinfo.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize("options, fragments", [
    (dict(dtype="fp8"), ["unknown dtype 'fp8'", "fp32, fp16, bf16"]),
    (dict(topk=2501), ["top-k 2501", "draft_vocab_size=2500", "--topk <= 2500"]),
    (dict(topk=-3), ["--topk -3: use an integer K >= 1", "or 'off'"]),
    (dict(topk="-5"), ["--topk -5: use an integer K >= 1", "or 'off'"]),  # was "not a number"
    (dict(topk="0"), ["--topk 0: use an integer K >= 1", "or 'off'"]),  # was silently dense
    (dict(topk="many"), ["--topk many: use an integer K >= 1", "or 'off'"]),
    (dict(block_size=8), ["block size 8", "block_size 7", "pass 7"]),
    (dict(max_context=1), ["max context 1", "--max-context"]),
    (dict(target="tensorrt-llm"), ["unknown export target", "'tensorrt' or 'onnxruntime'"]),
])
def test_bad_export_arguments(options, fragments):
    with pytest.raises(DSparkTrtError) as excinfo:
        ExportSpec.resolve(tiny_config(), **options)
    one_line_error(excinfo, *fragments)


def test_topk_above_tensorrt_limit_only_for_tensorrt():
    config = tiny_config(vocab_size=5000)
    with pytest.raises(DSparkTrtError) as excinfo:
        ExportSpec.resolve(config, topk=4000, dtype="fp32")
    one_line_error(excinfo, "TensorRT's TopK limit of 3840", "--topk <= 3840")
    assert ExportSpec.resolve(config, topk=4000, dtype="fp32", target="onnxruntime").topk == 4000
    assert ExportSpec.resolve(config, topk=3840, dtype="fp32").topk == 3840


@pytest.mark.parametrize("topk, expected", [(None, None), ("off", None), ("OFF", None), ("16", 16), (2500, 2500)])
def test_topk_spellings(topk, expected):
    assert ExportSpec.resolve(tiny_config(), topk=topk).topk == expected


def test_checkpoint_topk_is_the_default():
    """vLLM's dspark_draft_topk / draft_topk in the checkpoint selects k unless the caller says otherwise."""
    config = tiny_config().replace(draft_topk=32)
    assert ExportSpec.resolve(config).topk == 32
    assert ExportSpec.resolve(config, topk="off").topk is None


def test_loaders_are_lazy(tmp_path):
    """Constructing a pipeline touches nothing; a bad dtype fails at construction, before any loading."""
    pipeline = SaveOnnx(OnnxFromCheckpoint(tmp_path / "missing", dtype="fp32"), tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(DSparkTrtError, match="does not exist"):
        pipeline()
    with pytest.raises(DSparkTrtError, match="unknown dtype"):
        OnnxFromCheckpoint(tmp_path / "missing", dtype="int4")


def test_bad_arguments_fail_before_exporting(tiny_pair, tmp_path, monkeypatch):
    import dspark_trt.export.graphs as graphs

    monkeypatch.setattr(graphs, "export_draft", lambda *a, **k: pytest.fail("exported despite a bad argument"))
    with pytest.raises(DSparkTrtError, match="top-k 9999"):
        OnnxFromCheckpoint(tiny_pair.drafter, target_dir=tiny_pair.target, dtype="fp32", topk=9999)()


@pytest.mark.onnx
def test_save_read_back_and_refuse_to_overwrite(tiny_pair, onnx_export, tmp_path):
    exported = OnnxFromDir(onnx_export(tiny_pair, "fp32", 16))()
    assert exported.spec == ExportSpec(topk=16, dtype="fp32", max_context=8192, target="onnxruntime")
    assert exported.validation and all("FAIL" not in line for line in exported.validation)

    out = SaveOnnx(exported, tmp_path / "export")()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["num_draft_tokens"] == 7 and manifest["drafter"]["spec"]["topk"] == 16
    assert not (out / "onnx" / "onnx_export.json").exists()  # one manifest
    assert [i["name"] for i in manifest["graphs"]["draft"]["inputs"]] == [
        "anchor", "ctx_key_0", "ctx_key_1", "ctx_value_0", "ctx_value_1", "ctx_len", "ctx_start", "temperature",
        "seed"]
    names = sorted(p.name for p in out.iterdir())
    again = OnnxFromDir(out)()
    assert again.config == exported.config and again.spec == exported.spec

    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine")
    for force in (False, True):  # not an earlier ONNX export: refused even with force
        with pytest.raises(DSparkTrtError, match="no manifest.json"):
            SaveOnnx(exported, tmp_path / "busy", force=force)()
        assert [p.name for p in (tmp_path / "busy").iterdir()] == ["keep.txt"]
    with pytest.raises(DSparkTrtError, match="holds an earlier output; pass --force"):
        SaveOnnx(exported, out)()
    SaveOnnx(exported, out, force=True)()
    assert sorted(p.name for p in out.iterdir()) == names and OnnxFromDir(out)().spec == exported.spec
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy", "export"]


def test_read_back_rejects_other_directories(tmp_path):
    with pytest.raises(DSparkTrtError, match="not an ONNX export directory"):
        OnnxFromDir(tmp_path)()
    (tmp_path / "onnx_export.json").write_text(json.dumps({"format_version": 99}))  # an older layout, too new
    with pytest.raises(DSparkTrtError, match="format_version 99"):
        OnnxFromDir(tmp_path)()
    (tmp_path / "manifest.json").write_text(json.dumps({"format_version": 99}))
    with pytest.raises(DSparkTrtError, match="format_version 99"):
        OnnxFromDir(tmp_path)()


@pytest.mark.onnx
def test_validation_mismatch_raises_and_exits_3(tiny_pair, onnx_export, caplog):
    """Graphs checked against a drafter that differs slightly (lm_head × 1.02): ValidationMismatch, exit 3."""
    import argparse

    from dspark_trt import load_drafter
    from dspark_trt.cli.common import EXIT_MISMATCH, run_guarded
    from dspark_trt.errors import ValidationMismatch
    from dspark_trt.runtime.ort_session import OrtGraph
    from dspark_trt.export.validate import validate_onnx

    path = onnx_export(tiny_pair, "fp32", 16)
    graphs = OrtGraph(path / "onnx" / "context.onnx"), OrtGraph(path / "onnx" / "draft.onnx")
    drafter = load_drafter(tiny_pair.drafter, dtype="fp32", target_dir=tiny_pair.target)
    report = validate_onnx(*graphs, drafter, topk=16, dtype="fp32", raise_on_failure=False)
    assert report.ok, report.lines()
    assert any("max |Δ|" in line for line in report.lines()) and "MLAS" in report.lines()[0]  # reason printed

    with torch.no_grad():
        drafter.lm_head.weight.mul_(1.02)
    with pytest.raises(ValidationMismatch, match="disagrees with the reference"):
        validate_onnx(*graphs, drafter, topk=16, dtype="fp32")
    status = run_guarded(lambda args: validate_onnx(*graphs, drafter, topk=16, dtype="fp32") and 0,
                         argparse.Namespace())
    assert status == EXIT_MISMATCH == 3


@pytest.mark.onnx
@pytest.mark.slow  # a fresh fp16 export of the awkward pair (~15 s)
def test_export_from_checkpoint_end_to_end(tiny_odd_pair, tmp_path, caplog):
    """OnnxFromCheckpoint → SaveOnnx with validation on (the default), logging every check."""
    import logging

    caplog.set_level(logging.INFO, logger="dspark.export")
    out = SaveOnnx(OnnxFromCheckpoint(tiny_odd_pair.drafter, target_dir=tiny_odd_pair.target, dtype="fp16",
                                      topk=16, max_context=512), tmp_path / "odd")()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["drafter"]["spec"] == {"topk": 16, "dtype": "fp16", "max_context": 512, "target": "tensorrt", "markov_topm": 0}
    assert manifest["op_contract_version"] == 1 and manifest["markov_topm"] == 0
    assert manifest["validation"][0].startswith("validation (fp16")
    assert any("B=3 sampled draft tokens" in r.message for r in caplog.records)


@pytest.mark.onnx
def test_large_weights_go_to_external_data(tiny_pair, onnx_export, tmp_path, monkeypatch):
    """Above the threshold (1.5 GiB; here forced to 0) weights are written beside the graph, and every reader
    (onnx_ir, onnxruntime through OrtGraph, the checker by path) still finds them."""
    import onnx

    import dspark_trt.export.onnx as export_onnx
    from dspark_trt.runtime.drafter_graphs import run_context
    from dspark_trt.runtime.ort_session import OrtGraph
    from dspark_trt.plugins.onnx_op import register_schema

    source = onnx_export(tiny_pair, "fp32", 16)  # the shared export, written before the threshold changes
    monkeypatch.setattr(export_onnx, "EXTERNAL_DATA_BYTES", 0)
    out = SaveOnnx(OnnxFromDir(source)(), tmp_path / "big")()
    assert (out / "onnx" / "draft.onnx.data").is_file() and (out / "onnx" / "context.onnx.data").is_file()
    assert (out / "onnx" / "draft.onnx").stat().st_size < (source / "onnx" / "draft.onnx").stat().st_size
    register_schema()
    onnx.checker.check_model(str(out / "onnx" / "draft.onnx"), full_check=True)
    taps, positions = torch.randn(2, 5, 192), torch.arange(5).expand(2, 5)
    k_small, _ = run_context(OrtGraph(source / "onnx" / "context.onnx"), taps, positions)
    k_big, _ = run_context(OrtGraph(out / "onnx" / "context.onnx"), taps, positions)
    assert torch.equal(k_small, k_big)
