"""The reader on an export written by an older dspark-trt (tests/data/export_v1: format 1, manifest.json and
onnx/onnx_export.json): ``ExportDir`` reads it as one manifest, and the runtime generates from it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dspark_trt.artifact.export_dir import ExportDir

V1 = Path(__file__).resolve().parents[1] / "data" / "export_v1"


def test_a_format_1_export_reads_as_one_manifest():
    export = ExportDir(V1)
    assert export.format_version == 1 and export.exists()
    assert (export.topk, export.markov_topm, export.dtype, export.max_context) == (16, 0, "bf16", 8192)
    assert export.spec == {"topk": 16, "dtype": "bf16", "max_context": 8192, "target": "tensorrt", "markov_topm": 0}
    assert export.config.vocab_size == 512 and export.config.num_draft_tokens == export.num_draft_tokens == 7
    assert export.graph_paths == {"context": V1 / "onnx" / "context.onnx", "draft": V1 / "onnx" / "draft.onnx"}
    assert export.graph_path("plugin") == V1 / "onnx" / "draft.plugin.onnx"
    assert export.target["onnx"] == "onnx/target.onnx" and export.engines == {}
    assert export.d2t is None and export.validation and export.drafter["versions"]["torch"]
    assert export.check(digests=True) == []
    onnx = ExportDir(V1 / "onnx")  # what the onnxruntime drafter was given: the graphs beside onnx_export.json
    assert onnx.spec == export.spec and onnx.graph_paths == export.graph_paths


def test_a_format_1_drafter_only_onnx_directory_reads_too(tmp_path):
    """What SaveOnnx / the ONNX cache wrote before: the graphs beside onnx_export.json, no manifest.json."""
    old = tmp_path / "onnx"
    old.mkdir()
    for name in ("context.onnx", "context.onnx.data", "draft.onnx", "draft.onnx.data", "onnx_export.json"):
        shutil.copy(V1 / "onnx" / name, old / name)
    export = ExportDir(old)
    assert export.root == old and export.topk == 16 and export.dtype == "bf16"
    assert export.graph_paths == {"context": old / "context.onnx", "draft": old / "draft.onnx"}


@pytest.mark.onnx
def test_the_runtime_generates_from_a_format_1_export():
    from dspark_trt.runtime import SpeculativeDecoder

    dec = SpeculativeDecoder.from_export(V1, backend="onnxruntime", tokenizer=False, threads=1)
    assert dec.default_topk == 16 and dec.backend.topk == 16
    prompts = [[1, 2, 3], [4, 5]]
    spec = dec.generate(prompts, max_new_tokens=6, eos_token_id=[])
    alone = dec.generate(prompts, max_new_tokens=6, eos_token_id=[], draft=False)
    assert spec.tokens == alone.tokens and spec.stats.drafted > 0
