"""fp16 exports on massive activations (issue #16): taps enter context.onnx in fp32, K/V stay finite, and the
fp16 graphs in onnxruntime draft what the fp32 reference drafts."""

from __future__ import annotations

import json

import pytest
import torch

from dspark_trt.export.validate import TOLERANCES, check_finite, compare_draft

pytestmark = pytest.mark.onnx


@pytest.fixture(scope="module")
def massive_pair(tiny_pair, tmp_path_factory):
    """The tiny pair whose fc reads four massive tap channels with weight 0.6 (``testing.massive``)."""
    from dspark_trt import load_drafter
    from dspark_trt.synthetic import TinyCheckpoint
    from dspark_trt.training.quick import save_drafter_like
    from dspark_trt.testing.massive import massive_case

    drafter = load_drafter(tiny_pair.drafter, target_dir=tiny_pair.target)
    massive_case(drafter)
    out = save_drafter_like(drafter, tiny_pair.drafter, tmp_path_factory.mktemp("massive") / "drafter")
    return TinyCheckpoint(drafter=out, target=tiny_pair.target)


def test_check_finite_names_the_fix():
    ok = check_finite("c", torch.float16, torch.ones(2), torch.zeros(3))
    bad = check_finite("c", torch.float16, torch.ones(2), torch.tensor([1.0, float("nan")]))
    assert ok.ok and not bad.ok
    assert "1 of 2 K/V tensors non-finite" in bad.detail and "export in bf16 or fp32" in bad.detail


@pytest.mark.slow  # an fp16 export + validation of the tiny pair (~15 s)
def test_fp16_graphs_draft_what_fp32_drafts_on_massive_activations(massive_pair, onnx_export):
    from dspark_trt import load_drafter
    from dspark_trt.runtime.drafter_graphs import run_context, run_draft
    from dspark_trt.runtime.ort_session import OrtGraph
    from dspark_trt.testing.massive import massive_case

    out = onnx_export(massive_pair, "fp16", 16)  # validated on massive taps too, or it would have raised
    io = json.loads((out / "manifest.json").read_text())["graphs"]
    dtypes = {v["name"]: v["dtype"] for g in io.values() for v in g["inputs"] + g["outputs"]}
    assert dtypes["taps"] == "float32" and dtypes["ctx_k"] == dtypes["ctx_v"] == "float16"
    ref_drafter = load_drafter(massive_pair.drafter, target_dir=massive_pair.target)  # fp32
    case = massive_case(ref_drafter)  # the same planting: fc unchanged, inputs regenerated
    context, draft = OrtGraph(out / "onnx" / "context.onnx"), OrtGraph(out / "onnx" / "draft.onnx")
    k, v = run_context(context, case.taps, case.positions)
    assert k.dtype == torch.float16 and bool(torch.isfinite(k).all() and torch.isfinite(v).all())
    ref_k, ref_v = ref_drafter.context_kv(case.taps, case.positions)
    seeds = torch.tensor([5, 9])
    for temperature in (None, torch.tensor([0.8, 0.0])):
        ref = ref_drafter.draft(case.anchor, ref_k, ref_v, case.ctx_len, topk=16, temperature=temperature, seed=seeds)
        got = run_draft(draft, case.anchor, k, v, case.ctx_len, temperature, seeds, draft_vocab=2500)
        checks = compare_draft(got, ref, TOLERANCES["fp16"], vocab=2500, temperature=temperature, seed=seeds,
                               positions=case.ctx_len + 1)
        assert all(c.ok for c in checks), [c.line() for c in checks if not c.ok]
        if temperature is None:
            assert torch.equal(got.tokens, ref.tokens)


@pytest.mark.rtx
@pytest.mark.slow  # parses and builds an SM80 engine (TensorRT-RTX on the CPU)
def test_strongly_typed_engine_keeps_the_context_fusion_in_fp32(massive_pair, onnx_export):
    """The engine is built strongly typed: the ONNX types are the engine's, so the fp32 island survives."""
    import tensorrt_rtx as trt

    from dspark_trt.export.engine_build import EngineBuildConfig, build_engine

    path = onnx_export(massive_pair, "fp16", 16) / "onnx" / "context.onnx"
    logger = trt.Logger(trt.Logger.ERROR)
    network = trt.Builder(logger).create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    assert trt.OnnxParser(network, logger).parse_from_file(str(path))
    io = {t.name: t.dtype for t in [network.get_input(i) for i in range(network.num_inputs)] +
          [network.get_output(i) for i in range(network.num_outputs)]}
    assert io["taps"] == trt.float32 and io["ctx_k"] == io["ctx_v"] == trt.float16
    matmuls = [network.get_layer(i) for i in range(network.num_layers)
               if network.get_layer(i).type == trt.LayerType.MATRIX_MULTIPLY]
    out_types = [layer.get_output(0).dtype for layer in matmuls]
    assert out_types.count(trt.float32) == 1  # fc; the K/V projections run in fp16
    assert out_types.count(trt.float16) == len(matmuls) - 1 >= 2
    plan = build_engine(path, EngineBuildConfig("tensorrt-rtx", max_batch_size=2, dynamic_ranges={"T": (1, 16, 64)}))
    assert len(plan) > 0
