"""TensorRT-RTX (real parser and builder, CPU, SM80 target) takes the exported graphs without our plugin:
the DSparkTopKMarkov node falls back to its standard-op local function."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.rtx, pytest.mark.onnx]


def parse_and_build(path, batch=(1, 2, 4), context=(1, 64, 256)):
    """Parse ``path`` and build a serialized engine for SM80 over a B × T profile; returns (layers, bytes)."""
    import tensorrt_rtx as trt

    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    ok = parser.parse_from_file(str(path))
    assert ok, [str(parser.get_error(i)) for i in range(parser.num_errors)]
    config = builder.create_builder_config()
    config.num_compute_capabilities = 1
    config.set_compute_capability(trt.ComputeCapability.SM80, 0)
    profile = builder.create_optimization_profile()
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        dims = list(tensor.shape)
        batch_axis = 1 if len(dims) == 5 else 0  # K/V caches are [L, B, T, H_kv, D]
        shapes = []
        for b, t in zip(batch, context):
            shape = [d for d in dims]
            shape[batch_axis] = b
            shape = [t if d == -1 else d for d in shape]  # the remaining dynamic axis is T
            shapes.append(shape)
        profile.set_shape(tensor.name, *shapes)
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    assert plan is not None, "TensorRT-RTX failed to build the engine"
    return network.num_layers, plan.nbytes


@pytest.mark.parametrize("dtype, topk", [("fp32", 16), ("bf16", 16), ("fp32", "off")])
def test_rtx_parses_and_builds_the_draft_graph(tiny_pair, onnx_export, dtype, topk):
    layers, size = parse_and_build(onnx_export(tiny_pair, dtype, topk) / "onnx" / "draft.onnx")
    assert layers > 100 and size > 0


def test_rtx_parses_and_builds_the_context_graph(tiny_pair, onnx_export):
    layers, size = parse_and_build(onnx_export(tiny_pair, "bf16", 16) / "onnx" / "context.onnx")
    assert layers > 10 and size > 0


def test_rtx_parses_and_builds_the_causal_windowed_draft_graph(tiny_causal_pair, onnx_export):
    """speculators' causal sliding-window mask (per-query masks, a window on the context) in TensorRT-RTX."""
    layers, size = parse_and_build(onnx_export(tiny_causal_pair, "fp32", 16) / "onnx" / "draft.onnx")
    assert layers > 100 and size > 0


@pytest.mark.parametrize("topk", [16, "off"], ids=["topk16", "dense"])
@pytest.mark.parametrize("pair_name, op", [("gated_pair", "DSparkTopKMarkovGated"),
                                           ("rnn_pair", "DSparkTopKMarkovRNN")], ids=["gated", "rnn"])
def test_rtx_parses_and_builds_the_gated_and_rnn_draft_graphs(pair_name, op, topk, onnx_export, request):
    """issue 42: TensorRT-RTX (no plugins) builds a gated / RNN head's draft graph, its walk node from the local
    function (N chained steps, the rnn state threaded between them; ~6 s each here), and the dense graphs."""
    import onnx

    path = onnx_export(request.getfixturevalue(pair_name), "fp32", topk) / "onnx" / "draft.onnx"
    ops = [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node if n.domain == "dspark"]
    assert ops == ([op] if topk == 16 else [])
    layers, size = parse_and_build(path)
    assert layers > 100 and size > 0


@pytest.mark.slow  # three engines of the Gemma-4 export
def test_rtx_builds_the_gemma4_target_engine_for_the_runtimes_ring(gemma4_export, tmp_path):
    """``dspark build-engine`` on a Gemma-4 export (TensorRT-RTX, no GPU): the target engine's profiles take ``W`` up
    to the ring the runtime binds (``gemma4.ring``: window 8 − 1 + 64, the optimum), so ``Gemma4TensorRTTarget``
    takes it."""
    import shutil

    from dspark_trt.export.pipeline import build_engines
    from dspark_trt.runtime.targets.tensorrt import check_ring_profile

    export = shutil.copytree(gemma4_export, tmp_path / "export")
    manifest = build_engines(export, engine="tensorrt-rtx")
    entry = manifest["engines"]["target.tensorrt-rtx"]
    gemma4 = manifest["target"]["gemma4"]
    assert (export / entry["file"]).stat().st_size > 0 and gemma4["ring"] == 71
    assert entry["build"]["dynamic_ranges"]["W"] == [1, 71, 71]
    assert all(p["window_positions"]["max"][1] == 71 for p in entry["profiles"])
    check_ring_profile(entry, gemma4)
