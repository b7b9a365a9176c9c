"""``dspark::DSparkTopKMarkov`` in ONNX: the operator schema and the standard-op local function.

The node (contract: ``plugins/contract.py``) walks the N sequential Markov steps over each slot's k
candidates::

    d_0 = anchor
    for j in 0..N-1:
        e_j  = W1[d_j]                                         # [B, r]
        Z_j  = cand_values[:, j] + s · (W2[cand_ids[:, j]] @ e_j)   # [B, k]   (cand_logits, fp32)
        c_j  = σ(conf_base[:, j] + conf_w · e_j)                # [B]      (confidence)
        t    = argmax Z_j   or   argmax Z_j / T + G(seed, position + j, cand_ids)   (T < 1e-5: greedy)
        d_{j+1} = cand_ids[t] + d2t[cand_ids[t]]                # draft id → target id (draft_tokens)

Two things live here:

* ``register_schema()`` — an ``onnx.defs.OpSchema`` (every input/output documented from the contract,
  type constraints fp32/fp16/bf16, the op attributes plus ``plugin_version`` / ``plugin_namespace`` /
  ``aot`` for TensorRT's plugin lookup, and a shape-inference function), registered once per process so
  ``onnx.checker`` (full check) validates exported models and onnxscript can emit the node.
* ``local_function(num_draft_tokens, ...)`` — a model-local ``FunctionProto`` with the same name and
  domain that computes the op from standard ONNX ops, so plain onnxruntime and a TensorRT without our
  plugin can run the model. It is **not** a second implementation: one Markov step is the reference
  ``walk_candidates`` (via ``contract.reference_op`` with N = 1) exported by ``torch.onnx.export`` — the
  integer noise hash included (int64 Mul/Add/Mod, plus Div by 256) — and the function chains N copies of
  that step, feeding step j the slices ``[:, j]``, ``position + j`` and the previous step's token, exactly
  as ``walk_candidates`` loops. Tests compare it with ``reference_op``.
"""

from __future__ import annotations

import functools
import threading

import torch

from .contract import ATTRIBUTES, INPUTS, OP_DOMAIN, OP_NAME, OUTPUTS, PLUGIN_NAMESPACE, PLUGIN_VERSION

__all__ = [
    "OPSET_VERSION",
    "FLOAT_TYPES",
    "register_schema",
    "op_schema",
    "local_function",
    "node_attributes",
]

OPSET_VERSION = 1  # version of the ``dspark`` ONNX domain
#: ONNX type strings the logits (T) and weights (W) may have
FLOAT_TYPES = ("tensor(float)", "tensor(float16)", "tensor(bfloat16)")
_FIXED_TYPES = {"int32": "tensor(int32)", "float32": "tensor(float)"}
_lock = threading.Lock()


def node_attributes(k: int, logit_scale: float) -> dict:
    """Every attribute the exported node carries: the op's (contract ``ATTRIBUTES``) + TensorRT's lookup."""
    return {"k": int(k), "logit_scale": float(logit_scale),
            "plugin_version": PLUGIN_VERSION, "plugin_namespace": PLUGIN_NAMESPACE}


# -- the schema ------------------------------------------------------------------------------------------
def op_schema():
    """A fresh ``OpSchema`` for the node (not registered)."""
    from onnx.defs import OpSchema

    def param(t):
        type_str = _FIXED_TYPES.get(t.dtype, t.dtype)
        return OpSchema.FormalParameter(t.name, type_str, f"{t.shape} {t.dtype}: {t.doc}")

    A = OpSchema.AttrType
    attributes = [
        OpSchema.Attribute("k", A.INT, ATTRIBUTES["k"], required=True),
        OpSchema.Attribute("logit_scale", A.FLOAT, ATTRIBUTES["logit_scale"], required=True),
        OpSchema.Attribute("plugin_version", A.STRING, "TensorRT plugin version (parser lookup)", required=False),
        OpSchema.Attribute("plugin_namespace", A.STRING, "TensorRT plugin namespace; present so the parser "
                           "prefers the plugin over the local function", required=False),
        OpSchema.Attribute("aot", A.INT, "TensorRT quickly-deployable plugins: 1 = ahead-of-time kernel",
                           required=False),
    ]
    doc = (__doc__.split("Two things live here")[0].strip() + "\n\nInputs: " +
           "; ".join(f"{t.name} {t.shape} {t.dtype}" for t in INPUTS) + ". Outputs: " +
           "; ".join(f"{t.name} {t.shape} {t.dtype}" for t in OUTPUTS) + ".")
    schema = OpSchema(
        OP_NAME, OP_DOMAIN, OPSET_VERSION, doc,
        inputs=[param(t) for t in INPUTS],
        outputs=[param(t) for t in OUTPUTS],
        type_constraints=[("T", list(FLOAT_TYPES), "logits type"), ("W", list(FLOAT_TYPES), "weights type")],
        attributes=attributes,
        node_determinism=OpSchema.NodeDeterminism.Deterministic,
    )
    schema.set_type_and_shape_inference_function(_infer_outputs)
    return schema


