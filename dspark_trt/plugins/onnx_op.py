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

The candidate union (``--markov-topm M``) is a second op of the domain, ``dspark::DSparkTopKMarkovUnion``
(contract ``UNION_*``; schema since ``dspark`` domain version 2, ``contract.OP_VERSIONS``): ``union_op_schema``
and ``union_local_function`` are built the same way from ``contract.reference_union_op`` (its two extra
inputs: the table, shared by every step, and the base logits, sliced per step). ``register_schema`` registers
every schema.

The gated and RNN Markov heads are two more ops, ``dspark::DSparkTopKMarkovGated`` and ``DSparkTopKMarkovRNN``
(contract ``GATED_INPUTS`` / ``RNN_INPUTS``, the plain op's outputs and attributes; schemas since ``dspark`` domain
version 3): ``head_op_schema(head)`` and ``head_local_function(head, N, ...)``, built the same way from
``contract.REFERENCE_OPS[head]``. The head's hidden part (``gate_hidden`` [B, N, r] / ``joint_hidden`` [B, N, 3r])
is sliced per step like the candidates; the walk's weight is shared. The RNN step also threads the recurrent
state: its exported step graph takes the state before the step as ``rnn_state0`` and returns the state after it
as a fourth output (``HeadFeatures.step`` of the reference, on the step's predecessor, the same anchor the
reference op reads), which the chain feeds to the next step's ``rnn_state0``; the function's outputs are still
the plain op's three.
"""

from __future__ import annotations

import functools
import threading

import torch

from .contract import (ATTRIBUTES, HEAD_OPS, INPUTS, OP_VERSIONS, OP_DOMAIN, OP_NAME, OUTPUTS,
                       PLUGIN_NAMESPACE, PLUGIN_VERSION, UNION_ATTRIBUTES, UNION_INPUTS, UNION_OP_NAME,
                       UNION_OUTPUTS)

__all__ = [
    "OPSET_VERSION",
    "UNION_OPSET_VERSION",
    "HEAD_OPSET_VERSIONS",
    "FLOAT_TYPES",
    "register_schema",
    "op_schema",
    "union_op_schema",
    "head_op_schema",
    "local_function",
    "union_local_function",
    "head_local_function",
    "node_attributes",
    "union_node_attributes",
]

OPSET_VERSION = 1  # version of the ``dspark`` ONNX domain of an export without the candidate union
#: the ``dspark`` domain version of an export with the union op (``contract.OP_VERSIONS``); the union
#: schema is registered since this version, the plain op's schema (since 1) stays valid under it
UNION_OPSET_VERSION = OP_VERSIONS[UNION_OP_NAME]
#: per Markov head type, the ``dspark`` domain version of an export with its op (vanilla 1; gated and rnn 3: their
#: schemas are registered since that version, the older ops' schemas stay valid under it)
HEAD_OPSET_VERSIONS = {head: OP_VERSIONS[name] for head, (name, _) in HEAD_OPS.items()}
#: ONNX type strings the logits (T) and weights (W) may have
FLOAT_TYPES = ("tensor(float)", "tensor(float16)", "tensor(bfloat16)")
_FIXED_TYPES = {"int32": "tensor(int32)", "float32": "tensor(float)"}
_lock = threading.Lock()


def node_attributes(k: int, logit_scale: float) -> dict:
    """Every attribute the exported node carries: the op's (contract ``ATTRIBUTES``) + TensorRT's lookup."""
    return {"k": int(k), "logit_scale": float(logit_scale),
            "plugin_version": PLUGIN_VERSION, "plugin_namespace": PLUGIN_NAMESPACE}


def union_node_attributes(k: int, logit_scale: float, markov_topm: int) -> dict:
    """Every attribute the exported union node carries: the union op's (contract ``UNION_ATTRIBUTES``) + lookup."""
    return {**node_attributes(k, logit_scale), "markov_topm": int(markov_topm)}


