"""The ``DSparkTopKMarkov`` op contract, shared by the ONNX node, the Triton kernel and the TensorRT plugin.

One node per draft round walks the N sequential Markov steps over each slot's k candidates (docs/dspark.md §8.5).
The candidates come from a standard ``TopK`` on the base logits in front of the node (TensorRT's native
TopK handles k ≤ 3840). Large weights are inputs (initializers), never attributes. Shapes are static per
batch bucket and there are no data-dependent outputs, so the op can sit inside a CUDA graph.

``reference_op`` is the CPU reference of the op keyed by its name (Polygraphy's pluginref idea): it calls
the oracle ``walk_candidates`` with exactly the node's inputs.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

__all__ = [
    "OP_NAME",
    "OP_DOMAIN",
    "PLUGIN_NAMESPACE",
    "PLUGIN_VERSION",
    "PLUGIN_ID",
    "TENSORRT_TOPK_LIMIT",
    "INPUTS",
    "OUTPUTS",
    "ATTRIBUTES",
    "TensorContract",
    "reference_op",
    "UNION_OP_NAME",
    "UNION_PLUGIN_ID",
    "UNION_INPUTS",
    "UNION_OUTPUTS",
    "UNION_ATTRIBUTES",
    "OP_CONTRACT_VERSION",
    "reference_union_op",
    "GATED_OP_NAME",
    "RNN_OP_NAME",
    "GATED_PLUGIN_ID",
    "RNN_PLUGIN_ID",
    "GATED_INPUTS",
    "RNN_INPUTS",
    "HEAD_OPS",
    "OP_VERSIONS",
    "reference_gated_op",
    "reference_rnn_op",
    "REFERENCE_OPS",
    "op_contract_version_for",
]

OP_NAME = "DSparkTopKMarkov"
OP_DOMAIN = "dspark"  # ONNX domain = TensorRT plugin namespace
PLUGIN_NAMESPACE = "dspark"
PLUGIN_VERSION = "1"
PLUGIN_ID = f"{PLUGIN_NAMESPACE}::{OP_NAME}"  # tensorrt.plugin registration name
TENSORRT_TOPK_LIMIT = 3840  # ITopKLayer / ONNX TopK in TensorRT: k ≤ 3840
#: the candidate union (``--markov-topm M > 0``) is a second op of the same domain: a TensorRT plugin has one
#: fixed signature, so the union's two extra inputs and extra output make it its own op. An export without a
#: union emits exactly the contract-1 graph (``DSparkTopKMarkov`` only, domain version 1).
UNION_OP_NAME = "DSparkTopKMarkovUnion"
UNION_PLUGIN_ID = f"{PLUGIN_NAMESPACE}::{UNION_OP_NAME}"
#: the gated and RNN Markov heads (docs/dspark.md §5) are one op each, for the same reason: their walk reads a
#: per-slot hidden part and an r-sized weight that the vanilla op has no inputs for
GATED_OP_NAME = "DSparkTopKMarkovGated"
RNN_OP_NAME = "DSparkTopKMarkovRNN"
GATED_PLUGIN_ID = f"{PLUGIN_NAMESPACE}::{GATED_OP_NAME}"
RNN_PLUGIN_ID = f"{PLUGIN_NAMESPACE}::{RNN_OP_NAME}"
#: 1 = DSparkTopKMarkov only; 2 = adds DSparkTopKMarkovUnion; 3 = adds DSparkTopKMarkovGated and
#: DSparkTopKMarkovRNN (the ``dspark`` ONNX domain version of an export that uses them;
#: ``manifest.json["op_contract_version"]``, absent = 1). Readers accept every version ≤ this.
OP_CONTRACT_VERSION = 3
#: the contract version an export needs for each op (a vanilla export without the union stays at 1)
OP_VERSIONS = {OP_NAME: 1, UNION_OP_NAME: 2, GATED_OP_NAME: 3, RNN_OP_NAME: 3}


@dataclass(frozen=True)
class TensorContract:
    name: str
    shape: str  # symbolic: B batch, N draft tokens, k candidates, V target vocab, V_d draft vocab, r rank
    dtype: str  # "T" = the logits type (fp32 | fp16 | bf16), "W" = the weights type (same set), or a fixed type
    doc: str


#: node inputs, in order
INPUTS = (
    TensorContract("cand_values", "[B, N, k]", "T", "base logits (already × logit_scale) at the candidates"),
    TensorContract("cand_ids", "[B, N, k]", "int32", "draft-vocab ids of the candidates (TopK indices); any order"),
    TensorContract("anchor", "[B]", "int32", "target id of each request's anchor (predecessor of slot 0)"),
    TensorContract("markov_w1", "[V, r]", "W", "Markov embedding, indexed by the predecessor's target id"),
    TensorContract("markov_w2", "[V_d, r]", "W", "Markov output projection, layout [out, in]"),
    TensorContract("d2t", "[V_d]", "int32", "draft → target offsets (t = d + d2t[d]); zeros when V_d = V"),
    TensorContract("temperature", "[B]", "float32", "per-request temperature; < 1e-5 drafts greedily"),
    TensorContract("seed", "[B]", "int32", "per-request noise seed, >= 0 (Gumbel noise in the draft stream)"),
    TensorContract("position", "[B]", "int32", "sequence position of d_1 (anchor position + 1): the noise key"),
    TensorContract("conf_base", "[B, N]", "float32", "w_h · H_j + b of the confidence head (zeros without one)"),
    TensorContract("conf_w", "[r]", "float32", "Markov-embedding part of the confidence weight (zeros without)"),
)

#: node outputs, in order
OUTPUTS = (
    TensorContract("draft_tokens", "[B, N]", "int32", "drafted tokens, target ids"),
    TensorContract("cand_logits", "[B, N, k]", "float32", "corrected logits Z at cand_ids, before temperature"),
    TensorContract("confidence", "[B, N]", "float32", "σ(conf_base + conf_w · W1[d_j]) per slot"),
)

#: node attributes besides plugin_version / plugin_namespace (constants baked at build time)
ATTRIBUTES = {
    "k": "int: candidates per slot (the last dim of cand_values)",
    "logit_scale": "float: s, multiplies the Markov bias (the base logits are already scaled)",
}


#: the union op's inputs: the 11 above, then the table and the base logits the table's ids are valued from
UNION_INPUTS = INPUTS + (
    TensorContract("union_table", "[V, M]", "int32",
                   "draft ids of the M largest Markov-bias entries per predecessor target id "
                   "(reference.markov.markov_union_table)"),
    TensorContract("base_logits", "[B, N, V_d]", "T", "all base logits (× logit_scale): values of the table's ids"),
)

#: the union op's outputs: cand_logits grows to k + M (the last M = table[d_j], −inf where that id is already one
#: of the slot's top-k: a masked duplicate, never drawn, zero probability), plus the ids of those M candidates
UNION_OUTPUTS = (
    OUTPUTS[0],
    TensorContract("cand_logits", "[B, N, k + M]", "float32",
                   "corrected logits Z at cand_ids ++ union_ids, before temperature; −inf = masked duplicate"),
    OUTPUTS[2],
    TensorContract("union_ids", "[B, N, M]", "int32", "draft-vocab ids of the union candidates: table[d_j]"),
)

UNION_ATTRIBUTES = {**ATTRIBUTES, "markov_topm": "int: M, the union width (the last dim of union_table), >= 1"}


#: the gated op's inputs: the 11 above, then the walk-independent and the walk's part of ``gate_proj``
GATED_INPUTS = INPUTS + (
    TensorContract("gate_hidden", "[B, N, r]", "float32",
                   "G_h · h_j + b_G: gate_proj's hidden-state columns times slot j's backbone state, plus its bias"),
    TensorContract("gate_w", "[r, r]", "W", "G_e: gate_proj's W1-embedding columns, layout [out, in]"),
)
#: the RNN op's inputs: the 11 above, then ``joint_proj``'s two parts and the state before slot 0
RNN_INPUTS = INPUTS + (
    TensorContract("joint_hidden", "[B, N, 3r]", "float32",
                   "J_h · h_j + b_J: joint_proj's hidden-state columns times slot j's backbone state, plus its bias"),
    TensorContract("joint_w", "[3r, 2r]", "W", "joint_proj's [state ; W1-embedding] columns, layout [out, in]"),
    TensorContract("rnn_state0", "[B, r]", "float32",
                   "the recurrent state before slot 0: zeros (anchor-first), or after the anchor slot (bonus-anchor)"),
)
#: per head type: (op name, inputs); the outputs and attributes are the vanilla op's
HEAD_OPS = {"vanilla": (OP_NAME, INPUTS), "gated": (GATED_OP_NAME, GATED_INPUTS), "rnn": (RNN_OP_NAME, RNN_INPUTS)}


def op_contract_version_for(markov_head_type: str = "vanilla", markov_topm: int = 0) -> int:
    """The contract version an export needs: that of the op its draft graph uses (1, 2 with the union, 3 for a
    gated or RNN head), so an export that uses none of the newer ops stays readable by older versions."""
    op = UNION_OP_NAME if markov_topm else HEAD_OPS[markov_head_type][0]
    return OP_VERSIONS[op]


def _op_signature(inputs: tuple[TensorContract, ...]) -> inspect.Signature:
    """The reference function's signature: the op's inputs by name, in contract order, then ``logit_scale``."""
    P = inspect.Parameter
    return inspect.Signature([P(c.name, P.POSITIONAL_OR_KEYWORD, annotation=torch.Tensor) for c in inputs]
                             + [P("logit_scale", P.KEYWORD_ONLY, annotation=float)])


_PLAIN_SIGNATURE, _UNION_SIGNATURE = _op_signature(INPUTS), _op_signature(UNION_INPUTS)
_GATED_SIGNATURE, _RNN_SIGNATURE = _op_signature(GATED_INPUTS), _op_signature(RNN_INPUTS)


def _head(bound: dict):
    """The gated / RNN op's extra inputs (popped from ``bound``) as the oracle's ``HeadFeatures``, or None."""
    from ..reference.markov_heads import HeadFeatures

    if "gate_hidden" in bound:
        return HeadFeatures("gated", bound.pop("gate_hidden"), bound.pop("gate_w"))
    if "joint_hidden" in bound:
        return HeadFeatures("rnn", bound.pop("joint_hidden"), bound.pop("joint_w"), bound.pop("rnn_state0"))
    return None


def _reference(signature: inspect.Signature, args: tuple, kwargs: dict) -> tuple[torch.Tensor, ...]:
    """Every op through the oracle, one body: the union's two extra inputs when the signature has them (M > 0),
    the gated / RNN head's when it has those, none for the plain op; the outputs in contract order."""
    bound = signature.bind(*args, **kwargs).arguments
    union = {name: bound.pop(name) for name in ("union_table", "base_logits") if name in bound}
    head = _head(bound)
    if head is not None:
        union["head"] = head
    from ..reference.markov import walk_candidates

    result = walk_candidates(
        bound["cand_values"], bound["cand_ids"], bound["anchor"], bound["markov_w1"], bound["markov_w2"],
        logit_scale=bound["logit_scale"],
        d2t=bound["d2t"].to(torch.int64),
        temperature=bound["temperature"],
        seed=bound["seed"].to(torch.int64),
        positions=bound["position"].to(torch.int64),
        conf_base=bound["conf_base"],
        conf_w_markov=bound["conf_w"],
        **union,
    )
    outputs = (result.tokens.to(torch.int32), result.cand_logits, result.confidence)
    if "union_table" not in union:
        return outputs
    k = bound["cand_ids"].shape[-1]
    return (*outputs, result.cand_ids[..., k:].to(torch.int32))


