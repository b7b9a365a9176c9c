"""The gated and RNN Markov heads in the export (issue 42): a top-k draft graph computes the head's hidden part for
every slot before one DSparkTopKMarkovGated / DSparkTopKMarkovRNN node (``dspark`` domain version 3, its local
function attached); a dense one inlines the reference walk. Both validate against the reference at k ∈ {16, V_d}
and dense (and a poisoned head fails validation); the manifest says op contract 3, which an older reader refuses in
one line, as this one refuses 4; a vanilla export is the graph it always was."""

from __future__ import annotations

import functools
import json

import pytest
import torch

from dspark_trt.errors import DSparkTrtError

pytestmark = pytest.mark.onnx

#: (pair fixture, head op, inputs of its node, V_d)
HEADS = {"gated": ("gated_pair", "DSparkTopKMarkovGated", 13, 257),
         "rnn": ("rnn_pair", "DSparkTopKMarkovRNN", 14, 199)}


@functools.cache
def reference(pair):
    from dspark_trt import load_drafter

    return load_drafter(pair.drafter, dtype="fp32", target_dir=pair.target)


def head_export(request, onnx_export, head, topk, dtype="fp32"):
    pair = request.getfixturevalue(HEADS[head][0])
    topk = HEADS[head][3] if topk == "V" else topk
    return pair, onnx_export(pair, dtype, topk)  # exported and validated against the reference (raises otherwise)


def _load(out):
    import onnx

    return onnx.load(str(out / "onnx" / "draft.onnx"))


@pytest.mark.parametrize("head, topk", [("gated", 16), ("gated", "off"), ("rnn", "V"), ("rnn", "off")])
def test_head_export_validates_and_records_contract_3(request, onnx_export, head, topk):
    import onnx

    from dspark_trt.plugins.onnx_op import register_schema

    pair, out = head_export(request, onnx_export, head, topk)
    record = json.loads((out / "manifest.json").read_text())
    assert record["op_contract_version"] == 3
    assert record["checkpoint"]["config"]["markov_head_type"] == head
    lines = record["validation"]
    assert lines and all(line.strip().startswith(("validation", "ok")) for line in lines), lines
    assert any("sampled draft tokens" in line for line in lines)
    assert any("greedy draft tokens" in line for line in lines)
    register_schema()
    onnx.checker.check_model(str(out / "onnx" / "draft.onnx"), full_check=True)
    model = _load(out)
    _, op, n_inputs, vd = HEADS[head]
    nodes = [n for n in model.graph.node if n.domain == "dspark"]
    if topk == "off":  # dense: the reference walk inlined, no custom node, no dspark domain
        assert nodes == [] and "dspark" not in {o.domain for o in model.opset_import}
        assert not model.functions
        return
    assert {o.domain: o.version for o in model.opset_import}["dspark"] == 3
    assert [n.op_type for n in nodes] == [op] and len(nodes[0].input) == n_inputs
    assert [(f.domain, f.name) for f in model.functions] == [("dspark", op)]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in nodes[0].attribute}
    assert attrs["k"] == (vd if topk == "V" else topk)


@pytest.mark.parametrize("head", list(HEADS))
def test_a_poisoned_head_fails_validation(request, onnx_export, head):
    """The head's projection bias negated in the draft graph (its weight is folded into the hidden part's and the walk's
    constants): onnxruntime drafts other logits than the reference, and validation fails in the draft checks only."""
    import numpy
    from onnx import numpy_helper

    from dspark_trt.errors import ValidationMismatch
    from dspark_trt.export.validate import validate_onnx
    from dspark_trt.runtime.ort_session import OrtGraph

    pair, out = head_export(request, onnx_export, head, 16)
    drafter = reference(pair)
    model = _load(out)
    proj = "gate_proj.bias" if head == "gated" else "joint_proj.bias"
    init = next(i for i in model.graph.initializer if i.name.endswith(proj))
    init.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(init).astype(numpy.float32), init.name))
    context = OrtGraph(out / "onnx" / "context.onnx")
    report = validate_onnx(context, OrtGraph(model), drafter, topk=16, dtype="fp32", raise_on_failure=False)
    failed = [c.name for c in report.checks if not c.ok]
    assert failed and all("draft" in name for name in failed)
    assert any(name.endswith("cand_logits") for name in failed)
    with pytest.raises(ValidationMismatch):
        report.raise_on_failure()


@pytest.mark.parametrize("head, dtype", [("gated", "bf16"), ("rnn", "fp16")])
def test_low_precision_head_export_validates(request, onnx_export, head, dtype):
    """bf16 / fp16: the node's weights (W1, W2 and the head's walk weight) share the op's one W type, the hidden
    part and the rnn state stay fp32; validated within the dtype's tolerance."""
    import onnx

    from dspark_trt.plugins.onnx_op import register_schema

    _, out = head_export(request, onnx_export, head, 16, dtype=dtype)
    record = json.loads((out / "manifest.json").read_text())
    assert all(line.strip().startswith(("validation", "ok")) for line in record["validation"])
    register_schema()
    model = onnx.shape_inference.infer_shapes(_load(out))
    node = next(n for n in model.graph.node if n.domain == "dspark")
    types = {v.name: v.type.tensor_type.elem_type for v in model.graph.value_info}
    types.update({i.name: i.data_type for i in model.graph.initializer})
    w = {"bf16": onnx.TensorProto.BFLOAT16, "fp16": onnx.TensorProto.FLOAT16}[dtype]
    assert [types[name] for name in node.input[3:5]] == [w, w]  # markov_w1, markov_w2
    assert types[node.input[12]] == w  # gate_w / joint_w
    assert types[node.input[11]] == onnx.TensorProto.FLOAT  # the hidden part