# -- the schema ------------------------------------------------------------------------------------------
def op_schema():
    """A fresh ``OpSchema`` for the node (not registered)."""
    return _schema(OP_NAME, OPSET_VERSION, INPUTS, OUTPUTS, ATTRIBUTES, __doc__.split("Two things live here")[0],
                   _infer_outputs)


def union_op_schema():
    """A fresh ``OpSchema`` for the candidate-union node ``dspark::DSparkTopKMarkovUnion`` (not registered)."""
    doc = ("DSparkTopKMarkovUnion: DSparkTopKMarkov over S_j = the k candidates ∪ union_table[d_j] (k + M slots: "
           "the k given ids, then the M table ids of the predecessor d_j, valued from base_logits; a table id "
           "already among the k is masked with −inf in its union slot). Contract: dspark_trt/plugins/contract.py "
           "(reference_union_op), docs/kernel.md.")
    return _schema(UNION_OP_NAME, UNION_OPSET_VERSION, UNION_INPUTS, UNION_OUTPUTS, UNION_ATTRIBUTES, doc,
                   _infer_union_outputs)


_HEAD_DOCS = {
    "gated": ("DSparkTopKMarkovGated: DSparkTopKMarkov with the gated Markov head: the bias of slot j is "
              "W2 · (g_j ⊙ e_j), g_j = σ(gate_hidden[:, j] + gate_w · e_j), e_j = W1[d_j]; the confidence still "
              "reads e_j."),
    "rnn": ("DSparkTopKMarkovRNN: DSparkTopKMarkov with the RNN Markov head: from s_0 = rnn_state0, "
            "(γ, c, o) = split₃(joint_hidden[:, j] + joint_w · [s_j ; e_j]), the bias of slot j is W2 · tanh(o) "
            "and s_{j+1} = σ(γ) ⊙ s_j + (1 − σ(γ)) ⊙ tanh(c), e_j = W1[d_j]; the confidence still reads "
            "e_j."),
}


def head_op_schema(head: str):
    """A fresh ``OpSchema`` for the op of a Markov head type (``contract.HEAD_OPS``: vanilla, gated, rnn; not
    registered)."""
    if head == "vanilla":
        return op_schema()
    name, inputs = HEAD_OPS[head]
    doc = _HEAD_DOCS[head] + " Contract: dspark_trt/plugins/contract.py (REFERENCE_OPS), docs/export.md."
    return _schema(name, HEAD_OPSET_VERSIONS[head], inputs, OUTPUTS, ATTRIBUTES, doc, _infer_outputs)


def _schema(name, version, inputs, outputs, op_attributes, doc, infer):
    from onnx.defs import OpSchema

    def param(t):
        type_str = _FIXED_TYPES.get(t.dtype, t.dtype)
        return OpSchema.FormalParameter(t.name, type_str, f"{t.shape} {t.dtype}: {t.doc}")

    A = OpSchema.AttrType
    kinds = {"k": A.INT, "logit_scale": A.FLOAT, "markov_topm": A.INT}
    attributes = [OpSchema.Attribute(a, kinds[a], text, required=True) for a, text in op_attributes.items()] + [
        OpSchema.Attribute("plugin_version", A.STRING, "TensorRT plugin version (parser lookup)", required=False),
        OpSchema.Attribute("plugin_namespace", A.STRING, "TensorRT plugin namespace; present so the parser "
                           "prefers the plugin over the local function", required=False),
        OpSchema.Attribute("aot", A.INT, "TensorRT quickly-deployable plugins: 1 = ahead-of-time kernel",
                           required=False),
    ]
    doc = (doc.strip() + "\n\nInputs: " + "; ".join(f"{t.name} {t.shape} {t.dtype}" for t in inputs) +
           ". Outputs: " + "; ".join(f"{t.name} {t.shape} {t.dtype}" for t in outputs) + ".")
    schema = OpSchema(
        name, OP_DOMAIN, version, doc,
        inputs=[param(t) for t in inputs],
        outputs=[param(t) for t in outputs],
        type_constraints=[("T", list(FLOAT_TYPES), "logits type"), ("W", list(FLOAT_TYPES), "weights type")],
        attributes=attributes,
        node_determinism=OpSchema.NodeDeterminism.Deterministic,
    )
    schema.set_type_and_shape_inference_function(infer)
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


