"""The candidate union in the export: ``--markov-topm M`` → a DSparkTopKMarkovUnion draft graph (domain version 2,
the table as an initializer), validated against the reference; M = 0 is the plain export bit for bit."""

from __future__ import annotations

import json

import pytest
import torch

from dspark_trt.errors import DSparkTrtError

M = 5


@pytest.fixture(scope="module")
def drafter(tiny_pair):
    from dspark_trt import load_drafter

    return load_drafter(tiny_pair.drafter, dtype="fp32", target_dir=tiny_pair.target)


# -- arguments (pure) ---------------------------------------------------------------------------------------
def test_markov_topm_arguments(drafter):
    from dspark_trt.export.onnx import ExportSpec

    c = drafter.config
    assert ExportSpec.resolve(c, topk=16).markov_topm == 0  # the config's default: no union
    assert ExportSpec.resolve(c, topk=16, markov_topm=M).markov_topm == M
    assert ExportSpec.resolve(c, topk=16, markov_topm=str(c.draft_vocab_size)).markov_topm == c.draft_vocab_size
    assert ExportSpec.resolve(c, topk=16).op_contract_version == 1
    assert ExportSpec.resolve(c, topk=16, markov_topm=M).op_contract_version == 2
    with_default = c.replace(draft_markov_topm=3)
    assert ExportSpec.resolve(with_default, topk=16).markov_topm == 3  # the checkpoint's draft_markov_topm
    assert ExportSpec.resolve(with_default, topk="off").markov_topm == 0  # ... only where it applies
    assert ExportSpec.resolve(with_default, topk=16, markov_topm=0).markov_topm == 0
    with pytest.raises(DSparkTrtError, match="needs a top-k export.*--topk K"):
        ExportSpec.resolve(c, topk="off", markov_topm=M)
    for bad in (c.draft_vocab_size + 1, -1, "x"):
        with pytest.raises(DSparkTrtError, match=r"--markov-topm .* must be an integer in \[0, draft_vocab_size="):
            ExportSpec.resolve(c, topk=16, markov_topm=bad)


def test_newer_op_contract_is_refused_in_one_line(tmp_path):
    from dspark_trt.export.manifest import read_manifest
    from dspark_trt.export.onnx import OnnxFromDir

    (tmp_path / "manifest.json").write_text(json.dumps({"format_version": 1, "op_contract_version": 3}))
    with pytest.raises(DSparkTrtError, match="op contract version 3.*reads versions <= 2; upgrade dspark-trt"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"format_version": 1, "op_contract_version": 2}))
    assert read_manifest(tmp_path)["op_contract_version"] == 2
    (tmp_path / "onnx_export.json").write_text(json.dumps({"format_version": 1, "op_contract_version": 3}))
    with pytest.raises(DSparkTrtError, match="op contract version 3"):
        OnnxFromDir(tmp_path).manifest()


# -- the graphs ------------------------------------------------------------------------------------------

@pytest.mark.onnx
@pytest.mark.slow  # two draft exports of the tiny pair (~10 s)
def test_m0_export_is_the_plain_export_bit_for_bit(drafter):
    """markov_topm=0 emits exactly the graph of an export that never heard of the union (domain version 1)."""
    import onnx_ir as ir

    from dspark_trt.export.graphs import GraphInfo, export_draft

    info = dict(dtype="fp32", num_draft_tokens=drafter.config.num_draft_tokens, max_context=64,
                config_digest=drafter.config.digest(), topk=16)
    plain = ir.serde.serialize_model(export_draft(drafter, GraphInfo("draft", **info))).SerializeToString()
    zero = ir.serde.serialize_model(export_draft(drafter, GraphInfo("draft", markov_topm=0, **info)))
    assert zero.SerializeToString() == plain
    assert {o.domain: o.version for o in zero.opset_import}["dspark"] == 1
    assert [n.op_type for n in zero.graph.node if n.domain == "dspark"] == ["DSparkTopKMarkov"]
    assert not any(p.key == "dspark.markov_topm" for p in zero.metadata_props)


