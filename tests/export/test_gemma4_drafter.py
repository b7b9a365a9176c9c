"""DeepSpec's Gemma-4 drafter (Gemma4DSparkModel) exported with its Gemma-4 target: the context and draft graphs
validated against the reference in onnxruntime at export (and again here, on other inputs), a graph that drops a
Gemma-4 feature caught, TensorRT-RTX taking both graphs, and greedy speculative decoding == the target alone."""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = [pytest.mark.onnx, pytest.mark.usefixtures("one_thread")]

#: the brief's tiny widths: hidden 64, the target's sliding heads of 16, the drafter's (global) heads of 32, window 8
GEMMA = dict(hidden_size=64, intermediate_size=96, head_dim=16, global_head_dim=32, num_attention_heads=4,
             num_key_value_heads=2, sliding_window=8)


def randomise_drafter(drafter_dir, seed=0) -> None:
    """Rewrite the written drafter's own tensors with values a preset leaves flat: norm weights around 1, each
    ``layer_scalar`` away from 1, matrices at std 0.1 (the shared embed_tokens / lm_head stay the target's)."""
    from safetensors.torch import load_file, save_file

    path = drafter_dir / "model.safetensors"
    state = load_file(path)
    gen = torch.Generator().manual_seed(seed)
    for name, t in state.items():
        if name in ("embed_tokens.weight", "lm_head.weight"):
            continue
        if name.endswith("norm.weight"):
            state[name] = 1.0 + 0.2 * torch.randn(t.shape, generator=gen)
        elif name.endswith("layer_scalar"):
            state[name] = 0.5 + torch.rand(t.shape, generator=gen)
        else:
            state[name] = 0.1 * torch.randn(t.shape, generator=gen)
    save_file(state, path, metadata={"format": "pt"})


@pytest.fixture(scope="module")
def gemma_pair(tmp_path_factory):
    """The 12B preset at tiny width: 2 Gemma-4 draft layers, a 6-layer target (5 sliding, 1 global) whose last
    layer is tapped (the preset's taps scale to 0, 1, 2, 4, 5)."""
    from dspark_trt.synthetic import write_preset

    out = write_preset("dspark_gemma4_12b_block7", tmp_path_factory.mktemp("gemma4-drafter") / "pair",
                       with_target=True, layers=2, target_layers=6, vocab=600, dtype="fp32", **GEMMA)
    randomise_drafter(out.drafter)
    return out


@pytest.fixture(scope="module")
def gemma_export(gemma_pair):
    from dspark_trt.export.pipeline import ExportOptions, export_model

    out = gemma_pair.path / "export"
    export_model(gemma_pair.drafter, out, ExportOptions(topk=8, dtype="fp32", engine="none", max_context=256),
                 target_dir=gemma_pair.target)
    return out


def reference(pair):
    from dspark_trt.loader import load_drafter

    return load_drafter(pair.drafter, target_dir=pair.target)


def test_the_export_validates_the_gemma4_drafter_and_its_target(gemma_export):
    manifest = json.loads((gemma_export / "manifest.json").read_text())
    config = manifest["checkpoint"]["config"]
    assert (config["layer_family"], config["head_dim"], config["partial_rotary_factor"]) == ("gemma4", 32, 0.25)
    assert config["target_layer_ids"] == [0, 1, 2, 4, 5]  # the target's last layer tapped (before its final norm)
    for lines in (manifest["validation"], manifest["target"]["validation"]):
        assert lines and all(line.strip().startswith(("ok", "validation", "Gemma-4 target validation")) for line in
                             lines), lines
    assert any("draft cand_logits" in line for line in manifest["validation"])
    assert any("taps" in line for line in manifest["target"]["validation"])
    assert manifest["target"]["kv_interface"] == "gemma4-windowed-v1"
    # the graph I/O is the Qwen3 drafter's: K/V per layer at the drafter's head size (global_head_dim)
    draft_inputs = {i["name"]: i["shape"] for i in manifest["graphs"]["draft"]["inputs"]}
    assert draft_inputs["ctx_key_1"] == ["B", 2, "T", 32]


