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
    from dspark_trt.runtime.drafters.tensorrt import TensorRTDrafterBackend
    from dspark_trt.plugins.walk_compare import by_candidate_id

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
    from dspark_trt.plugins.walk_compare import WalkCase, compare_walks, make_walk_inputs

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


# --------------------------------------------------------------------- dspark::DSparkTopKMarkovUnion (pure parts)
def test_union_autotune_lists_13_inputs_and_4_outputs_per_dtype_pair():
    from dspark_trt.plugins.contract import UNION_INPUTS, UNION_OUTPUTS

    strings = autotune_type_strings(union=True)
    assert len(strings) == 9
    names = {"float32": "FP32", "float16": "FP16", "bfloat16": "BF16"}
    for s, (t, w) in zip(strings, DTYPE_COMBINATIONS):
        types = [x.strip() for x in s.split(",")]
        assert len(types) == len(UNION_INPUTS) + len(UNION_OUTPUTS) == 17
        assert types[:11] == [x.strip() for x in autotune_type_strings()[DTYPE_COMBINATIONS.index((t, w))].split(",")][:11]
        # union_table int32, base_logits the logits type T; outputs int32, fp32, fp32, int32
        assert types[11:] == ["INT32", names[t], "INT32", "FP32", "FP32", "INT32"], s


def test_union_output_shapes_follow_the_contract():
    from dspark_trt.plugins.contract import UNION_OUTPUTS
    from dspark_trt.plugins.tensorrt_plugin import output_shapes, union_output_layout

    layout = union_output_layout()
    assert [dt for _, dt in layout] == [c.dtype for c in UNION_OUTPUTS] == ["int32", "float32", "float32", "int32"]
    # evaluated on ints where TensorRT evaluates shape expressions: B=5, N=7, k=16 (cand_values), M=32 (union_table)
    shapes = {0: (5, 7, 16), 11: (257, 32)}
    assert output_shapes(layout, shapes) == [(5, 7), (5, 7, 48), (5, 7), (5, 7, 32)]
    assert output_shapes(output_layout(), shapes) == [(5, 7), (5, 7, 16), (5, 7)]  # the plain op's, same helper

    class Expr:  # what TensorRT's ShapeExpr offers the describe function: addition, nothing else
        def __init__(self, text):
            self.text = text

        def __add__(self, other):
            return Expr(f"({self.text} + {other.text})")

    sym = {0: tuple(Expr(f"cv{d}") for d in range(3)), 11: (Expr("t0"), Expr("t1"))}
    assert [[e.text for e in s] for s in output_shapes(layout, sym)] == [
        ["cv0", "cv1"], ["cv0", "cv1", "(cv2 + t1)"], ["cv0", "cv1"], ["cv0", "cv1", "t1"]]


def test_union_kernel_spec_from_a_node():
    from dspark_trt.plugins.tensorrt_plugin import union_kernel_spec

    spec = union_kernel_spec((None, 7, 512), (None, 32), k=512, markov_topm=32, rank=256, logit_scale=0.5,
                             logits_dtype="float32", weights_dtype="bfloat16", arch=90)
    assert (spec.num_draft_tokens, spec.topk, spec.markov_topm, spec.rank, spec.logit_scale) == (7, 512, 32, 256, 0.5)
    assert spec.op_name == "DSparkTopKMarkovUnion" and spec.plugin_id == "dspark::DSparkTopKMarkovUnion"
    with pytest.raises(DSparkTrtError, match="attribute markov_topm=16 but union_table has M=32; re-export"):
        union_kernel_spec((None, 7, 512), (None, 32), k=512, markov_topm=16, rank=256, logit_scale=0.5,
                          logits_dtype="float32", weights_dtype="bfloat16", arch=90)
    with pytest.raises(DSparkTrtError, match="attribute k=64 but cand_values has k=512"):
        union_kernel_spec((None, 7, 512), (None, 32), k=64, markov_topm=32, rank=256, logit_scale=0.5,
                          logits_dtype="float32", weights_dtype="bfloat16", arch=90)


