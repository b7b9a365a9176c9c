"""The ``dspark::DSparkTopKMarkov`` quickly-deployable plugin: the pure parts here, the engine on a GPU host.

The ``tensorrt``-marked test builds a one-node network with the AOT plugin, runs the engine and compares
with the oracle; it is skipped where full TensorRT is missing (this CPU machine). No TensorRT mocks.
"""

from __future__ import annotations

import pytest
import torch

from dspark_trt.plugins.contract import INPUTS, OUTPUTS, PLUGIN_ID, reference_op
from dspark_trt.plugins.tensorrt_plugin import DTYPE_COMBINATIONS, autotune_type_strings, output_layout


def test_autotune_lists_every_dtype_pair_in_contract_order():
    strings = autotune_type_strings()
    assert len(strings) == len(DTYPE_COMBINATIONS) == 9
    names = {"float32": "FP32", "float16": "FP16", "bfloat16": "BF16"}
    for s, (t, w) in zip(strings, DTYPE_COMBINATIONS):
        types = [x.strip() for x in s.split(",")]
        assert len(types) == len(INPUTS) + len(OUTPUTS)
        for c, got in zip((*INPUTS, *OUTPUTS), types):
            want = {"T": names[t], "W": names[w]}.get(c.dtype, {"int32": "INT32", "float32": "FP32"}.get(c.dtype))
            assert got == want, (c.name, s)


def test_output_shapes_follow_the_contract():
    layout = output_layout()
    assert [dt for _, dt in layout] == [c.dtype for c in OUTPUTS]
    dims = [[d for _, d in dims] for dims, _ in layout]
    assert dims == [[0, 1], [0, 1, 2], [0, 1]]  # [B, N], [B, N, k], [B, N] from cand_values [B, N, k]
    assert all(i == 0 for dims_, _ in layout for i, _ in dims_)


@pytest.mark.tensorrt
@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["greedy", "mixed"])
def test_engine_with_the_aot_plugin_matches_the_reference(mode):
    import tensorrt as trt
    import tensorrt.plugin as trtp

    from dspark_trt.plugins.tensorrt_plugin import register_plugin
    from dspark_trt.testing.walk import WalkCase, compare_walks, make_walk_inputs

    register_plugin()
    case = WalkCase(batch=5, steps=7, vocab=1031, draft_vocab=769, rank=192, topk=512, mode=mode,
                    logits_dtype=torch.bfloat16, weights_dtype=torch.bfloat16, logit_scale=0.5)
    inputs = [t.cuda() for t in make_walk_inputs(case)]
    to_trt = {torch.float32: trt.float32, torch.bfloat16: trt.bfloat16, torch.int32: trt.int32}
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    tensors = [network.add_input(c.name, to_trt[t.dtype], tuple(t.shape)) for c, t in zip(INPUTS, inputs)]
    ns, name = PLUGIN_ID.split("::")
    layer = network.add_plugin(getattr(getattr(trtp.op, ns), name)(*tensors, k=case.topk, logit_scale=0.5), aot=True)
    for i, c in enumerate(OUTPUTS):
        layer.get_output(i).name = c.name
        network.mark_output(layer.get_output(i))
    engine_bytes = builder.build_serialized_network(network, builder.create_builder_config())
    assert engine_bytes is not None, "engine build failed"
    engine = trt.Runtime(logger).deserialize_cuda_engine(engine_bytes)
    context = engine.create_execution_context()
    outs = [torch.full((5, 7), -1, dtype=torch.int32, device="cuda"),
            torch.full((5, 7, 512), float("nan"), device="cuda"), torch.full((5, 7), float("nan"), device="cuda")]
    for c, t in zip((*INPUTS, *OUTPUTS), (*inputs, *outs)):
        context.set_tensor_address(c.name, t.data_ptr())
    stream = torch.cuda.Stream()
    assert context.execute_async_v3(stream.cuda_stream)
    stream.synchronize()
    want = reference_op(*(t.cpu() for t in inputs), logit_scale=0.5)
    compare_walks(outs, want, inputs, atol=2e-5, rtol=1e-5)