def test_vanilla_draft_graph_is_unchanged(tiny_pair, onnx_export):
    """A vanilla export still emits the contract-1 graph: one DSparkTopKMarkov node with the 11 inputs, dspark domain
    version 1, its local function (the same chain of the exported step), and none of the newer ops; its manifest
    says contract 1."""
    from collections import Counter

    from dspark_trt.plugins.contract import INPUTS
    from dspark_trt.plugins.onnx_op import local_function

    out = onnx_export(tiny_pair, "fp32", 16)
    assert json.loads((out / "manifest.json").read_text())["op_contract_version"] == 1
    model = _load(out)
    assert {o.domain: o.version for o in model.opset_import} == {"": 21, "dspark": 1}
    nodes = [n for n in model.graph.node if n.domain == "dspark"]
    assert [n.op_type for n in nodes] == ["DSparkTopKMarkov"] and len(nodes[0].input) == len(INPUTS) == 11
    assert [(f.domain, f.name) for f in model.functions] == [("dspark", "DSparkTopKMarkov")]
    fn = model.functions[0]
    want = local_function(reference(tiny_pair).config.num_draft_tokens, opset=21)
    assert list(fn.input) == list(want.input) and list(fn.output) == list(want.output)
    assert Counter(n.op_type for n in fn.node) == Counter(n.op_type for n in want.node)
    newer = {"DSparkTopKMarkovUnion", "DSparkTopKMarkovGated", "DSparkTopKMarkovRNN"}
    assert not newer & {n.op_type for n in model.graph.node}


def test_newer_op_contract_is_refused_in_one_line(tmp_path):
    from dspark_trt.artifact.export_dir import read_manifest

    (tmp_path / "manifest.json").write_text(json.dumps({"format_version": 1, "op_contract_version": 4}))
    with pytest.raises(DSparkTrtError) as err:
        read_manifest(tmp_path)
    msg = str(err.value)
    assert "\n" not in msg and "op contract version 4" in msg and "reads versions <= 3; upgrade dspark-trt" in msg
    (tmp_path / "manifest.json").write_text(json.dumps({"format_version": 1, "op_contract_version": 3}))
    assert read_manifest(tmp_path)["op_contract_version"] == 3


def test_plugin_graph_of_a_head_export(request, onnx_export, tmp_path):
    """The plugin-graph edit finds the head's node (aot=1, its local function dropped), for full TensorRT once a
    plugin exists for it."""
    import onnx

    from dspark_trt.export.plugin_graph import plugin_graph

    _, out = head_export(request, onnx_export, "rnn", 16)
    model = onnx.load(str(plugin_graph(out / "onnx" / "draft.onnx", tmp_path / "plugin.onnx", copy_weights=True)))
    node = next(n for n in model.graph.node if n.domain == "dspark")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert node.op_type == "DSparkTopKMarkovRNN" and attrs["aot"] == 1 and not model.functions


@pytest.mark.rtx
@pytest.mark.slow  # one drafter-only export of the gated pair + two TensorRT-RTX engines (~60 s)
def test_export_model_of_a_gated_head_writes_its_plugin_and_builds_rtx_engines(gated_pair, tmp_path):
    """``dspark-export --topk 16 --engine tensorrt-rtx`` of a gated drafter: the plugin graph with one
    DSparkTopKMarkovGated node (aot, no local function) and the head kernel's PTX for full TensorRT, the manifest's
    plugin entry naming that op and its 13 inputs, contract 3, and TensorRT-RTX engines built from the draft graph's
    local function (TensorRT-RTX takes no plugin)."""
    import onnx

    from dspark_trt.artifact.export_dir import check_manifest, read_manifest
    from dspark_trt.export.pipeline import ExportOptions, export_model
    from dspark_trt.plugins.contract import GATED_INPUTS, GATED_OP_NAME

    result = export_model(gated_pair.drafter, tmp_path / "out", ExportOptions(topk=16, dtype="fp32",
                                                                               engine="tensorrt-rtx",
                                                                               export_target=False, max_batch_size=2),
                          target_dir=gated_pair.target)
    m = read_manifest(result.out_dir)
    assert check_manifest(result.out_dir, m) == []
    assert (m["topk"], m["op_contract_version"], m["plugin"]["op"]) == (16, 3, GATED_OP_NAME)
    assert [i["name"] for i in m["plugin"]["inputs"]] == [t.name for t in GATED_INPUTS]
    assert m["kernel"]["markov_head_type"] == "gated" and m["kernel"]["dir"] == "plugin"
    graph = onnx.load(result.out_dir / m["plugin_graph"], load_external_data=False)
    nodes = [n for n in graph.graph.node if n.domain == "dspark"]
    assert [n.op_type for n in nodes] == [GATED_OP_NAME] and not graph.functions
    assert {a.name: a.i for a in nodes[0].attribute if a.name == "aot"} == {"aot": 1}
    assert any(p.suffix == ".ptx" for p in (result.out_dir / "plugin").iterdir())
    assert {name.split(".")[0] for name in m["engines"]} == {"context", "draft"}
    assert all(name.endswith("tensorrt-rtx") for name in m["engines"])
    assert [p.stat().st_size > 0 for p in sorted((result.out_dir / "engines").iterdir())] == [True, True]