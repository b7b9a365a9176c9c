"""The ``DSparkTopKMarkov`` node (its candidate-union twin ``DSparkTopKMarkovUnion``, and the gated / RNN heads'
``DSparkTopKMarkovGated`` / ``DSparkTopKMarkovRNN``) as PyTorch custom ops, so ``torch.onnx.export`` emits exactly
one node.

``torch.ops.dspark_export.topk_markov`` runs the contract's ``reference_op`` eagerly (so a graph module that
calls it is still the reference) and has a fake implementation with the plugin's output shapes. The
translation table maps it to ``dspark::DSparkTopKMarkov`` with the attributes TensorRT's plugin lookup
needs (``plugins/onnx_op.node_attributes``).

The op lives in its own torch namespace (``dspark_export``) so it cannot collide with a runtime custom op
for the Triton kernel.
"""

from __future__ import annotations

import functools

import torch

from ..plugins.contract import (GATED_OP_NAME, OP_DOMAIN, OP_NAME, RNN_OP_NAME, UNION_OP_NAME, reference_gated_op,
                                reference_op, reference_rnn_op, reference_union_op)
from ..plugins.onnx_op import (HEAD_OPSET_VERSIONS, OPSET_VERSION, UNION_OPSET_VERSION, node_attributes,
                               register_schema, union_node_attributes)

__all__ = ["topk_markov", "topk_markov_union", "topk_markov_gated", "topk_markov_rnn", "translation_table",
           "union_translation_table", "head_translation_table", "topk_markov_head"]

Tensor = torch.Tensor


@torch.library.custom_op("dspark_export::topk_markov", mutates_args=())
def topk_markov(
    cand_values: Tensor,  # [B, N, k] T
    cand_ids: Tensor,  # [B, N, k] int32 draft ids
    anchor: Tensor,  # [B] int32 target ids
    markov_w1: Tensor,  # [V, r] W
    markov_w2: Tensor,  # [V_d, r] W
    d2t: Tensor,  # [V_d] int32
    temperature: Tensor,  # [B] fp32
    seed: Tensor,  # [B] int32
    position: Tensor,  # [B] int32: position of d_1
    conf_base: Tensor,  # [B, N] fp32
    conf_w: Tensor,  # [r] fp32
    k: int,
    logit_scale: float,
) -> tuple[Tensor, Tensor, Tensor]:  # draft_tokens [B, N] int32, cand_logits [B, N, k] fp32, confidence [B, N] fp32
    return reference_op(cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed, position,
                        conf_base, conf_w, logit_scale=logit_scale)


@topk_markov.register_fake
def _(cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed, position, conf_base, conf_w,
      k, logit_scale):
    B, N, _ = cand_values.shape
    return (cand_values.new_empty((B, N), dtype=torch.int32), cand_values.new_empty((B, N, k), dtype=torch.float32),
            cand_values.new_empty((B, N), dtype=torch.float32))


def _to_onnx(cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed, position, conf_base,
             conf_w, k: int, logit_scale: float):
    """Translation: one ``dspark::DSparkTopKMarkov`` node (a plain function, not ``@onnxscript.script``)."""
    from onnxscript.values import Opset

    op = Opset(OP_DOMAIN, OPSET_VERSION)
    return getattr(op, OP_NAME)(cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed,
                                position, conf_base, conf_w, **node_attributes(k, logit_scale))


