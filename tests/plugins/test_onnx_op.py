"""The DSparkTopKMarkov ONNX schema and its standard-op local function, against the contract's reference op."""

from __future__ import annotations

import pytest
import torch

from dspark_trt.plugins.contract import ATTRIBUTES, INPUTS, OP_DOMAIN, OP_NAME, OUTPUTS, reference_op

pytestmark = pytest.mark.onnx

_ONNX_TYPES = {torch.float32: 1, torch.float16: 10, torch.bfloat16: 16, torch.int32: 6}


def one_node_model(args: dict, k: int, logit_scale: float, num_draft_tokens: int, *, weights_as_initializers=True,
                   attributes: dict | None = None):
    """A model with a single DSparkTopKMarkov node + its local function; W1/W2 as initializers (as exported)."""
    import onnx
    from onnx import helper, numpy_helper

    from dspark_trt.plugins.onnx_op import local_function, node_attributes

    def tensor(name, t):
        if t.dtype == torch.bfloat16:
            import ml_dtypes

            return numpy_helper.from_array(t.float().numpy().astype(ml_dtypes.bfloat16), name)
        return numpy_helper.from_array(t.numpy(), name)

    inits = [tensor(n, args[n]) for n in ("markov_w1", "markov_w2")] if weights_as_initializers else []
    init_names = {i.name for i in inits}
    inputs = [helper.make_tensor_value_info(n, _ONNX_TYPES[a.dtype], list(a.shape))
              for n, a in args.items() if n not in init_names]
    B, N = args["cand_values"].shape[:2]
    outputs = [helper.make_tensor_value_info("draft_tokens", onnx.TensorProto.INT32, ["B", N]),
               helper.make_tensor_value_info("cand_logits", onnx.TensorProto.FLOAT, ["B", N, k]),
               helper.make_tensor_value_info("confidence", onnx.TensorProto.FLOAT, ["B", N])]
    node = helper.make_node(OP_NAME, [t.name for t in INPUTS], [t.name for t in OUTPUTS], domain=OP_DOMAIN,
                            **(attributes if attributes is not None else node_attributes(k, logit_scale)))
    fn = local_function(num_draft_tokens, args["cand_values"].dtype, args["markov_w1"].dtype)
    graph = helper.make_graph([node], "one_node", inputs, outputs, initializer=inits)
    opset = next(o.version for o in fn.opset_import if o.domain == "")
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(OP_DOMAIN, 1)],
                             functions=[fn])


