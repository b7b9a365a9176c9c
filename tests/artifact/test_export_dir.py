"""``ExportDir`` on what this dspark-trt writes: one manifest (format 2), the drafter's record inside it."""

from __future__ import annotations

import json

import pytest

from dspark_trt.artifact.export_dir import ExportDir
from dspark_trt.artifact.layout import FORMAT_VERSION
from dspark_trt.errors import DSparkTrtError


@pytest.mark.onnx
def test_a_drafter_only_export_has_one_manifest(tiny_pair, onnx_export):
    out = onnx_export(tiny_pair, "fp32", 16)
    export = ExportDir(out)
    assert export.format_version == FORMAT_VERSION == 2
    assert not list(out.rglob("onnx_export.json"))
    assert export.spec["topk"] == export.topk == 16 and export.dtype == "fp32" and not export.has_target
    assert export.graph_path("draft") == out / "onnx" / "draft.onnx" and export.check(digests=True) == []
    assert ExportDir(out / "onnx").root == out  # OUT/onnx reads as OUT
    with pytest.raises(DSparkTrtError, match="has no exported target"):
        export.target


def test_write_manifest_sets_the_format_and_rereads(tmp_path):
    export = ExportDir(tmp_path)
    assert not export.exists()
    with pytest.raises(DSparkTrtError, match="has no manifest.json"):
        export.manifest
    export.write_manifest({"topk": None, "graphs": {}})
    assert json.loads((tmp_path / "manifest.json").read_text())["format_version"] == FORMAT_VERSION
    assert export.topk is None and export.markov_topm == 0
    with pytest.raises(DSparkTrtError, match="no drafter record"):
        export.spec
    (tmp_path / "manifest.json").write_text(json.dumps({"format_version": 3}))
    with pytest.raises(DSparkTrtError, match="format_version 3, this dspark-trt reads 1, 2"):
        ExportDir(tmp_path).manifest