def test_one_spec_builder_serves_both_ops():
    """The plain op's AOT hook builds its spec with the union's code at M = 0 (no table): the spec, and so the
    PTX it selects or compiles, is the plain op's."""
    from dspark_trt.plugins.aot import DEFAULT_PTX_ISA, WalkKernelSpec
    from dspark_trt.plugins.tensorrt_plugin import node_kernel_spec

    spec = node_kernel_spec((None, 7, 512), None, k=512, rank=256, logit_scale=0.5, logits_dtype="float32",
                            weights_dtype="bfloat16", arch=90)
    assert spec == WalkKernelSpec(7, 512, 256, 0.5, "float32", "bfloat16", 90, DEFAULT_PTX_ISA)
    assert spec.op_name == "DSparkTopKMarkov" and spec.markov_topm == 0 and not spec.union
    with pytest.raises(DSparkTrtError, match="^DSparkTopKMarkov attribute k=64 but cand_values has k=512; re-export"):
        node_kernel_spec((None, 7, 512), None, k=64, rank=256, logit_scale=0.5, logits_dtype="float32",
                         weights_dtype="bfloat16", arch=90)


def test_export_ptx_is_chosen_per_op(tmp_path):
    """``use_export_ptx`` with one description per op: a node of an op the export did not build is refused."""
    from dspark_trt.plugins import tensorrt_plugin as tp
    from dspark_trt.plugins.aot import WalkKernelSpec

    plain = {"op": "DSparkTopKMarkov", "constexprs": {"N": 7, "K": 16, "R": 8, "LOGIT_SCALE": 1.0}, "kernels": []}
    try:
        tp.use_export_ptx([plain], tmp_path)
        spec = WalkKernelSpec(7, 16, 8, 1.0, "float32", "float32", 80, markov_topm=4)
        with pytest.raises(DSparkTrtError, match="no PTX for DSparkTopKMarkovUnion .it has DSparkTopKMarkov."):
            tp._kernel_for(spec)
        tp.use_export_ptx(plain, tmp_path)  # a single description still works (the plain op's)
        with pytest.raises(DSparkTrtError, match="no PTX for sm_80 float32-float32"):  # found, then checked
            tp._kernel_for(WalkKernelSpec(7, 16, 8, 1.0, "float32", "float32", 80))
    finally:
        tp.use_export_ptx(None)


def test_register_union_plugin_refuses_without_tensorrt():
    try:
        import tensorrt  # noqa: F401
        pytest.skip("TensorRT is importable here")
    except Exception:
        pass
    from dspark_trt.plugins.tensorrt_plugin import register_plugins, register_union_plugin

    with pytest.raises(DSparkTrtError, match="needs full TensorRT"):
        register_union_plugin.__wrapped__()
    with pytest.raises(DSparkTrtError, match="needs full TensorRT"):
        register_plugins()


@pytest.mark.tensorrt
@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["greedy", "mixed"])
def test_engine_with_the_union_plugin_matches_the_reference(mode):
    import tensorrt as trt
    import tensorrt.plugin as trtp

    from dspark_trt.plugins.contract import UNION_INPUTS, UNION_OUTPUTS, UNION_PLUGIN_ID, reference_union_op
    from dspark_trt.plugins.tensorrt_plugin import register_plugins
    from dspark_trt.plugins.walk_compare import WalkCase, compare_union_walks, make_union_inputs

    register_plugins()
    M = 32
    case = WalkCase(batch=5, steps=7, vocab=1031, draft_vocab=769, rank=192, topk=512, mode=mode,
                    logits_dtype=torch.bfloat16, weights_dtype=torch.bfloat16, logit_scale=0.5)
    inputs = [t.cuda() for t in make_union_inputs(case, M)]
    to_trt = {torch.float32: trt.float32, torch.bfloat16: trt.bfloat16, torch.int32: trt.int32}
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    tensors = [network.add_input(c.name, to_trt[t.dtype], tuple(t.shape)) for c, t in zip(UNION_INPUTS, inputs)]
    ns, name = UNION_PLUGIN_ID.split("::")
    op = getattr(getattr(trtp.op, ns), name)
    layer = network.add_plugin(op(*tensors, k=case.topk, logit_scale=0.5, markov_topm=M), aot=True)
    for i, c in enumerate(UNION_OUTPUTS):
        layer.get_output(i).name = c.name
        network.mark_output(layer.get_output(i))
    engine_bytes = builder.build_serialized_network(network, builder.create_builder_config())
    assert engine_bytes is not None, "engine build failed"
    engine = trt.Runtime(logger).deserialize_cuda_engine(engine_bytes)
    context = engine.create_execution_context()
    outs = [torch.full((5, 7), -1, dtype=torch.int32, device="cuda"),
            torch.full((5, 7, 512 + M), float("nan"), device="cuda"), torch.full((5, 7), float("nan"), device="cuda"),
            torch.full((5, 7, M), -1, dtype=torch.int32, device="cuda")]
    for c, t in zip((*UNION_INPUTS, *UNION_OUTPUTS), (*inputs, *outs)):
        context.set_tensor_address(c.name, t.data_ptr())
    stream = torch.cuda.Stream()
    assert context.execute_async_v3(stream.cuda_stream)
    stream.synchronize()
    want = reference_union_op(*(t.cpu() for t in inputs), logit_scale=0.5)
    compare_union_walks(outs, want, inputs, atol=2e-5, rtol=1e-5)