def _infer_outputs(ctx) -> None:
    """draft_tokens int32 [B, N], cand_logits fp32 [B, N, k], confidence fp32 [B, N] from cand_values [B, N, k]."""
    import onnx

    values = ctx.get_input_type(0)
    dims = list(values.tensor_type.shape.dim) if values is not None and values.tensor_type.HasField("shape") else None
    for i, (elem, rank) in enumerate(((onnx.TensorProto.INT32, 2), (onnx.TensorProto.FLOAT, 3),
                                      (onnx.TensorProto.FLOAT, 2))):
        out = onnx.TypeProto()
        out.tensor_type.elem_type = elem
        if dims is not None and len(dims) == 3:
            out.tensor_type.shape.dim.extend(dims[:rank])
        ctx.set_output_type(i, out)


def register_schema() -> None:
    """Register the schema once per process (``onnx.defs`` raises on a second registration)."""
    import onnx.defs

    with _lock:
        if not onnx.defs.has(OP_NAME, OP_DOMAIN):
            onnx.defs.register_schema(op_schema())


# -- the local function ----------------------------------------------------------------------------------
def local_function(num_draft_tokens: int, values_dtype: torch.dtype = torch.float32,
                   weights_dtype: torch.dtype = torch.float32, *, opset: int | None = None):
    """The model-local ``FunctionProto`` ``dspark::DSparkTopKMarkov`` for N = ``num_draft_tokens``.

    Args:
        num_draft_tokens: N, the steps to unroll (fixed per model).
        values_dtype / weights_dtype: the dtypes of ``cand_values`` (T) and ``markov_w1/w2`` (W).
        opset: the default-domain opset of the model it goes into (defaults to the exporter's).

    Every other dimension (B, k, V, V_d, r) stays symbolic. Exporting the step takes a few seconds; the
    result is cached per (N, dtypes, opset).
    """
    import onnx

    fn = onnx.FunctionProto()
    fn.CopyFrom(_local_function(int(num_draft_tokens), values_dtype, weights_dtype, opset))
    return fn