@pytest.fixture(scope="module")
def union_export(tiny_pair, onnx_export):
    return onnx_export(tiny_pair, "fp32", 16, markov_topm=M)  # exported and validated (cached per run)


@pytest.mark.onnx
def test_union_export_graph_and_record(union_export, drafter):
    import onnx
    from onnx import numpy_helper

    from dspark_trt.plugins.onnx_op import register_schema
    from dspark_trt.reference.markov import markov_union_table

    register_schema()
    onnx.checker.check_model(str(union_export / "draft.onnx"), full_check=True)
    model = onnx.load(str(union_export / "draft.onnx"))
    assert {o.domain: o.version for o in model.opset_import}["dspark"] == 2
    assert [n.op_type for n in model.graph.node if n.domain == "dspark"] == ["DSparkTopKMarkovUnion"]
    assert [(f.domain, f.name) for f in model.functions] == [("dspark", "DSparkTopKMarkovUnion")]
    node = next(n for n in model.graph.node if n.domain == "dspark")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert (attrs["k"], attrs["markov_topm"]) == (16, M)
    table = next(numpy_helper.to_array(i) for i in model.graph.initializer if i.name == node.input[11])
    w = drafter.markov_head
    expected = markov_union_table(w.markov_w1.weight, w.markov_w2.weight, M, logit_scale=drafter.config.logit_scale)
    assert table.dtype.name == "int32" and torch.equal(torch.from_numpy(table.copy()), expected)
    dims = {o.name: [d.dim_value or d.dim_param for d in o.type.tensor_type.shape.dim] for o in model.graph.output}
    N = drafter.config.num_draft_tokens
    assert dims["cand_ids"][1:] == dims["cand_logits"][1:] == [N, 16 + M]
    record = json.loads((union_export / "onnx_export.json").read_text())
    assert record["op_contract_version"] == 2 and record["markov_topm"] == M and record["spec"]["markov_topm"] == M
    assert any("union ids" in line and line.strip().startswith("ok") for line in record["validation"])
    assert all(line.strip().startswith(("validation", "ok")) for line in record["validation"])


@pytest.mark.onnx
def test_poisoned_table_fails_validation_and_exits_3(union_export, drafter):
    """The union graph with its table rolled by one row: the union-ids check fails, ValidationMismatch (exit 3)."""
    import argparse

    import numpy
    import onnx
    from onnx import numpy_helper

    from dspark_trt.cli.common import EXIT_MISMATCH, run_guarded
    from dspark_trt.errors import ValidationMismatch
    from dspark_trt.export.ort_session import OrtGraph
    from dspark_trt.export.validate import validate_onnx

    model = onnx.load(str(union_export / "draft.onnx"))
    node = next(n for n in model.graph.node if n.domain == "dspark")
    init = next(i for i in model.graph.initializer if i.name == node.input[11])
    init.CopyFrom(numpy_helper.from_array(numpy.roll(numpy_helper.to_array(init), 1, axis=0), init.name))
    context = OrtGraph(union_export / "context.onnx")
    good = validate_onnx(context, OrtGraph(union_export / "draft.onnx"), drafter, topk=16, dtype="fp32",
                         markov_topm=M, raise_on_failure=False)
    assert good.ok, good.lines()
    poisoned = OrtGraph(model)
    report = validate_onnx(context, poisoned, drafter, topk=16, dtype="fp32", markov_topm=M, raise_on_failure=False)
    failed = [c.name for c in report.checks if not c.ok]
    assert failed and all("draft" in name for name in failed)
    assert any(name.endswith("union ids") for name in failed)
    with pytest.raises(ValidationMismatch):
        validate_onnx(context, poisoned, drafter, topk=16, dtype="fp32", markov_topm=M)
    status = run_guarded(lambda args: validate_onnx(context, poisoned, drafter, topk=16, dtype="fp32",
                                                    markov_topm=M) and 0, argparse.Namespace())
    assert status == EXIT_MISMATCH == 3