# --------------------------------------------------------------------- the gated and RNN heads' plugins (pure parts)
@pytest.mark.parametrize("head, n_inputs, extra", [
    ("gated", 13, ["FP32", "W"]),  # gate_hidden fp32, gate_w the weights type
    ("rnn", 14, ["FP32", "W", "FP32"]),  # joint_hidden fp32, joint_w W, rnn_state0 fp32
])
def test_head_autotune_lists_the_head_inputs_per_dtype_pair(head, n_inputs, extra):
    strings = autotune_type_strings(markov_head_type=head)
    assert len(strings) == len(DTYPE_COMBINATIONS) == 9
    names = {"float32": "FP32", "float16": "FP16", "bfloat16": "BF16"}
    plain = autotune_type_strings()
    for s, p, (t, w) in zip(strings, plain, DTYPE_COMBINATIONS):
        types = [x.strip() for x in s.split(",")]
        plain_types = [x.strip() for x in p.split(",")]
        assert len(types) == n_inputs + len(OUTPUTS)
        assert types[:11] == plain_types[:11] and types[n_inputs:] == plain_types[11:]  # same inputs 0-10, outputs
        assert types[11:n_inputs] == [names[w] if x == "W" else x for x in extra], s


@pytest.mark.parametrize("head", ["gated", "rnn"])
def test_head_node_kernel_spec_and_shape_checks(head):
    from dspark_trt.plugins.aot import DEFAULT_PTX_ISA, WalkKernelSpec
    from dspark_trt.plugins.tensorrt_plugin import check_head_shapes, head_input_dims, node_kernel_spec

    spec = node_kernel_spec((None, 7, 512), None, k=512, rank=256, logit_scale=0.5, logits_dtype="float32",
                            weights_dtype="bfloat16", arch=90, markov_head_type=head)
    assert spec == WalkKernelSpec(7, 512, 256, 0.5, "float32", "bfloat16", 90, DEFAULT_PTX_ISA, 0, head)
    op = "DSparkTopKMarkovGated" if head == "gated" else "DSparkTopKMarkovRNN"
    assert spec.op_name == op and spec.plugin_id == f"dspark::{op}"
    with pytest.raises(DSparkTrtError, match=f"^{op} attribute k=64 but cand_values has k=512; re-export"):
        node_kernel_spec((None, 7, 512), None, k=64, rank=256, logit_scale=0.5, logits_dtype="float32",
                         weights_dtype="bfloat16", arch=90, markov_head_type=head)
    dims = head_input_dims(head)
    if head == "gated":  # from the contract's shapes, B (dynamic) left out
        assert dims == {"gate_hidden": ((1, "N"), (2, "r")), "gate_w": ((0, "r"), (1, "r"))}
        good = {"gate_hidden": (5, 7, 256), "gate_w": (256, 256)}
        bad = {**good, "gate_w": (256, 255)}
        message = r"DSparkTopKMarkovGated input gate_w has 255 at dim 1, the contract needs r = 256"
    else:
        assert dims == {"joint_hidden": ((1, "N"), (2, "3r")), "joint_w": ((0, "3r"), (1, "2r")),
                        "rnn_state0": ((1, "r"),)}
        good = {"joint_hidden": (5, 7, 768), "joint_w": (768, 512), "rnn_state0": (5, 256)}
        bad = {**good, "joint_hidden": (5, 6, 768)}
        message = r"DSparkTopKMarkovRNN input joint_hidden has 6 at dim 1, the contract needs N = 7"
    check_head_shapes(head, good, n=7, rank=256)
    with pytest.raises(DSparkTrtError, match=message):
        check_head_shapes(head, bad, n=7, rank=256)