def _infer_union_outputs(ctx) -> None:
    """draft_tokens int32 [B, N], cand_logits fp32 [B, N, k + M], confidence fp32 [B, N], union_ids int32
    [B, N, M]: B, N from cand_values, k and M from the node's attributes (M also = union_table's last dim)."""
    import onnx

    values = ctx.get_input_type(0)
    dims = list(values.tensor_type.shape.dim) if values is not None and values.tensor_type.HasField("shape") else None
    k, m = ctx.get_attribute("k"), ctx.get_attribute("markov_topm")
    for i, (elem, last) in enumerate(((onnx.TensorProto.INT32, None), (onnx.TensorProto.FLOAT, "k+M"),
                                      (onnx.TensorProto.FLOAT, None), (onnx.TensorProto.INT32, "M"))):
        out = onnx.TypeProto()
        out.tensor_type.elem_type = elem
        if dims is not None and len(dims) == 3:
            out.tensor_type.shape.dim.extend(dims[:2])
            if last is not None:
                extra = out.tensor_type.shape.dim.add()
                if k is not None and m is not None:
                    extra.dim_value = (k.i if last == "k+M" else 0) + m.i
        ctx.set_output_type(i, out)


def register_schema() -> None:
    """Register every schema (plain, union, gated, rnn) once per process (``onnx.defs`` raises on a second
    registration)."""
    import onnx.defs

    with _lock:
        if not onnx.defs.has(OP_NAME, OP_DOMAIN):
            onnx.defs.register_schema(op_schema())
        if not onnx.defs.has(UNION_OP_NAME, OP_DOMAIN):
            onnx.defs.register_schema(union_op_schema())
        for head in ("gated", "rnn"):
            if not onnx.defs.has(HEAD_OPS[head][0], OP_DOMAIN):
                onnx.defs.register_schema(head_op_schema(head))


# -- the local functions ---------------------------------------------------------------------------------
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


def union_local_function(num_draft_tokens: int, values_dtype: torch.dtype = torch.float32,
                         weights_dtype: torch.dtype = torch.float32, *, opset: int | None = None):
    """The model-local ``FunctionProto`` ``dspark::DSparkTopKMarkovUnion`` for N = ``num_draft_tokens``: N chained
    copies of one step of the reference union (``contract.reference_union_op`` with N = 1, exported by
    ``torch.onnx``), exactly as ``local_function`` chains the plain step; ``base_logits`` is sliced per step like
    ``cand_values``, the table is shared. B, k, M, V, V_d, r stay symbolic (``values_dtype`` is also the
    ``base_logits`` dtype: both are T)."""
    import onnx

    fn = onnx.FunctionProto()
    fn.CopyFrom(_union_local_function(int(num_draft_tokens), values_dtype, weights_dtype, opset))
    return fn


def head_local_function(head: str, num_draft_tokens: int, values_dtype: torch.dtype = torch.float32,
                        weights_dtype: torch.dtype = torch.float32, *, opset: int | None = None):
    """The model-local ``FunctionProto`` of a Markov head type's op (``contract.HEAD_OPS``) for N =
    ``num_draft_tokens``: vanilla = ``local_function``; gated / rnn = N chained copies of one step of
    ``contract.REFERENCE_OPS[head]`` (N = 1, exported by ``torch.onnx``), the head's hidden part sliced per step,
    its weight shared, and (rnn) the recurrent state threaded from step to step (module docstring). B, k, V, V_d,
    r stay symbolic; the head's inputs are fp32 except the weight (W)."""
    import onnx

    if head == "vanilla":
        return local_function(num_draft_tokens, values_dtype, weights_dtype, opset=opset)
    if head not in ("gated", "rnn"):
        raise ValueError(f"unknown Markov head type {head!r}: use one of {list(HEAD_OPS)}")
    fn = onnx.FunctionProto()
    fn.CopyFrom(_head_local_function(head, int(num_draft_tokens), values_dtype, weights_dtype, opset))
    return fn