def reference_op(*args, **kwargs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The op on CPU via the oracle, on exactly the node's inputs (``INPUTS``, by position or name) and
    ``logit_scale=``: (draft_tokens int32 [B, N], cand_logits fp32 [B, N, k], confidence fp32 [B, N])."""
    return _reference(_PLAIN_SIGNATURE, args, kwargs)  # type: ignore[return-value]


def reference_union_op(*args, **kwargs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The union op on CPU via the oracle (``UNION_INPUTS``: the 11 above, ``union_table``, ``base_logits``, by
    position or name; ``logit_scale=``): (draft_tokens int32 [B, N], cand_logits fp32 [B, N, k + M], confidence
    fp32 [B, N], union_ids int32 [B, N, M])."""
    return _reference(_UNION_SIGNATURE, args, kwargs)  # type: ignore[return-value]


def reference_gated_op(*args, **kwargs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gated op on CPU via the oracle (``GATED_INPUTS`` by position or name; ``logit_scale=``): the plain
    op's three outputs."""
    return _reference(_GATED_SIGNATURE, args, kwargs)  # type: ignore[return-value]


def reference_rnn_op(*args, **kwargs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The RNN op on CPU via the oracle (``RNN_INPUTS`` by position or name; ``logit_scale=``): the plain op's
    three outputs."""
    return _reference(_RNN_SIGNATURE, args, kwargs)  # type: ignore[return-value]


#: per head type, the op's CPU reference
REFERENCE_OPS = {"vanilla": reference_op, "gated": reference_gated_op, "rnn": reference_rnn_op}

reference_op.__signature__ = _PLAIN_SIGNATURE  # type: ignore[attr-defined]
reference_union_op.__signature__ = _UNION_SIGNATURE  # type: ignore[attr-defined]
reference_gated_op.__signature__ = _GATED_SIGNATURE  # type: ignore[attr-defined]
reference_rnn_op.__signature__ = _RNN_SIGNATURE  # type: ignore[attr-defined]