def test_export_ptx_of_another_op_is_refused_for_a_head_node(tmp_path):
    from dspark_trt.plugins import tensorrt_plugin as tp
    from dspark_trt.plugins.aot import WalkKernelSpec

    plain = {"op": "DSparkTopKMarkov", "constexprs": {"N": 7, "K": 16, "R": 8, "LOGIT_SCALE": 1.0}, "kernels": []}
    try:
        tp.use_export_ptx([plain], tmp_path)
        for head, op in (("gated", "DSparkTopKMarkovGated"), ("rnn", "DSparkTopKMarkovRNN")):
            with pytest.raises(DSparkTrtError, match=f"no PTX for {op} .it has DSparkTopKMarkov."):
                tp._kernel_for(WalkKernelSpec(7, 16, 8, 1.0, "float32", "float32", 80, markov_head_type=head))
    finally:
        tp.use_export_ptx(None)


def test_register_head_plugins_refuses_without_tensorrt():
    try:
        import tensorrt  # noqa: F401
        pytest.skip("TensorRT is importable here")
    except Exception:
        pass
    from dspark_trt.plugins.tensorrt_plugin import _register_gated_plugin, _register_rnn_plugin

    for register in (_register_gated_plugin, _register_rnn_plugin):
        with pytest.raises(DSparkTrtError, match="needs full TensorRT"):
            register.__wrapped__()


@pytest.mark.tensorrt
@pytest.mark.gpu
@pytest.mark.parametrize("head", ["gated", "rnn"])
@pytest.mark.parametrize("mode", ["greedy", "mixed"])
def test_engine_with_a_head_plugin_matches_the_reference(head, mode):
    import tensorrt as trt
    import tensorrt.plugin as trtp

    from dspark_trt.plugins.contract import HEAD_OPS, REFERENCE_OPS
    from dspark_trt.plugins.tensorrt_plugin import register_plugins
    from dspark_trt.plugins.walk_compare import WalkCase, compare_walks, make_head_inputs

    register_plugins()
    op, contract = HEAD_OPS[head]
    case = WalkCase(batch=5, steps=7, vocab=1031, draft_vocab=769, rank=192, topk=512, mode=mode,
                    logits_dtype=torch.bfloat16, weights_dtype=torch.bfloat16, logit_scale=0.5)
    inputs = [t.cuda() for t in make_head_inputs(case, head)]
    to_trt = {torch.float32: trt.float32, torch.bfloat16: trt.bfloat16, torch.int32: trt.int32}
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    tensors = [network.add_input(c.name, to_trt[t.dtype], tuple(t.shape)) for c, t in zip(contract, inputs)]
    layer = network.add_plugin(getattr(trtp.op.dspark, op)(*tensors, k=case.topk, logit_scale=0.5), aot=True)
    for i, c in enumerate(OUTPUTS):
        layer.get_output(i).name = c.name
        network.mark_output(layer.get_output(i))
    engine_bytes = builder.build_serialized_network(network, builder.create_builder_config())
    assert engine_bytes is not None, "engine build failed"
    engine = trt.Runtime(logger).deserialize_cuda_engine(engine_bytes)
    context = engine.create_execution_context()
    outs = [torch.full((5, 7), -1, dtype=torch.int32, device="cuda"),
            torch.full((5, 7, 512), float("nan"), device="cuda"), torch.full((5, 7), float("nan"), device="cuda")]
    for c, t in zip((*contract, *OUTPUTS), (*inputs, *outs)):
        context.set_tensor_address(c.name, t.data_ptr())
    stream = torch.cuda.Stream()
    assert context.execute_async_v3(stream.cuda_stream)
    stream.synchronize()
    want = REFERENCE_OPS[head](*(t.cpu() for t in inputs), logit_scale=0.5)
    compare_walks(outs, want, inputs, atol=2e-5, rtol=1e-5)
