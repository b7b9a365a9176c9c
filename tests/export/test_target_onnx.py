"""The exported target graph: the CONTRACT's I/O, standard ops only, validation against transformers (and a
shifted tap failing it), the manifest's target section, families (Qwen3, Llama, Qwen2), pairing errors."""

from __future__ import annotations

import json

import pytest
import torch

from dspark_trt.cli.common import ValidationMismatch
from dspark_trt.errors import DSparkTrtError
from dspark_trt.artifact.export_dir import check_manifest, read_manifest

pytestmark = [pytest.mark.onnx, pytest.mark.slow]

CONTRACT_IO = {
    "inputs": [("input_ids", "int64", ["B", "Q"]), ("position_ids", "int64", ["B", "Q"]),
               ("attention_mask", "int64", ["B", "S"]), ("logits_index", "int64", ["B", "K"]),
               ("past_key_{l}", "DT", ["B", "H", "P", "D"]),
               ("past_value_{l}", "DT", ["B", "H", "P", "D"])],
    "outputs": [("logits", "float32", ["B", "K", "V"]), ("taps", "DT", ["B", "Q", "MD"]),
                ("new_key", "DT", ["L", "B", "H", "Q", "D"]), ("new_value", "DT", ["L", "B", "H", "Q", "D"])],
}


def expected_io(t: dict, dtype: str) -> dict:
    """The CONTRACT for this target: one past_key_l / past_value_l per layer (all keys, then all values)."""
    static = {"L": t["num_layers"], "H": t["num_key_value_heads"], "D": t["head_dim"], "V": t["vocab_size"],
              "MD": len(t["layer_ids"]) * t["hidden_size"], "DT": dtype}
    io = {}
    for side, entries in CONTRACT_IO.items():
        io[side] = [{"name": n.format(l=layer), "dtype": static.get(dt, dt), "shape": [static.get(d, d) for d in shape]}
                    for n, dt, shape in entries
                    for layer in (range(t["num_layers"]) if "{l}" in n else [None])]
    return io


@pytest.mark.parametrize("fixture", ["qwen3_topk_export", "llama_dense_export"])
def test_target_graph_has_the_contract_io_and_standard_ops_only(fixture, request):
    import onnx

    out = request.getfixturevalue(fixture)
    m = read_manifest(out)
    t = m["target"]
    assert t["io"] == expected_io(t, "float32")
    model = onnx.load(str(out / t["onnx"]))
    onnx.checker.check_model(model, full_check=True)
    assert {n.domain for n in model.graph.node} <= {"", "ai.onnx"}  # no com.microsoft, nothing custom
    assert not model.functions
    assert check_manifest(out, m) == []
    for key in ("dtype", "num_layers", "num_key_value_heads", "head_dim", "hidden_size", "vocab_size", "layer_ids",
                "config_sha256", "architecture", "tokenizer", "eos_token_ids", "max_context", "kv_interface",
                "engines"):
        assert key in t, key
    assert t["layer_ids"] == m["target_layer_ids"]
    assert t["validation"][0].startswith("target validation") and all(
        line.strip().startswith("ok") for line in t["validation"][1:])


def test_the_manifest_records_the_pairing(qwen3_topk_export, random_pair):
    import hashlib

    t = read_manifest(qwen3_topk_export)["target"]
    config = json.loads((random_pair.target / "config.json").read_text())
    assert t["config_sha256"] == hashlib.sha256((random_pair.target / "config.json").read_bytes()).hexdigest()
    assert (t["architecture"], t["vocab_size"], t["hidden_size"], t["num_layers"]) == (
        "Qwen3ForCausalLM", config["vocab_size"], config["hidden_size"], config["num_hidden_layers"])
    assert (t["dtype"], t["layer_ids"]) == ("fp32", [1, 2, 4])


def test_taps_shifted_by_one_layer_fail_the_validation(qwen3_topk_export, random_pair):
    from dspark_trt.export.target_onnx import load_target_model
    from dspark_trt.export.validate_target import validate_target_onnx

    model = load_target_model(random_pair.target, torch.float32)
    path = qwen3_topk_export / "onnx" / "target.onnx"
    report = validate_target_onnx(path, model, [1, 2, 4], dtype="fp32")  # the graph's own taps pass
    assert report.ok and len(report.checks) == 7
    with pytest.raises(ValidationMismatch, match="taps"):  # a graph tapping one layer deeper than declared
        validate_target_onnx(path, model, [0, 1, 3], dtype="fp32")
    failed = validate_target_onnx(path, model, [0, 1, 3], dtype="fp32", raise_on_failure=False)
    assert [c.name for c in failed.checks if not c.ok] == [c.name for c in failed.checks if "taps" in c.name]