_SLICED = ("cand_values", "cand_ids", "conf_base")  # [B, N, ...] inputs fed per step as [:, j:j+1]
#: per head: its per-slot hidden part, sliced per step too
_HEAD_SLICED = {"gated": ("gate_hidden",), "rnn": ("joint_hidden",)}
#: the RNN step's extra output: the recurrent state after the step, fed to the next step's ``rnn_state0``
_RNN_STATE_OUT = "rnn_state_next"


@functools.cache
def _local_function(n: int, values_dtype: torch.dtype, weights_dtype: torch.dtype, opset: int | None):
    return _chain(_step_graph(values_dtype, weights_dtype, opset), n, OP_NAME, INPUTS, OUTPUTS, _SLICED,
                  list(node_attributes(1, 1.0)) + ["aot"],
                  f"DSparkTopKMarkov from standard ops: {n} chained steps of the exported reference walk")


@functools.cache
def _union_local_function(n: int, values_dtype: torch.dtype, weights_dtype: torch.dtype, opset: int | None):
    return _chain(_union_step_graph(values_dtype, weights_dtype, opset), n, UNION_OP_NAME, UNION_INPUTS,
                  UNION_OUTPUTS, _SLICED + ("base_logits",), list(union_node_attributes(1, 1.0, 1)) + ["aot"],
                  f"DSparkTopKMarkovUnion from standard ops: {n} chained steps of the exported reference union walk")


@functools.cache
def _head_local_function(head: str, n: int, values_dtype: torch.dtype, weights_dtype: torch.dtype,
                         opset: int | None):
    name, inputs = HEAD_OPS[head]
    carried = {"rnn_state0": _RNN_STATE_OUT} if head == "rnn" else None
    return _chain(_head_step_graph(head, values_dtype, weights_dtype, opset), n, name, inputs, OUTPUTS,
                  _SLICED + _HEAD_SLICED[head], list(node_attributes(1, 1.0)) + ["aot"],
                  f"{name} from standard ops: {n} chained steps of the exported reference {head} walk",
                  carried=carried)


