"""The DSparkTopKMarkovUnion ONNX schema and its standard-op local function, against ``reference_union_op``."""

from __future__ import annotations

import pytest
import torch

from dspark_trt.plugins.contract import (OP_CONTRACT_VERSION, OP_DOMAIN, OP_VERSIONS, UNION_ATTRIBUTES, UNION_INPUTS,
                                         UNION_OP_NAME, UNION_OUTPUTS, reference_union_op)
from tests.plugins.test_onnx_op import _ONNX_TYPES, random_case, run_ort

pytestmark = pytest.mark.onnx


def union_case(B, N, V, Vd, r, k, M, *, seed=0, temperatures=None, values_dtype=torch.float32,
               weights_dtype=torch.float32, logit_scale=1.0):
    """Contract inputs of the union op: ``random_case`` + the Markov table of its weights (rows 0..V/2) and, for
    the other rows, random ids, some of them copied from the slot's top-k so duplicates are masked."""
    from dspark_trt.reference.markov import markov_union_table

    args = random_case(B, N, V, Vd, r, k, seed=seed, temperatures=temperatures, values_dtype=values_dtype,
                       weights_dtype=weights_dtype)
    g = torch.Generator().manual_seed(seed + 1)
    base = torch.randn(B, N, Vd, generator=g) * 2
    vals, ids = base.topk(k, dim=-1)
    table = markov_union_table(args["markov_w1"], args["markov_w2"], M, logit_scale=logit_scale)  # [V, M]
    rand = torch.stack([torch.randperm(Vd, generator=g)[:M] for _ in range(V)]).to(torch.int32)
    table[V // 2:] = rand[V // 2:]
    # predecessors' rows hold some of the slot's top-k ids: masked duplicates in the union
    hot = ids[..., :max(1, min(k, M) // 2)].reshape(-1).to(torch.int32)
    table[: len(hot), : min(M, 1)] = hot[: min(len(hot), V)].view(-1, 1)[:, :1]
    args.update(cand_values=vals.to(values_dtype), cand_ids=ids.to(torch.int32), union_table=table,
                base_logits=base.to(values_dtype))
    return args


def union_node_model(args: dict, k: int, M: int, logit_scale: float, num_draft_tokens: int, *,
                     attributes: dict | None = None):
    """A model with one DSparkTopKMarkovUnion node + its local function; W1/W2 and the table as initializers."""
    import onnx
    from onnx import helper, numpy_helper

    from dspark_trt.plugins.onnx_op import UNION_OPSET_VERSION, union_local_function, union_node_attributes

    def tensor(name, t):
        if t.dtype == torch.bfloat16:
            import ml_dtypes

            return numpy_helper.from_array(t.float().numpy().astype(ml_dtypes.bfloat16), name)
        return numpy_helper.from_array(t.numpy(), name)

    inits = [tensor(n, args[n]) for n in ("markov_w1", "markov_w2", "union_table")]
    init_names = {i.name for i in inits}
    inputs = [helper.make_tensor_value_info(n, _ONNX_TYPES[a.dtype], list(a.shape))
              for n, a in args.items() if n not in init_names]
    B, N = args["cand_values"].shape[:2]
    outputs = [helper.make_tensor_value_info("draft_tokens", onnx.TensorProto.INT32, ["B", N]),
               helper.make_tensor_value_info("cand_logits", onnx.TensorProto.FLOAT, ["B", N, k + M]),
               helper.make_tensor_value_info("confidence", onnx.TensorProto.FLOAT, ["B", N]),
               helper.make_tensor_value_info("union_ids", onnx.TensorProto.INT32, ["B", N, M])]
    node = helper.make_node(UNION_OP_NAME, [t.name for t in UNION_INPUTS], [t.name for t in UNION_OUTPUTS],
                            domain=OP_DOMAIN,
                            **(attributes if attributes is not None else union_node_attributes(k, logit_scale, M)))
    fn = union_local_function(num_draft_tokens, args["cand_values"].dtype, args["markov_w1"].dtype)
    graph = helper.make_graph([node], "one_union_node", inputs, outputs, initializer=inits)
    opset = next(o.version for o in fn.opset_import if o.domain == "")
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                   helper.make_opsetid(OP_DOMAIN, UNION_OPSET_VERSION)],
                             functions=[fn])


def assert_matches_reference(got, args, logit_scale, k):
    tokens, logits, conf, union_ids = got
    ref_tokens, ref_logits, ref_conf, ref_ids = reference_union_op(**args, logit_scale=logit_scale)
    assert tokens.dtype == torch.int32 and union_ids.dtype == torch.int32
    assert torch.equal(tokens, ref_tokens)
    assert torch.equal(union_ids, ref_ids)
    masked = ref_logits == float("-inf")
    assert torch.equal(logits == float("-inf"), masked)  # the same duplicates masked, nothing else
    assert not masked[..., :k].any()  # only union slots are ever masked
    torch.testing.assert_close(logits[~masked], ref_logits[~masked], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(conf, ref_conf, atol=1e-6, rtol=1e-6)
    return masked


# vocab 257 / 199 (reduced, d2t), rank 8 and 192, k ∈ {1, 16}, M ∈ {1, 5, 32}; greedy, sampled, mixed
UNION_CASES = [
    pytest.param(dict(B=3, N=4, V=257, Vd=257, r=8, k=1, M=1), [0.0], id="k1-M1-greedy"),
    pytest.param(dict(B=3, N=4, V=257, Vd=257, r=8, k=16, M=5), [1.0, 0.0, 0.6], id="k16-M5-mixed"),
    pytest.param(dict(B=2, N=3, V=257, Vd=257, r=192, k=16, M=32), [0.0], id="k16-M32-r192-greedy"),
    pytest.param(dict(B=3, N=4, V=257, Vd=199, r=8, k=16, M=32), [0.9], id="k16-M32-reduced-vocab-sampled"),
    pytest.param(dict(B=1, N=4, V=257, Vd=257, r=8, k=1, M=32), [1.3], id="k1-M32-sampled-B1"),
]


@pytest.mark.parametrize("shape, temperatures", UNION_CASES)
@pytest.mark.parametrize("logit_scale", [1.0, 0.5])
def test_union_local_function_matches_reference_union_op(shape, temperatures, logit_scale):
    """fp32: the function run by onnxruntime = reference_union_op (tokens and union ids exact; the same
    duplicates masked; logits to fp32 GEMM rounding)."""
    import onnx

    from dspark_trt.plugins.onnx_op import register_schema

    register_schema()
    args = union_case(**shape, temperatures=temperatures, seed=shape["k"] + shape["M"] + int(10 * logit_scale),
                      logit_scale=logit_scale)
    model = union_node_model(args, shape["k"], shape["M"], logit_scale, shape["N"])
    onnx.checker.check_model(model, full_check=True)
    masked = assert_matches_reference(run_ort(model, args), args, logit_scale, shape["k"])
    if shape["M"] > 1 and shape["k"] > 1:
        assert masked.any()  # the case really exercises duplicate masking


def test_union_local_function_low_precision_inputs():
    """bf16 weights + fp16 logits (values and base logits): both sides upcast the same values."""
    from dspark_trt.plugins.onnx_op import register_schema

    register_schema()
    args = union_case(B=3, N=5, V=257, Vd=257, r=8, k=16, M=5, values_dtype=torch.float16,
                      weights_dtype=torch.bfloat16, temperatures=[0.0, 0.7])
    model = union_node_model(args, 16, 5, 1.0, 5)
    assert_matches_reference(run_ort(model, args), args, 1.0, 16)


def test_union_table_matters():
    """A poisoned table (rows rolled) changes the union ids and the graph follows it, as the reference does."""
    from dspark_trt.plugins.onnx_op import register_schema

    register_schema()
    args = union_case(B=3, N=4, V=257, Vd=257, r=8, k=4, M=5)
    good = run_ort(union_node_model(args, 4, 5, 1.0, 4), args)
    poisoned = {**args, "union_table": args["union_table"].roll(1, dims=0)}
    bad = run_ort(union_node_model(poisoned, 4, 5, 1.0, 4), poisoned)
    assert not torch.equal(good[3], bad[3])
    assert_matches_reference(bad, poisoned, 1.0, 4)


def test_union_covering_the_vocabulary_equals_the_dense_walk():
    """k = 1 plus a union of M = V_d ids scores every token: the dense reference walk's tokens."""
    from dspark_trt.plugins.contract import reference_op
    from dspark_trt.plugins.onnx_op import register_schema

    register_schema()
    args = union_case(B=2, N=3, V=37, Vd=37, r=8, k=1, M=37, temperatures=[0.0, 1.1])
    tokens = run_ort(union_node_model(args, 1, 37, 1.0, 3), args)[0]
    dense = {**args, "cand_values": args["base_logits"], "cand_ids": torch.arange(37, dtype=torch.int32).expand(
        2, 3, 37).contiguous()}
    dense.pop("union_table"), dense.pop("base_logits")
    assert torch.equal(tokens, reference_op(**dense, logit_scale=1.0)[0])


def test_union_schema_documents_the_contract_and_keeps_the_plain_op():
    import onnx.defs

    from dspark_trt.plugins.contract import OP_NAME
    from dspark_trt.plugins.onnx_op import FLOAT_TYPES, UNION_OPSET_VERSION, register_schema

    register_schema()
    register_schema()  # idempotent
    assert UNION_OPSET_VERSION == OP_VERSIONS[UNION_OP_NAME] == 2 < OP_CONTRACT_VERSION
    schema = onnx.defs.get_schema(UNION_OP_NAME, UNION_OPSET_VERSION, OP_DOMAIN)
    assert schema.since_version == 2
    with pytest.raises(onnx.defs.SchemaError):  # the union op does not exist in domain version 1
        onnx.defs.get_schema(UNION_OP_NAME, 1, OP_DOMAIN)
    assert onnx.defs.get_schema(OP_NAME, UNION_OPSET_VERSION, OP_DOMAIN).since_version == 1  # valid under 2
    assert [p.name for p in schema.inputs] == [t.name for t in UNION_INPUTS]
    assert [p.name for p in schema.outputs] == [t.name for t in UNION_OUTPUTS]
    for param, contract in zip(list(schema.inputs) + list(schema.outputs), UNION_INPUTS + UNION_OUTPUTS):
        assert contract.shape in param.description and contract.dtype in param.description
    constraints = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    assert constraints == {"T": set(FLOAT_TYPES), "W": set(FLOAT_TYPES)}
    assert set(UNION_ATTRIBUTES) | {"plugin_version", "plugin_namespace", "aot"} == set(schema.attributes)
    assert schema.attributes["markov_topm"].required


def test_checker_rejects_a_union_node_that_breaks_the_schema():
    import onnx

    from dspark_trt.plugins.onnx_op import register_schema, union_node_attributes

    register_schema()
    args = union_case(B=2, N=1, V=37, Vd=37, r=8, k=4, M=3)
    attrs = union_node_attributes(4, 1.0, 3)
    del attrs["markov_topm"]
    with pytest.raises(onnx.checker.ValidationError, match="markov_topm"):
        onnx.checker.check_model(union_node_model(args, 4, 3, 1.0, 1, attributes=attrs), full_check=True)
    bad = union_node_model({**args, "base_logits": args["base_logits"].to(torch.int32)}, 4, 3, 1.0, 1)
    with pytest.raises((onnx.checker.ValidationError, onnx.shape_inference.InferenceError)):
        onnx.checker.check_model(bad, full_check=True)


@pytest.mark.parametrize("k, M", [(5, 3), (1, 32)])
def test_shape_inference_of_the_union_node(k, M):
    import onnx

    from dspark_trt.plugins.onnx_op import register_schema

    register_schema()
    args = union_case(B=2, N=3, V=37, Vd=37, r=8, k=k, M=M)
    model = union_node_model(args, k, M, 1.0, 3)
    del model.graph.output[:]
    model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(t.name) for t in UNION_OUTPUTS)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    types = {v.name: v.type.tensor_type for v in inferred.graph.value_info}
    names = {o.name for o in UNION_OUTPUTS}
    dims = {n: [d.dim_value for d in t.shape.dim] for n, t in types.items() if n in names}
    assert dims == {"draft_tokens": [2, 3], "cand_logits": [2, 3, k + M], "confidence": [2, 3],
                    "union_ids": [2, 3, M]}
    assert types["draft_tokens"].elem_type == types["union_ids"].elem_type == onnx.TensorProto.INT32
    assert types["cand_logits"].elem_type == types["confidence"].elem_type == onnx.TensorProto.FLOAT


def test_union_local_function_chains_the_exported_union_step():
    """N chained steps of standard ops; base_logits sliced per step like the candidates, the table shared."""
    from collections import Counter

    from dspark_trt.plugins.onnx_op import union_local_function

    fn = union_local_function(3)
    assert (fn.domain, fn.name) == (OP_DOMAIN, UNION_OP_NAME)
    assert list(fn.input) == [t.name for t in UNION_INPUTS] and list(fn.output) == [t.name for t in UNION_OUTPUTS]
    assert {n.domain for n in fn.node} <= {"", "ai.onnx"}
    ops = Counter(n.op_type for n in fn.node)
    assert ops["ArgMax"] == 3 and ops["Sigmoid"] == 3
    assert {"Loop", "If", "Scan"}.isdisjoint(ops)
    slices = [n for n in fn.node if n.op_type == "Slice" and n.input[0] == "base_logits"]
    assert len(slices) == 3
    assert "markov_topm" in fn.attribute
