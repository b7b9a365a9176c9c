"""The DSparkTopKMarkovGated / DSparkTopKMarkovRNN ONNX schemas and their standard-op local functions, against the
contract's reference ops (``REFERENCE_OPS``): random data, odd shapes (vocab 257, reduced 199, rank 8), k ∈ {1, 16},
greedy, sampled and mixed per request."""

from __future__ import annotations

import pytest
import torch

from dspark_trt.plugins.contract import (ATTRIBUTES, HEAD_OPS, OP_CONTRACT_VERSION, OP_DOMAIN, OP_VERSIONS, OUTPUTS,
                                         REFERENCE_OPS)
from tests.plugins.test_onnx_op import _ONNX_TYPES, random_case, run_ort

pytestmark = pytest.mark.onnx

HEADS = ("gated", "rnn")


def head_case(head, B, N, V, Vd, r, k, *, seed=0, temperatures=None, values_dtype=torch.float32,
              weights_dtype=torch.float32, zero_state=False):
    """Contract inputs of the head's op: ``random_case`` + the head's hidden part, weight and (rnn) start state,
    scaled so the gate / the state move the bias by O(1) (a wrong head input changes tokens)."""
    args = random_case(B, N, V, Vd, r, k, seed=seed, temperatures=temperatures, values_dtype=values_dtype,
                       weights_dtype=weights_dtype)
    g = torch.Generator().manual_seed(seed + 7)
    if head == "gated":
        args.update(gate_hidden=torch.randn(B, N, r, generator=g),
                    gate_w=(0.5 * torch.randn(r, r, generator=g)).to(weights_dtype))
    else:
        args.update(joint_hidden=torch.randn(B, N, 3 * r, generator=g),
                    joint_w=(0.5 * torch.randn(3 * r, 2 * r, generator=g)).to(weights_dtype),
                    rnn_state0=torch.zeros(B, r) if zero_state else torch.tanh(torch.randn(B, r, generator=g)))
    return args


def head_node_model(head, args: dict, k: int, logit_scale: float, num_draft_tokens: int, *,
                    attributes: dict | None = None):
    """A model with one node of the head's op + its local function; the weights as initializers (as exported)."""
    import onnx
    from onnx import helper, numpy_helper

    from dspark_trt.plugins.onnx_op import HEAD_OPSET_VERSIONS, head_local_function, node_attributes

    def tensor(name, t):
        if t.dtype == torch.bfloat16:
            import ml_dtypes

            return numpy_helper.from_array(t.float().numpy().astype(ml_dtypes.bfloat16), name)
        return numpy_helper.from_array(t.numpy(), name)

    name, inputs = HEAD_OPS[head]
    weight = "gate_w" if head == "gated" else "joint_w"
    inits = [tensor(n, args[n]) for n in ("markov_w1", "markov_w2", weight)]
    init_names = {i.name for i in inits}
    graph_inputs = [helper.make_tensor_value_info(n, _ONNX_TYPES[a.dtype], list(a.shape))
                    for n, a in args.items() if n not in init_names]
    B, N = args["cand_values"].shape[:2]
    outputs = [helper.make_tensor_value_info("draft_tokens", onnx.TensorProto.INT32, ["B", N]),
               helper.make_tensor_value_info("cand_logits", onnx.TensorProto.FLOAT, ["B", N, k]),
               helper.make_tensor_value_info("confidence", onnx.TensorProto.FLOAT, ["B", N])]
    node = helper.make_node(name, [t.name for t in inputs], [t.name for t in OUTPUTS], domain=OP_DOMAIN,
                            **(attributes if attributes is not None else node_attributes(k, logit_scale)))
    fn = head_local_function(head, num_draft_tokens, args["cand_values"].dtype, args["markov_w1"].dtype)
    graph = helper.make_graph([node], f"one_{head}_node", graph_inputs, outputs, initializer=inits)
    opset = next(o.version for o in fn.opset_import if o.domain == "")
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                   helper.make_opsetid(OP_DOMAIN, HEAD_OPSET_VERSIONS[head])],
                             functions=[fn])


def assert_matches_reference(head, got, args, logit_scale):
    tokens, logits, conf = got
    ref_tokens, ref_logits, ref_conf = REFERENCE_OPS[head](**args, logit_scale=logit_scale)
    assert tokens.dtype == torch.int32 and torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)  # fp32; r-term sums in another order
    torch.testing.assert_close(conf, ref_conf, atol=1e-6, rtol=1e-6)