def _chain(step, n: int, op_name: str, inputs, outputs, sliced, attributes, doc, *, carried: dict | None = None):
    """A FunctionProto chaining ``n`` copies of the exported single-step model ``step``: step j reads the
    ``sliced`` inputs at ``[:, j:j+1]``, ``position + j`` and the previous step's token as its anchor; its
    outputs are concatenated along axis 1 (the first, the token [B, 1], also becomes the next anchor).
    ``carried`` {input: step output}: state threaded through the steps — step 0 reads the function's input, step
    j > 0 the step output of step j − 1 (the step graph's outputs after the function's ``outputs``)."""
    import onnx
    from onnx import helper

    if n < 1:
        raise ValueError(f"num_draft_tokens must be >= 1, got {n}")
    graph = step.graph
    in_names = [t.name for t in inputs]
    nodes = [_attr_constant("logit_scale")]  # the step graph reads the scale as a 0-d tensor input

    def const(name, values):
        return helper.make_node("Constant", [], [name], name=name,
                                value=helper.make_tensor(name, onnx.TensorProto.INT64, [len(values)], values))

    nodes += [const("one_axis", [1])]
    prev = "anchor"
    state = {name: name for name in carried or {}}  # carried input → the value step j reads
    step_outputs: list[list[str]] = [[] for _ in outputs]
    for j in range(n):
        p = f"step{j}/"
        nodes += [const(p + "start", [j]), const(p + "end", [j + 1]),
                  helper.make_node("Constant", [], [p + "offset"], name=p + "offset",
                                   value=helper.make_tensor(p + "offset", onnx.TensorProto.INT32, [], [j]))]
        renamed = {name: p + name for name in sliced}
        renamed.update({"position": p + "position", "anchor": prev, "logit_scale": "logit_scale", **state})
        for name in sliced:  # [:, j:j+1]
            nodes.append(helper.make_node("Slice", [name, p + "start", p + "end", "one_axis"], [renamed[name]],
                                          name=p + "slice_" + name))
        nodes.append(helper.make_node("Add", ["position", p + "offset"], [renamed["position"]], name=p + "position"))
        for name in in_names:
            renamed.setdefault(name, name)  # weights, d2t, temperature, seed, conf_w (, table): shared by every step
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
        outs = [renamed[o.name] for o in graph.output]  # [B, 1] int32, [B, 1, k (+ M)] fp32, [B, 1] fp32 (, [B, 1, M])
        for acc, name in zip(step_outputs, outs[:len(outputs)]):
            acc.append(name)
        for name, out in (carried or {}).items():
            state[name] = renamed[out]
        prev = p + "token"
        nodes.append(helper.make_node("Squeeze", [outs[0], "one_axis"], [prev], name=p + "token"))  # [B]
    for out, parts in zip(outputs, step_outputs):
        nodes.append(helper.make_node("Concat", parts, [out.name], name="concat_" + out.name, axis=1))
    return helper.make_function(
        OP_DOMAIN, op_name, in_names, [t.name for t in outputs], nodes,
        opset_imports=[helper.make_opsetid("", _default_opset(step))],
        attributes=attributes,
        doc_string=doc,
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


class _UnionStep(torch.nn.Module):
    """One step of the union walk = the contract's reference union op with N = 1; ``logit_scale`` as an input."""

    def forward(self, cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed, position,
                conf_base, conf_w, union_table, base_logits, logit_scale):
        from .contract import reference_union_op

        return reference_union_op(cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed,
                                  position, conf_base, conf_w, union_table, base_logits, logit_scale=logit_scale)


class _GatedStep(torch.nn.Module):
    """One step of the gated walk = the contract's reference gated op with N = 1; ``logit_scale`` as an input."""

    def forward(self, cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed, position,
                conf_base, conf_w, gate_hidden, gate_w, logit_scale):
        from .contract import reference_gated_op

        return reference_gated_op(cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed,
                                  position, conf_base, conf_w, gate_hidden, gate_w, logit_scale=logit_scale)


class _RNNStep(torch.nn.Module):
    """One step of the RNN walk = the contract's reference RNN op with N = 1 (``rnn_state0`` = the state before the
    step), plus the state after it: the reference head's own update (``HeadFeatures.step``) on the predecessor's
    embedding ``W1[anchor]``, exactly what the walk's step computes; ``logit_scale`` as an input."""

    def forward(self, cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed, position,
                conf_base, conf_w, joint_hidden, joint_w, rnn_state0, logit_scale):
        from ..reference.markov_heads import HeadFeatures
        from .contract import reference_rnn_op

        outputs = reference_rnn_op(cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed,
                                   position, conf_base, conf_w, joint_hidden, joint_w, rnn_state0,
                                   logit_scale=logit_scale)
        head = HeadFeatures("rnn", joint_hidden, joint_w, rnn_state0)
        e = markov_w1[anchor.to(torch.int64)].to(torch.float32)  # [B, r], as walk_candidates reads it
        _, state = head.step(e, 0, head.start())
        return (*outputs, state)


_B, _K, _V, _VD, _R, _M = 3, 5, 13, 11, 4, 6  # example sizes: distinct, ≥ 2, so no dimension specialises


def _step_example(values_dtype: torch.dtype, weights_dtype: torch.dtype):
    """The 11 contract inputs with N = 1 and their dynamic dims (B, k, V, V_d, r symbolic)."""
    B, k, V, Vd, r = _B, _K, _V, _VD, _R
    i32 = torch.int32
    example = (
        torch.randn(B, 1, k).to(values_dtype), torch.randint(0, Vd, (B, 1, k), dtype=i32),
        torch.randint(0, V, (B,), dtype=i32), torch.randn(V, r).to(weights_dtype), torch.randn(Vd, r).to(weights_dtype),
        torch.zeros(Vd, dtype=i32), torch.ones(B), torch.zeros(B, dtype=i32), torch.ones(B, dtype=i32),
        torch.zeros(B, 1), torch.zeros(r),
    )
    dim = torch.export.Dim
    dims = {name: dim(name) for name in ("B", "k", "V", "V_d", "r")}
    Bd, kd, Vdim, Vdd, rd = (dims[n] for n in ("B", "k", "V", "V_d", "r"))
    dynamic = ({0: Bd, 2: kd}, {0: Bd, 2: kd}, {0: Bd}, {0: Vdim, 1: rd}, {0: Vdd, 1: rd}, {0: Vdd}, {0: Bd},
               {0: Bd}, {0: Bd}, {0: Bd}, {0: rd})
    return example, dynamic, dims


@functools.cache
def _step_graph(values_dtype: torch.dtype, weights_dtype: torch.dtype, opset: int | None):
    """The exported single-step model (B, k, V, V_d, r symbolic; N = 1)."""
    from ..torch_to_onnx import torch_onnx_export

    example, dynamic, _ = _step_example(values_dtype, weights_dtype)
    names = [t.name for t in INPUTS] + ["logit_scale"]
    return torch_onnx_export(_Step(), example + (torch.tensor(1.0),), input_names=names,
                             output_names=[t.name for t in OUTPUTS], dynamic_shapes=dynamic + (None,),
                             opset=opset).model_proto


@functools.cache
def _union_step_graph(values_dtype: torch.dtype, weights_dtype: torch.dtype, opset: int | None):
    """The exported single-step union model (B, k, M, V, V_d, r symbolic; N = 1)."""
    from ..torch_to_onnx import torch_onnx_export

    example, dynamic, dims = _step_example(values_dtype, weights_dtype)
    union = (torch.randint(0, _VD, (_V, _M), dtype=torch.int32), torch.randn(_B, 1, _VD).to(values_dtype))
    union_dynamic = ({0: dims["V"], 1: torch.export.Dim("M")}, {0: dims["B"], 2: dims["V_d"]})
    names = [t.name for t in UNION_INPUTS] + ["logit_scale"]
    return torch_onnx_export(_UnionStep(), example + union + (torch.tensor(1.0),), input_names=names,
                             output_names=[t.name for t in UNION_OUTPUTS],
                             dynamic_shapes=dynamic + union_dynamic + (None,), opset=opset).model_proto


@functools.cache
def _head_step_graph(head: str, values_dtype: torch.dtype, weights_dtype: torch.dtype, opset: int | None):
    """The exported single-step gated / RNN model (B, k, V, V_d, r symbolic; N = 1): the head's hidden part
    [B, 1, r | 3r] fp32, its weight [r, r] | [3r, 2r] (W) and (rnn) the state before the step [B, r] fp32; the rnn
    step also outputs the state after it (``_RNN_STATE_OUT``)."""
    from ..torch_to_onnx import torch_onnx_export

    example, dynamic, dims = _step_example(values_dtype, weights_dtype)
    Bd, rd = dims["B"], dims["r"]
    name, inputs = HEAD_OPS[head]
    outputs = [t.name for t in OUTPUTS]
    if head == "gated":
        extra = (torch.randn(_B, 1, _R), torch.randn(_R, _R).to(weights_dtype))
        extra_dynamic = ({0: Bd, 2: rd}, {0: rd, 1: rd})
        module = _GatedStep()
    else:
        extra = (torch.randn(_B, 1, 3 * _R), torch.randn(3 * _R, 2 * _R).to(weights_dtype), torch.randn(_B, _R))
        extra_dynamic = ({0: Bd, 2: 3 * rd}, {0: 3 * rd, 1: 2 * rd}, {0: Bd, 1: rd})
        module = _RNNStep()
        outputs.append(_RNN_STATE_OUT)
    names = [t.name for t in inputs] + ["logit_scale"]
    return torch_onnx_export(module, example + extra + (torch.tensor(1.0),), input_names=names, output_names=outputs,
                             dynamic_shapes=dynamic + extra_dynamic + (None,), opset=opset).model_proto
