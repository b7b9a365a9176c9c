"""The ``dspark::DSparkTopKMarkov`` quickly-deployable plugin: the pure parts here, the engine on a GPU host.

The ``tensorrt``-marked test builds a one-node network with the AOT plugin, runs the engine and compares
with the oracle; it is skipped where full TensorRT is missing (this CPU machine). No TensorRT mocks.
"""

from __future__ import annotations

import pytest
import torch

from dspark_trt.plugins.contract import INPUTS, OUTPUTS, PLUGIN_ID, reference_op
from dspark_trt.errors import DSparkTrtError
from dspark_trt.plugins.tensorrt_plugin import (DTYPE_COMBINATIONS, autotune_type_strings, check_tensorrt_version,
                                                output_layout)


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


@pytest.mark.parametrize("version", ["10.9.0.34", "10.13.3.9", "11.1.0.2"])
def test_tensorrt_with_aot_plugins_is_accepted(version):
    check_tensorrt_version(version, True)


@pytest.mark.parametrize("version,klp", [("10.8.0.43", True), ("10.6.0.26", False), ("8.6.1", False),
                                         ("10.13.0.35", False)])
def test_tensorrt_without_aot_plugins_is_refused_in_one_line(version, klp):
    with pytest.raises(DSparkTrtError, match=r"no ahead-of-time plugins .*TensorRT >= 10.9") as e:
        check_tensorrt_version(version, klp)
    assert "\n" not in str(e.value)


def test_register_plugin_refuses_before_registering_anything_without_tensorrt():
    from dspark_trt.runtime.tensorrt_engine import tensorrt_available

    try:
        import tensorrt  # noqa: F401
        pytest.skip("TensorRT is importable here")
    except Exception:
        pass
    from dspark_trt.plugins.tensorrt_plugin import register_plugin

    with pytest.raises(DSparkTrtError, match="needs full TensorRT"):
        register_plugin.__wrapped__()
    assert tensorrt_available() is not None


@pytest.mark.tensorrt
@pytest.mark.gpu
@pytest.mark.onnx
@pytest.mark.slow
def test_the_exports_path_draft_plugin_onnx_parser_aot_plugin_dynamic_batch(tiny_pair, tmp_path):
    """What dspark-export really does: draft.plugin.onnx → OnnxParser → the AOT plugin with the export's own
    PTX, one profile over the batch (1..8) and the context; then the engine at B = 1 and B = 5 against the
    reference drafter, through the tensorrt backend (CUDA graphs per bucket)."""
    from dspark_trt import load_drafter
    from dspark_trt.export.pipeline import ExportOptions, export_model
    from dspark_trt.plugins.tensorrt_plugin import embedded_kernels
    from dspark_trt.runtime.backends.tensorrt_backend import TensorRTDrafterBackend
    from dspark_trt.testing.walk import by_candidate_id

    out = tmp_path / "export"
    result = export_model(tiny_pair.drafter, out, ExportOptions(topk=16, dtype="fp32", engine="tensorrt",
                                                                max_batch_size=8, max_context=256),
                          target_dir=tiny_pair.target)
    draft = result.manifest["engines"]["draft.tensorrt"]
    assert draft["onnx"] == "onnx/draft.plugin.onnx" and draft["profile"]["anchor"]["max"] == [8]
    (kernel,) = draft["plugin_kernels"]
    assert kernel["source"] == "export"  # the PTX the export built and checked, not a recompilation
    shipped = {k["file"]: k["sha256"] for k in result.manifest["kernel"]["kernels"]}
    assert shipped[kernel["file"]] == kernel["sha256"] and kernel in embedded_kernels()
    drafter = load_drafter(tiny_pair.drafter, target_dir=tiny_pair.target, device="cuda", dtype="fp32")
    with TensorRTDrafterBackend.from_export(out) as backend:
        for B in (1, 5):
            g = torch.Generator().manual_seed(B)
            c = drafter.config
            taps = torch.randn(B, 9, c.num_taps * c.hidden_size, generator=g).cuda()
            pos = torch.arange(9, device="cuda").expand(B, 9)
            k, v = backend.context_kv(taps, pos)
            rk, rv = drafter.context_kv(taps, pos)
            torch.testing.assert_close(k.float(), rk, rtol=1e-3, atol=1e-3)
            ctx_len = torch.randint(1, 10, (B,), generator=g).cuda()
            anchor = torch.randint(0, c.vocab_size, (B,), generator=g).cuda()
            temp = torch.rand(B, generator=g).cuda()
            seed = torch.arange(B, device="cuda")
            got = by_candidate_id(backend.draft(anchor, rk, rv, ctx_len, topk=16, temperature=temp, seed=seed))
            want = by_candidate_id(drafter.draft(anchor, rk, rv, ctx_len, topk=16, temperature=temp, seed=seed))
            assert torch.equal(got.tokens.cpu(), want.tokens.cpu())
            assert torch.equal(got.cand_ids.cpu(), want.cand_ids.cpu())


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