def test_onnxruntime_equals_the_reference_on_other_inputs(gemma_pair, gemma_export):
    from dspark_trt.export.validate import validate_onnx
    from dspark_trt.runtime.ort_session import OrtGraph

    graphs = [OrtGraph(gemma_export / "onnx" / f"{g}.onnx") for g in ("context", "draft")]
    report = validate_onnx(*graphs, reference(gemma_pair), topk=8, dtype="fp32", batch_sizes=(2, 5), seed=7,
                           raise_on_failure=False)
    assert report.ok, report.lines()


@pytest.mark.parametrize("feature", ["final_logit_softcapping", "embed_scale"])
def test_a_reference_without_a_gemma4_feature_fails_validation(gemma_pair, gemma_export, feature, monkeypatch):
    """The checks can fail: the exported graph against a reference without soft-capping (or without × √d)."""
    from dspark_trt.config import DSparkConfig
    from dspark_trt.export.validate import validate_onnx
    from dspark_trt.runtime.ort_session import OrtGraph

    drafter = reference(gemma_pair)
    if feature == "final_logit_softcapping":
        drafter.config = drafter.config.replace(final_logit_softcapping=5.0)  # a cap these logits reach
    else:
        monkeypatch.setattr(DSparkConfig, "embed_scale", property(lambda self: None))
    graphs = [OrtGraph(gemma_export / "onnx" / f"{g}.onnx") for g in ("context", "draft")]
    report = validate_onnx(*graphs, drafter, topk=8, dtype="fp32", raise_on_failure=False)
    failed = [c.name for c in report.checks if not c.ok]
    assert failed and all("draft" in name for name in failed)  # the context graph has neither feature


def test_the_drafter_alone_exports_and_validates_in_bf16(gemma_pair):
    """--skip-target: the drafter graphs in bf16 (without the target), validated through the bf16
    emulation twin within bf16's tolerance; √64 = 8 scales the embeddings exactly in bf16 too."""
    from dspark_trt.export.pipeline import ExportOptions, export_model

    out = gemma_pair.path / "export-bf16"
    result = export_model(gemma_pair.drafter, out, ExportOptions(topk=8, dtype="bf16", engine="none", max_context=64,
                                                                 export_target=False), target_dir=gemma_pair.target)
    lines = result.manifest["validation"]
    assert lines[0].startswith("validation (bf16") and all(line.strip().startswith("ok") for line in lines[1:]), lines
    assert result.manifest.get("target") is None


def test_greedy_speculative_equals_the_target_alone_past_the_window(gemma_export):
    from dspark_trt.runtime import SpeculativeDecoder

    dec = SpeculativeDecoder.from_export(gemma_export)
    assert type(dec.target).__name__ == "Gemma4OnnxRuntimeTarget"
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 600, (n,), generator=gen).tolist() for n in (40, 11, 3)]  # past the window (8)
    spec = dec.generate(prompts, 12, eos_token_id=[])
    alone = dec.generate(prompts, 12, eos_token_id=[], draft=False)
    assert spec.tokens == alone.tokens and all(len(t) == 12 for t in spec.tokens)
    assert spec.stats.rounds >= 4


def test_the_torch_drafter_backend_runs_the_gemma4_drafter_losslessly(gemma_pair, gemma_export):
    """The reference itself as the drafter (torch backend) with the exported Gemma-4 target: greedy == target."""
    from dspark_trt.runtime import SpeculativeDecoder
    from dspark_trt.runtime.drafters.torch import TorchDrafterBackend
    from dspark_trt.runtime.targets.base import target_class

    target = target_class("onnxruntime").from_export(gemma_export)
    dec = SpeculativeDecoder(target, TorchDrafterBackend.from_pretrained(gemma_pair.drafter,
                                                                         target_dir=gemma_pair.target, device="cpu"))
    prompts = [list(range(300, 330)), [7, 8]]
    assert dec.generate(prompts, 10, eos_token_id=[]).tokens == dec.generate(prompts, 10, eos_token_id=[],
                                                                              draft=False).tokens


@pytest.mark.rtx
@pytest.mark.parametrize("graph", ["context", "draft"])
def test_tensorrt_rtx_parses_and_builds_the_gemma4_graphs(gemma_export, graph):
    from tests.export.test_rtx import parse_and_build

    layers, size = parse_and_build(gemma_export / "onnx" / f"{graph}.onnx")
    assert layers > 10 and size > 0