CASES = [
    pytest.param(dict(B=3, N=4, V=257, Vd=257, r=8, k=1), [0.0], id="k1-greedy"),
    pytest.param(dict(B=3, N=4, V=257, Vd=257, r=8, k=16), [0.0], id="k16-greedy"),
    pytest.param(dict(B=3, N=4, V=257, Vd=257, r=8, k=16), [1.0, 0.0, 0.6], id="k16-mixed"),
    pytest.param(dict(B=1, N=5, V=257, Vd=257, r=8, k=16), [1.3], id="k16-sampled-B1"),
    pytest.param(dict(B=2, N=4, V=257, Vd=199, r=8, k=16), [0.0, 0.8], id="k16-reduced-vocab"),
]


@pytest.fixture(scope="module", autouse=True)
def _schemas():
    from dspark_trt.plugins.onnx_op import register_schema

    register_schema()


@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("shape, temperatures", CASES)
def test_head_local_function_matches_the_reference_op(head, shape, temperatures):
    """fp32: the function run by onnxruntime = REFERENCE_OPS[head] (tokens exact; logits to fp32 rounding)."""
    import onnx

    logit_scale = 0.5 if shape["k"] == 1 else 1.0
    args = head_case(head, **shape, temperatures=temperatures, seed=shape["k"] + shape["Vd"])
    model = head_node_model(head, args, shape["k"], logit_scale, shape["N"])
    onnx.checker.check_model(model, full_check=True)
    assert_matches_reference(head, run_ort(model, args), args, logit_scale)


@pytest.mark.parametrize("head", HEADS)
def test_head_local_function_low_precision_inputs(head):
    """bf16 weights (W1, W2 and the head's weight) + fp16 candidate values: both sides upcast the same values."""
    args = head_case(head, B=3, N=4, V=257, Vd=257, r=8, k=16, values_dtype=torch.float16,
                     weights_dtype=torch.bfloat16, temperatures=[0.0, 0.7])
    assert_matches_reference(head, run_ort(head_node_model(head, args, 16, 1.0, 4), args), args, 1.0)


@pytest.mark.parametrize("head", HEADS)
def test_every_head_input_matters(head):
    """Poison each head input (its hidden part at a later slot, its weight, the rnn start state): the reference's
    logits move, and the graph follows the reference, so neither side ignores or misroutes an input."""
    args = head_case(head, B=3, N=4, V=257, Vd=257, r=8, k=16, temperatures=[0.0])
    model = head_node_model(head, args, 16, 1.0, 4)
    base = REFERENCE_OPS[head](**args, logit_scale=1.0)[1]
    hidden, weight = ("gate_hidden", "gate_w") if head == "gated" else ("joint_hidden", "joint_w")
    late = args[hidden].clone()
    late[:, 2:] = late[:, 2:].roll(1, dims=0)  # other rows' parts from slot 2 on: slots 0, 1 unchanged
    poisons = {hidden: late, weight: -args[weight]}
    if head == "rnn":
        poisons["rnn_state0"] = -args["rnn_state0"]
    for name, value in poisons.items():
        poisoned = {**args, name: value}
        moved = (REFERENCE_OPS[head](**poisoned, logit_scale=1.0)[1] - base).abs()
        assert moved.max() > 1e-2, name
        if name == hidden:
            assert moved[:, :2].max() == 0  # sliced per step: slot j reads part j only
        got = run_ort(model if name != weight else head_node_model(head, poisoned, 16, 1.0, 4), poisoned)
        assert_matches_reference(head, got, poisoned, 1.0)


def test_rnn_state_is_threaded_through_the_steps():
    """From a zero start state, a chain that restarted the state every step would equal N one-step walks; the
    function's later slots differ from those and equal the reference walk (which carries s_j to slot j + 1)."""
    args = head_case("rnn", B=3, N=4, V=257, Vd=257, r=8, k=16, temperatures=[0.0], zero_state=True)
    tokens, logits, _ = run_ort(head_node_model("rnn", args, 16, 1.0, 4), args)
    assert_matches_reference("rnn", (tokens, logits, _), args, 1.0)
    restarted = []  # each slot walked alone from the zero state, its predecessor the function's token
    prev = args["anchor"]
    for j in range(4):
        step = {**args, "anchor": prev, **{n: args[n][:, j:j + 1] for n in ("cand_values", "cand_ids", "conf_base",
                                                                              "joint_hidden")},
                "position": args["position"] + j}
        restarted.append(REFERENCE_OPS["rnn"](**step, logit_scale=1.0)[1])
        prev = tokens[:, j]
    restarted = torch.cat(restarted, dim=1)
    torch.testing.assert_close(logits[:, 0], restarted[:, 0], atol=1e-5, rtol=1e-5)  # slot 0: the start state
    assert (logits[:, 1:] - restarted[:, 1:]).abs().max() > 1e-2