def test_a_model_builder_is_dropped_before_the_graph_opens(qwen3_topk_export, random_pair, monkeypatch):
    """Given a function that builds the reference, validation runs it first and frees it before onnxruntime maps the
    graph (one copy of the weights at a time), and the serial comparison still fails a shifted tap."""
    import gc
    import weakref

    import dspark_trt.runtime.targets.onnxruntime as ort_target
    from dspark_trt.export.target_onnx import load_target_model
    from dspark_trt.export.validate_target import validate_target_onnx

    built, alive_at_open = [], []
    real = ort_target.OnnxRuntimeTarget

    def build():
        model = load_target_model(random_pair.target, torch.float32)
        built.append(weakref.ref(model))
        return model

    def opened(*args, **kwargs):
        gc.collect()
        alive_at_open.append(built[-1]() is not None)
        return real(*args, **kwargs)

    monkeypatch.setattr(ort_target, "OnnxRuntimeTarget", opened)
    path = qwen3_topk_export / "onnx" / "target.onnx"
    report = validate_target_onnx(path, build, [1, 2, 4], dtype="fp32")
    assert report.ok and len(report.checks) == 7 and alive_at_open == [False]
    failed = validate_target_onnx(path, build, [0, 1, 3], dtype="fp32", raise_on_failure=False)
    assert alive_at_open == [False, False]
    assert [c.name for c in failed.checks if not c.ok] == [c.name for c in failed.checks if "taps" in c.name]


def test_the_last_layer_tap_is_pre_norm_in_the_graph(llama_dense_export, speculators_llama_pair):
    """Llama target, taps (0, 3, 5) of 6 layers: the third tap is layer 5's output before the final norm."""
    from dspark_trt.runtime.ort_session import OrtGraph
    from dspark_trt.export.target_onnx import load_target_model

    model = load_target_model(speculators_llama_pair.target, torch.float32)
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    graph = OrtGraph(llama_dense_export / "onnx" / "target.onnx")
    empty = {f"past_{kv}_{layer}": torch.randn(1, 2, 1, 16) for kv in ("key", "value") for layer in range(6)}
    mask = torch.tensor([[0, 1, 1, 1, 1, 1]])  # one cache slot, unused: the prompt sees itself only
    out = graph.run({"input_ids": ids, "position_ids": torch.arange(5).view(1, 5), "attention_mask": mask,
                     "logits_index": torch.arange(5).view(1, 5), **empty})
    with torch.no_grad():
        hs = model(ids, output_hidden_states=True).hidden_states
    last = out["taps"][..., 128:]  # [1, 5, d]
    assert (last - hs[6]).abs().max() > 0.1  # not the normed output_hidden_states[-1]
    torch.testing.assert_close(model.model.norm(last), hs[6], atol=1e-5, rtol=1e-5)  # but what the norm reads
    torch.testing.assert_close(out["taps"][..., :64], hs[1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_qwen2_target_exports_and_validates(tmp_path, dtype):
    from dspark_trt.export.target_onnx import export_target_onnx, load_target_model
    from dspark_trt.export.validate_target import validate_target_onnx
    from dspark_trt.synthetic import write_tiny_checkpoint

    pair = write_tiny_checkpoint(tmp_path / "pair", target_family="qwen2", vocab_size=301, num_target_layers=3,
                                 seed=4)
    model = load_target_model(pair.target, {"fp32": torch.float32, "fp16": torch.float16}[dtype])
    assert type(model).__name__ == "Qwen2ForCausalLM" and model.model.layers[0].self_attn.q_proj.bias is not None
    path = export_target_onnx(model, [-1, 2], tmp_path / "target.onnx")  # embeddings and the last layer
    assert validate_target_onnx(path, model, [-1, 2], dtype=dtype).ok


def test_unsupported_architectures_are_refused_with_the_way_out():
    from dspark_trt.export.target_graph import check_architecture

    assert check_architecture({"architectures": ["LlamaForCausalLM"]}) == "LlamaForCausalLM"
    with pytest.raises(DSparkTrtError, match="GPT2LMHeadModel is not supported.*--skip-target"):
        check_architecture({"architectures": ["GPT2LMHeadModel"]})


def test_the_pairing_is_checked_before_anything_runs(random_pair, tmp_path):
    from dspark_trt.export.pipeline import ExportOptions, export_model
    from dspark_trt.synthetic import write_tiny_checkpoint

    shallow = write_tiny_checkpoint(tmp_path / "shallow", num_target_layers=3, seed=1)  # taps [1] of 3 layers
    other_vocab = write_tiny_checkpoint(tmp_path / "vocab", vocab_size=300, seed=1)
    cases = [(shallow.target, r"target_layer_ids \[1, 2, 4\] are invalid for this 3-layer target: \[4\] outside"),
             (other_vocab.target, "drafter vocab_size 2500 != target vocab_size 300")]
    for target, message in cases:
        with pytest.raises(DSparkTrtError, match=message):
            export_model(random_pair.drafter, tmp_path / "out", ExportOptions(engine="none"), target_dir=target)
        assert not (tmp_path / "out").exists()