@torch.library.custom_op("dspark_export::topk_markov_union", mutates_args=())
def topk_markov_union(
    cand_values: Tensor,  # [B, N, k] T
    cand_ids: Tensor,  # [B, N, k] int32 draft ids
    anchor: Tensor,  # [B] int32 target ids
    markov_w1: Tensor,  # [V, r] W
    markov_w2: Tensor,  # [V_d, r] W
    d2t: Tensor,  # [V_d] int32
    temperature: Tensor,  # [B] fp32
    seed: Tensor,  # [B] int32
    position: Tensor,  # [B] int32: position of d_1
    conf_base: Tensor,  # [B, N] fp32
    conf_w: Tensor,  # [r] fp32
    union_table: Tensor,  # [V, M] int32
    base_logits: Tensor,  # [B, N, V_d] T
    k: int,
    logit_scale: float,
    markov_topm: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # tokens [B, N] i32, logits [B, N, k+M] f32, conf [B, N] f32, ids [B, N, M] i32
    return reference_union_op(cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed, position,
                              conf_base, conf_w, union_table, base_logits, logit_scale=logit_scale)


@topk_markov_union.register_fake
def _(cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed, position, conf_base, conf_w,
      union_table, base_logits, k, logit_scale, markov_topm):
    B, N, _ = cand_values.shape
    return (cand_values.new_empty((B, N), dtype=torch.int32),
            cand_values.new_empty((B, N, k + markov_topm), dtype=torch.float32),
            cand_values.new_empty((B, N), dtype=torch.float32),
            cand_values.new_empty((B, N, markov_topm), dtype=torch.int32))


def _union_to_onnx(cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed, position, conf_base,
                   conf_w, union_table, base_logits, k: int, logit_scale: float, markov_topm: int):
    """Translation: one ``dspark::DSparkTopKMarkovUnion`` node (domain version 2)."""
    from onnxscript.values import Opset

    op = Opset(OP_DOMAIN, UNION_OPSET_VERSION)
    return getattr(op, UNION_OP_NAME)(cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed,
                                      position, conf_base, conf_w, union_table, base_logits,
                                      **union_node_attributes(k, logit_scale, markov_topm))


def _walk_outputs_like(cand_values, k: int):
    """Fake outputs of a walk node: draft_tokens int32 [B, N], cand_logits fp32 [B, N, k], confidence fp32 [B, N]."""
    B, N, _ = cand_values.shape
    return (cand_values.new_empty((B, N), dtype=torch.int32), cand_values.new_empty((B, N, k), dtype=torch.float32),
            cand_values.new_empty((B, N), dtype=torch.float32))


@torch.library.custom_op("dspark_export::topk_markov_gated", mutates_args=())
def topk_markov_gated(
    cand_values: Tensor, cand_ids: Tensor, anchor: Tensor, markov_w1: Tensor, markov_w2: Tensor, d2t: Tensor,
    temperature: Tensor, seed: Tensor, position: Tensor, conf_base: Tensor, conf_w: Tensor,
    gate_hidden: Tensor,  # [B, N, r] fp32: G_h · h_j + b_G
    gate_w: Tensor,  # [r, r] W: G_e
    k: int,
    logit_scale: float,
) -> tuple[Tensor, Tensor, Tensor]:  # the plain op's outputs
    return reference_gated_op(cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed, position,
                              conf_base, conf_w, gate_hidden, gate_w, logit_scale=logit_scale)


@topk_markov_gated.register_fake
def _(cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed, position, conf_base, conf_w,
      gate_hidden, gate_w, k, logit_scale):
    return _walk_outputs_like(cand_values, k)


@torch.library.custom_op("dspark_export::topk_markov_rnn", mutates_args=())
def topk_markov_rnn(
    cand_values: Tensor, cand_ids: Tensor, anchor: Tensor, markov_w1: Tensor, markov_w2: Tensor, d2t: Tensor,
    temperature: Tensor, seed: Tensor, position: Tensor, conf_base: Tensor, conf_w: Tensor,
    joint_hidden: Tensor,  # [B, N, 3r] fp32: J_h · h_j + b_J
    joint_w: Tensor,  # [3r, 2r] W: J over [state ; e]
    rnn_state0: Tensor,  # [B, r] fp32
    k: int,
    logit_scale: float,
) -> tuple[Tensor, Tensor, Tensor]:  # the plain op's outputs
    return reference_rnn_op(cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed, position,
                            conf_base, conf_w, joint_hidden, joint_w, rnn_state0, logit_scale=logit_scale)


@topk_markov_rnn.register_fake
def _(cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed, position, conf_base, conf_w,
      joint_hidden, joint_w, rnn_state0, k, logit_scale):
    return _walk_outputs_like(cand_values, k)


def _gated_to_onnx(cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed, position, conf_base,
                   conf_w, gate_hidden, gate_w, k: int, logit_scale: float):
    """Translation: one ``dspark::DSparkTopKMarkovGated`` node (domain version 3)."""
    from onnxscript.values import Opset

    op = Opset(OP_DOMAIN, HEAD_OPSET_VERSIONS["gated"])
    return getattr(op, GATED_OP_NAME)(cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed,
                                      position, conf_base, conf_w, gate_hidden, gate_w,
                                      **node_attributes(k, logit_scale))


def _rnn_to_onnx(cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed, position, conf_base,
                 conf_w, joint_hidden, joint_w, rnn_state0, k: int, logit_scale: float):
    """Translation: one ``dspark::DSparkTopKMarkovRNN`` node (domain version 3)."""
    from onnxscript.values import Opset

    op = Opset(OP_DOMAIN, HEAD_OPSET_VERSIONS["rnn"])
    return getattr(op, RNN_OP_NAME)(cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed,
                                    position, conf_base, conf_w, joint_hidden, joint_w, rnn_state0,
                                    **node_attributes(k, logit_scale))


@functools.cache
def translation_table() -> dict:
    """``custom_translation_table`` for ``torch.onnx.export``; registers the ONNX schema first."""
    register_schema()
    return {torch.ops.dspark_export.topk_markov.default: _to_onnx}


@functools.cache
def union_translation_table() -> dict:
    """``custom_translation_table`` for a draft graph with the candidate union (the union op only)."""
    register_schema()
    return {torch.ops.dspark_export.topk_markov_union.default: _union_to_onnx}


@functools.cache
def head_translation_table(head: str) -> dict:
    """``custom_translation_table`` for the draft graph of a Markov head type (vanilla = ``translation_table``)."""
    if head == "vanilla":
        return translation_table()
    register_schema()
    op = {"gated": (torch.ops.dspark_export.topk_markov_gated.default, _gated_to_onnx),
          "rnn": (torch.ops.dspark_export.topk_markov_rnn.default, _rnn_to_onnx)}[head]
    return dict([op])


def topk_markov_head(head, inputs: tuple, k: int, logit_scale: float):
    """The walk node of a gated / RNN head: ``inputs`` = the 11 plain inputs, ``head`` = its ``HeadFeatures``."""
    if head.kind == "gated":
        return topk_markov_gated(*inputs, head.hidden_part, head.weight, k, logit_scale)
    return topk_markov_rnn(*inputs, head.hidden_part, head.weight, head.start(), k, logit_scale)