@pytest.mark.parametrize("head", HEADS)
def test_head_schema_documents_the_contract(head):
    import onnx.defs

    from dspark_trt.plugins.contract import OP_NAME
    from dspark_trt.plugins.onnx_op import FLOAT_TYPES, HEAD_OPSET_VERSIONS, register_schema

    register_schema()  # idempotent
    name, inputs = HEAD_OPS[head]
    assert HEAD_OPSET_VERSIONS[head] == OP_VERSIONS[name] == 3 == OP_CONTRACT_VERSION
    assert HEAD_OPSET_VERSIONS["vanilla"] == 1
    schema = onnx.defs.get_schema(name, 3, OP_DOMAIN)
    assert schema.since_version == 3
    for older in (1, 2):  # the op does not exist in older domain versions
        with pytest.raises(onnx.defs.SchemaError):
            onnx.defs.get_schema(name, older, OP_DOMAIN)
    assert onnx.defs.get_schema(OP_NAME, 3, OP_DOMAIN).since_version == 1  # the plain op stays valid under 3
    assert [p.name for p in schema.inputs] == [t.name for t in inputs]
    assert [p.name for p in schema.outputs] == [t.name for t in OUTPUTS]
    for param, contract in zip(list(schema.inputs) + list(schema.outputs), inputs + OUTPUTS):
        assert contract.shape in param.description and contract.dtype in param.description
    constraints = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    assert constraints == {"T": set(FLOAT_TYPES), "W": set(FLOAT_TYPES)}
    assert set(ATTRIBUTES) | {"plugin_version", "plugin_namespace", "aot"} == set(schema.attributes)


@pytest.mark.parametrize("head", HEADS)
def test_checker_and_shape_inference_of_the_head_node(head):
    import onnx

    from dspark_trt.plugins.onnx_op import node_attributes

    args = head_case(head, B=2, N=3, V=37, Vd=37, r=8, k=5)
    attrs = node_attributes(5, 1.0)
    del attrs["k"]
    with pytest.raises(onnx.checker.ValidationError, match="k"):
        onnx.checker.check_model(head_node_model(head, args, 5, 1.0, 3, attributes=attrs), full_check=True)
    hidden = "gate_hidden" if head == "gated" else "joint_hidden"
    bad = head_node_model(head, {**args, hidden: args[hidden].to(torch.int32)}, 5, 1.0, 3)
    with pytest.raises((onnx.checker.ValidationError, onnx.shape_inference.InferenceError)):
        onnx.checker.check_model(bad, full_check=True)
    model = head_node_model(head, args, 5, 1.0, 3)
    del model.graph.output[:]
    model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(t.name) for t in OUTPUTS)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    types = {v.name: v.type.tensor_type for v in inferred.graph.value_info}
    dims = {n: [d.dim_value for d in t.shape.dim] for n, t in types.items() if n in {o.name for o in OUTPUTS}}
    assert dims == {"draft_tokens": [2, 3], "cand_logits": [2, 3, 5], "confidence": [2, 3]}


@pytest.mark.parametrize("head", HEADS)
def test_head_local_function_chains_the_exported_step(head):
    """N chained steps of standard ops: the hidden part sliced per step, the weight shared, no control flow."""
    from collections import Counter

    from dspark_trt.plugins.onnx_op import head_local_function

    name, inputs = HEAD_OPS[head]
    fn = head_local_function(head, 3)
    assert (fn.domain, fn.name) == (OP_DOMAIN, name)
    assert list(fn.input) == [t.name for t in inputs] and list(fn.output) == [t.name for t in OUTPUTS]
    assert {n.domain for n in fn.node} <= {"", "ai.onnx"}
    ops = Counter(n.op_type for n in fn.node)
    assert ops["ArgMax"] == 3 and {"Loop", "If", "Scan"}.isdisjoint(ops)
    hidden = inputs[11].name
    assert len([n for n in fn.node if n.op_type == "Slice" and n.input[0] == hidden]) == 3
    if head == "rnn":  # only step 0 reads the start state; later steps read the previous step's state
        assert len([n for n in fn.node if "rnn_state0" in n.input]) >= 1
        assert all(n.name.startswith("step0/") for n in fn.node if "rnn_state0" in n.input)