@functools.cache
def _local_function(n: int, values_dtype: torch.dtype, weights_dtype: torch.dtype, opset: int | None):
    import onnx
    from onnx import helper

    if n < 1:
        raise ValueError(f"num_draft_tokens must be >= 1, got {n}")
    step = _step_graph(values_dtype, weights_dtype, opset)
    graph = step.graph
    in_names = [t.name for t in INPUTS]
    nodes = [_attr_constant("logit_scale")]  # the step graph reads the scale as a 0-d tensor input

    def const(name, values):
        return helper.make_node("Constant", [], [name], name=name,
                                value=helper.make_tensor(name, onnx.TensorProto.INT64, [len(values)], values))

    nodes += [const("one_axis", [1])]
    prev = "anchor"
    step_outputs: list[list[str]] = [[], [], []]
    for j in range(n):
        p = f"step{j}/"
        nodes += [const(p + "start", [j]), const(p + "end", [j + 1]),
                  helper.make_node("Constant", [], [p + "offset"], name=p + "offset",
                                   value=helper.make_tensor(p + "offset", onnx.TensorProto.INT32, [], [j]))]
        renamed = {
            "cand_values": p + "cand_values", "cand_ids": p + "cand_ids", "conf_base": p + "conf_base",
            "position": p + "position", "anchor": prev, "logit_scale": "logit_scale",
        }
        for name in ("cand_values", "cand_ids", "conf_base"):  # [:, j:j+1]
            nodes.append(helper.make_node("Slice", [name, p + "start", p + "end", "one_axis"], [renamed[name]],
                                          name=p + "slice_" + name))
        nodes.append(helper.make_node("Add", ["position", p + "offset"], [renamed["position"]], name=p + "position"))
        for name in in_names:
            renamed.setdefault(name, name)  # weights, d2t, temperature, seed, conf_w: shared by every step
        for init in graph.initializer:  # the step's constants become Constant nodes
            renamed[init.name] = p + init.name
            nodes.append(helper.make_node("Constant", [], [p + init.name], name=p + init.name, value=init))
        for node in graph.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.name = p + (node.name or node.op_type)
            del copy.input[:], copy.output[:]
            copy.input.extend(renamed.setdefault(x, p + x) if x else "" for x in node.input)
            copy.output.extend(renamed.setdefault(x, p + x) for x in node.output)
            nodes.append(copy)
        outs = [renamed[o.name] for o in graph.output]  # [B, 1] int32, [B, 1, k] fp32, [B, 1] fp32
        for acc, name in zip(step_outputs, outs):
            acc.append(name)
        prev = p + "token"
        nodes.append(helper.make_node("Squeeze", [outs[0], "one_axis"], [prev], name=p + "token"))  # [B]
    for out, parts in zip(OUTPUTS, step_outputs):
        nodes.append(helper.make_node("Concat", parts, [out.name], name="concat_" + out.name, axis=1))
    return helper.make_function(
        OP_DOMAIN, OP_NAME, in_names, [t.name for t in OUTPUTS], nodes,
        opset_imports=[helper.make_opsetid("", _default_opset(step))],
        attributes=list(node_attributes(1, 1.0)) + ["aot"],
        doc_string=f"DSparkTopKMarkov from standard ops: {n} chained steps of the exported reference walk",
    )


def _attr_constant(attribute: str):
    """``Constant`` whose float value is the calling node's attribute (``ref_attr_name``)."""
    import onnx
    from onnx import helper

    node = helper.make_node("Constant", [], [attribute], name=attribute)
    ref = onnx.AttributeProto(name="value_float", type=onnx.AttributeProto.FLOAT, ref_attr_name=attribute)
    node.attribute.append(ref)
    return node


def _default_opset(model) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


class _Step(torch.nn.Module):
    """One Markov step = the contract's reference op with N = 1; ``logit_scale`` as a 0-d tensor input."""

    def forward(self, cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed, position,
                conf_base, conf_w, logit_scale):
        from .contract import reference_op

        return reference_op(cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed, position,
                            conf_base, conf_w, logit_scale=logit_scale)


@functools.cache
def _step_graph(values_dtype: torch.dtype, weights_dtype: torch.dtype, opset: int | None):
    """The exported single-step model (B, k, V, V_d, r symbolic; N = 1)."""
    from ..torch_to_onnx import torch_onnx_export

    B, k, V, Vd, r = 3, 5, 13, 11, 4  # distinct sizes ≥ 2 so no dimension specialises
    i32 = torch.int32
    example = (
        torch.randn(B, 1, k).to(values_dtype), torch.randint(0, Vd, (B, 1, k), dtype=i32),
        torch.randint(0, V, (B,), dtype=i32), torch.randn(V, r).to(weights_dtype), torch.randn(Vd, r).to(weights_dtype),
        torch.zeros(Vd, dtype=i32), torch.ones(B), torch.zeros(B, dtype=i32), torch.ones(B, dtype=i32),
        torch.zeros(B, 1), torch.zeros(r), torch.tensor(1.0),
    )
    dim = torch.export.Dim
    Bd, kd, Vdim, Vdd, rd = dim("B"), dim("k"), dim("V"), dim("V_d"), dim("r")
    dynamic = ({0: Bd, 2: kd}, {0: Bd, 2: kd}, {0: Bd}, {0: Vdim, 1: rd}, {0: Vdd, 1: rd}, {0: Vdd}, {0: Bd},
               {0: Bd}, {0: Bd}, {0: Bd}, {0: rd}, None)
    names = [t.name for t in INPUTS] + ["logit_scale"]
    return torch_onnx_export(_Step(), example, input_names=names, output_names=[t.name for t in OUTPUTS],
                       dynamic_shapes=dynamic, opset=opset).model_proto