def random_case(B, N, V, Vd, r, k, *, seed=0, values_dtype=torch.float32, weights_dtype=torch.float32,
                temperatures=None):
    """Contract inputs: candidates = top-k of random base logits; reduced vocab gets a random d2t."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(B, N, Vd, generator=g) * 2
    vals, ids = base.topk(k, dim=-1)
    draft_ids = torch.randperm(V, generator=g)[:Vd].sort().values if Vd < V else torch.arange(V)
    temps = torch.zeros(B) if temperatures is None else torch.tensor(temperatures)[torch.arange(B) % len(temperatures)]
    return {
        "cand_values": vals.to(values_dtype),
        "cand_ids": ids.to(torch.int32),
        "anchor": torch.randint(0, V, (B,), generator=g, dtype=torch.int32),
        "markov_w1": torch.randn(V, r, generator=g).to(weights_dtype),
        "markov_w2": torch.randn(Vd, r, generator=g).to(weights_dtype),
        "d2t": (draft_ids - torch.arange(Vd)).to(torch.int32),
        "temperature": temps.to(torch.float32),
        "seed": torch.randint(0, 2**31 - 1, (B,), generator=g, dtype=torch.int32),
        "position": torch.randint(1, 5000, (B,), generator=g, dtype=torch.int32),
        "conf_base": torch.randn(B, N, generator=g),
        "conf_w": torch.randn(r, generator=g),
    }


def run_ort(model, args):
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {i.name: args[i.name].numpy() for i in session.get_inputs()}
    return [torch.from_numpy(x) for x in session.run(None, feeds)]


# vocab 257 / 199 and rank 8: not powers of two; k ∈ {1, 16, V_d}; greedy, sampled, mixed per request
CASES = [
    pytest.param(dict(B=3, N=4, V=257, Vd=257, r=8, k=1), [0.0], id="k1-greedy"),
    pytest.param(dict(B=3, N=4, V=257, Vd=257, r=8, k=16), [0.0], id="k16-greedy"),
    pytest.param(dict(B=3, N=4, V=257, Vd=257, r=8, k=16), [1.0, 0.0, 0.6], id="k16-mixed"),
    pytest.param(dict(B=1, N=4, V=257, Vd=257, r=8, k=257), [1.3], id="kV-sampled-B1"),
    pytest.param(dict(B=3, N=4, V=257, Vd=199, r=8, k=199), [0.0, 0.9], id="kVd-reduced-vocab"),
    pytest.param(dict(B=2, N=4, V=257, Vd=199, r=8, k=16), [0.8], id="k16-reduced-vocab-sampled"),
]


@pytest.mark.parametrize("shape, temperatures", CASES)
@pytest.mark.parametrize("logit_scale", [1.0, 0.5])
def test_local_function_matches_reference_op(shape, temperatures, logit_scale):
    """fp32: the function run by onnxruntime = reference_op (tokens exact; logits to fp32 GEMM rounding)."""
    import onnx

    from dspark_trt.plugins.onnx_op import register_schema

    register_schema()
    args = random_case(**shape, temperatures=temperatures, seed=shape["k"] + int(10 * logit_scale))
    model = one_node_model(args, shape["k"], logit_scale, shape["N"])
    onnx.checker.check_model(model, full_check=True)
    tokens, logits, conf = run_ort(model, args)
    ref_tokens, ref_logits, ref_conf = reference_op(**args, logit_scale=logit_scale)
    assert tokens.dtype == torch.int32 and torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)  # fp32; bias GEMM summed in another order
    torch.testing.assert_close(conf, ref_conf, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("values_dtype, weights_dtype", [(torch.float32, torch.bfloat16), (torch.float16, torch.float16)])
def test_local_function_low_precision_inputs(values_dtype, weights_dtype):
    """bf16/fp16 weights and fp16 candidate values: both sides upcast the same values and walk in fp32."""
    from dspark_trt.plugins.onnx_op import register_schema

    register_schema()
    args = random_case(B=3, N=5, V=257, Vd=257, r=8, k=16, values_dtype=values_dtype, weights_dtype=weights_dtype,
                       temperatures=[0.0, 0.7])
    model = one_node_model(args, 16, 1.0, 5)
    tokens, logits, conf = run_ort(model, args)
    ref_tokens, ref_logits, ref_conf = reference_op(**args, logit_scale=1.0)
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(conf, ref_conf, atol=1e-6, rtol=1e-6)


def test_same_seed_same_tokens_other_seed_other_tokens():
    """Probabilistic drafting is a function of the seed: repeatable, and the seed matters."""
    from dspark_trt.plugins.onnx_op import register_schema

    register_schema()
    args = random_case(B=3, N=4, V=257, Vd=257, r=8, k=257, temperatures=[2.0])
    model = one_node_model(args, 257, 1.0, 4)
    first, again = run_ort(model, args)[0], run_ort(model, args)[0]
    other = run_ort(model, {**args, "seed": args["seed"] + 1})[0]
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    assert torch.equal(other, reference_op(**{**args, "seed": args["seed"] + 1}, logit_scale=1.0)[0])


def test_schema_documents_the_contract():
    import onnx.defs

    from dspark_trt.plugins.onnx_op import FLOAT_TYPES, register_schema

    register_schema()
    register_schema()  # idempotent: a second registration would raise SchemaError
    schema = onnx.defs.get_schema(OP_NAME, 1, OP_DOMAIN)
    assert [p.name for p in schema.inputs] == [t.name for t in INPUTS]
    assert [p.name for p in schema.outputs] == [t.name for t in OUTPUTS]
    for param, contract in zip(list(schema.inputs) + list(schema.outputs), INPUTS + OUTPUTS):
        assert contract.shape in param.description and contract.dtype in param.description
    constraints = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    assert constraints == {"T": set(FLOAT_TYPES), "W": set(FLOAT_TYPES)}
    assert set(ATTRIBUTES) | {"plugin_version", "plugin_namespace", "aot"} == set(schema.attributes)
    assert schema.attributes["k"].required and not schema.attributes["plugin_version"].required


def test_checker_rejects_a_node_that_breaks_the_schema():
    """The registered schema is really consulted: missing `k`, or float ids, fail the full check."""
    import onnx

    from dspark_trt.plugins.onnx_op import node_attributes, register_schema

    register_schema()
    args = random_case(B=2, N=1, V=37, Vd=37, r=8, k=4)
    attrs = node_attributes(4, 1.0)
    del attrs["k"]
    with pytest.raises(onnx.checker.ValidationError, match="k"):
        onnx.checker.check_model(one_node_model(args, 4, 1.0, 1, attributes=attrs), full_check=True)
    bad = one_node_model({**args, "cand_ids": args["cand_ids"].float()}, 4, 1.0, 1)
    with pytest.raises((onnx.checker.ValidationError, onnx.shape_inference.InferenceError)):
        onnx.checker.check_model(bad, full_check=True)


def test_shape_inference_of_the_node():
    import onnx

    from dspark_trt.plugins.onnx_op import register_schema

    register_schema()
    args = random_case(B=2, N=3, V=37, Vd=37, r=8, k=5)
    model = one_node_model(args, 5, 1.0, 3)
    del model.graph.output[:]
    model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(t.name) for t in OUTPUTS)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    types = {v.name: v.type.tensor_type for v in inferred.graph.value_info}
    dims = {n: [d.dim_value for d in t.shape.dim] for n, t in types.items() if n in {o.name for o in OUTPUTS}}
    assert dims == {"draft_tokens": [2, 3], "cand_logits": [2, 3, 5], "confidence": [2, 3]}
    assert types["draft_tokens"].elem_type == onnx.TensorProto.INT32
    assert types["cand_logits"].elem_type == types["confidence"].elem_type == onnx.TensorProto.FLOAT


def test_local_function_is_standard_ops_chaining_the_exported_step():
    """N chained steps, only default-domain ops, the integer hash as int64 Mul/Add/Mod (TensorRT-parsable)."""
    from collections import Counter

    from dspark_trt.plugins.onnx_op import local_function

    fn = local_function(4)
    assert (fn.domain, fn.name) == (OP_DOMAIN, OP_NAME)
    assert list(fn.input) == [t.name for t in INPUTS] and list(fn.output) == [t.name for t in OUTPUTS]
    assert {n.domain for n in fn.node} <= {"", "ai.onnx"}
    ops = Counter(n.op_type for n in fn.node)
    assert ops["ArgMax"] == 4 and ops["Sigmoid"] == 4  # one pick and one confidence per step
    assert ops["Mod"] >= 4 * 4  # the hash: two rounds × two mods per mix, per step
    assert {"Loop", "If", "Scan"}.isdisjoint(ops)  # unrolled: static shapes, CUDA-graph friendly
    assert local_function(5) is not local_function(5) and len(local_function(5).node) > len(fn.node)
