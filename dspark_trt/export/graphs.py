"""The two drafter graphs, built from the reference modules and exported with ``torch.onnx.export(dynamo=True)``.

``context`` — fuse newly accepted tokens' target taps into per-layer K/V (``DSparkDrafter.context_kv``)::

    taps [B, T, m·d] (fc's dtype: fp32 in an fp16 export), positions [B, T] int32
      →  ctx_k, ctx_v [L, B, T, H_kv, D] (model dtype)

``draft`` — one draft round (``block_hidden`` → ``confidence_parts`` / ``base_logits`` → Markov walk)::

    anchor [B] int32, ctx_key_<l>, ctx_value_<l> [B, H_kv, T, D] per layer l (heads first),
    ctx_len [B] int32 (= anchor position p: valid context), ctx_start [B] int32 (the position of context row 0),
    temperature [B] fp32 (< 1e-5 greedy), seed [B] int32 (>= 0)
      →  draft_tokens [B, N] int32 (target ids), cand_ids [B, N, k] int32 (draft ids; top-k only),
         cand_logits [B, N, k] fp32 (corrected, before temperature), confidence [B, N] fp32 (with a head)

Top-k: a standard ``TopK`` on the fp32 base logits, then one ``dspark::DSparkTopKMarkov`` node (the plugin in
TensorRT) with its standard-op local function attached (onnxruntime, TensorRT without the plugin).
Candidate union (``markov_topm`` M > 0): one ``dspark::DSparkTopKMarkovUnion`` node instead (``dspark`` domain
version 2), fed the [V, M] int32 table (an initializer, ``union_table``, built at export by
``markov_union_table`` from the checkpoint's weights in fp32) and the base logits the graph already computes;
``cand_ids`` / ``cand_logits`` are then [B, N, k + M] (the k top-k ids, then the M union ids; −inf = a masked
duplicate). M = 0 exports exactly the graph without a union.
Gated / RNN Markov head (``config.markov_head_type``): the graph computes the head's walk-independent part for every
prediction slot at once from the block's final-normed states (``DSparkDrafter.head_features``: ``G_h·h_j + b_G``
[B, N, r] or ``J_h·h_j + b_J`` [B, N, 3r], and for rnn in the bonus-anchor layout the state after the anchor slot,
else zeros), then one ``dspark::DSparkTopKMarkovGated`` / ``DSparkTopKMarkovRNN`` node (``dspark`` domain version 3)
walks the r-sized recurrence with its local function attached; its inputs and outputs to the graph are the plain
op's, so the draft graph's I/O does not change with the head. A vanilla export is exactly the graph it was.
Dense (``topk=None``, every head): the reference walk itself, inlined (no custom node; ``cand_logits`` has k = V_d and
``cand_ids`` is omitted, as it would be ``arange(V_d)``).

The context is read in place (``DRAFT_KV_INTERFACE``): one input per layer, so that each is a contiguous block
of the runtime's heads-first ``[L, B, H_kv, capacity, D]`` cache (``runtime/drafter_state.py``; T = its
capacity, rows past ``ctx_len`` masked), and the attention never concatenates it with the block or repeats
its heads (``reference/layers.py: two_part_attention``). Row r holds position ``ctx_start + r``: a drafter
whose layers read only the last W rows keeps a sliding cache of them (``DrafterState``'s ``start``), and the
mask, not the keys (RoPE'd at their own positions), follows the offset. Older exports took one stacked
``ctx_k [L, B, T, H_kv, D]`` (v0) or no ``ctx_start`` (v1); the runtimes refuse them in one line
(``artifact/drafter_io.py: check_draft_interface``). The runtime feeds them (``runtime/drafter_graphs.py``).

Shapes: batch B is dynamic; N is fixed (the checkpoint's block); the context length T is dynamic but
**bounded** by ``max_context``. Bounded rather than static because a static T would make every round attend
over ``max_context`` padded keys and copy a full-size cache, while TensorRT needs *some* bound for its
optimisation profile; per-request valid lengths (``ctx_len``) mask the padding either way. The bound is
recorded in the model metadata for the engine build.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..artifact.drafter_io import CONTEXT_INPUTS, CONTEXT_OUTPUTS, draft_input_names, draft_outputs
from ..reference.markov import select_candidates

__all__ = ["ContextGraph", "DraftGraph", "export_context", "export_draft", "GraphInfo"]

class ContextGraph(torch.nn.Module):
    def __init__(self, drafter):
        super().__init__()
        self.drafter = drafter

    def forward(self, taps: torch.Tensor, positions: torch.Tensor):  # [B, T, m·d], [B, T] int32
        return self.drafter.context_kv(taps, positions)  # K, V [L, B, T, H_kv, D]


class DraftGraph(torch.nn.Module):
    """One round of the reference drafter; the top-k Markov walk is the custom op (reference_op eagerly), or with
    ``markov_topm`` M > 0 the union op over the table registered as buffer ``union_table`` [V, M] int32."""

    def __init__(self, drafter, topk: int | None, markov_topm: int = 0):
        super().__init__()
        self.drafter, self.topk, self.markov_topm = drafter, topk, int(markov_topm)
        if self.markov_topm:
            if topk is None:
                from ..errors import DSparkTrtError

                raise DSparkTrtError("the candidate union (--markov-topm M > 0) needs a top-k export; pass --topk K "
                                     "or --markov-topm 0")
            self.register_buffer("union_table", drafter.union_table(self.markov_topm).to(torch.int32).clone())

    def forward(self, anchor, ctx_k, ctx_v, ctx_len, ctx_start, temperature, seed):  # ctx_k/v: L × [B, H_kv, T, D]
        d, c = self.drafter, self.drafter.config
        if self.topk is None:  # dense: the reference round, unchanged
            r = d.draft(anchor, ctx_k, ctx_v, ctx_len, topk=None, temperature=temperature, seed=seed,
                        ctx_start=ctx_start)
            extra = () if r.confidence is None else (r.confidence,)
            return (r.tokens.to(torch.int32), r.cand_logits) + extra
        from .topk_op import topk_markov

        head = None
        if c.markov_head_type == "vanilla":
            hidden = d.block_hidden(anchor, ctx_k, ctx_v, ctx_len, ctx_start)  # [B, N, d]
        else:  # gated / rnn: the head's walk-independent part for every slot at once, before the walk node
            states = d.block_states(anchor, ctx_k, ctx_v, ctx_len, ctx_start)  # [B, Q, d]
            hidden = d.prediction_slots(states)  # [B, N, d]
            head = d.head_features(anchor, states)  # hidden part [B, N, r | 3r] fp32, weight, (rnn) state0
        B, N = hidden.shape[:2]
        conf_base, conf_w = d.confidence_parts(hidden)  # [B, N] fp32, [r] fp32 (or None)
        base = d.base_logits(hidden)  # [B, N, V_d] fp32
        cand_vals, cand_ids = select_candidates(base, self.topk)  # [B, N, k] fp32, int64
        cand_ids = cand_ids.to(torch.int32)
        inputs = (
            cand_vals, cand_ids, anchor.to(torch.int32),
            d.markov_head.markov_w1.weight, d.markov_head.markov_w2.weight, d.d2t.to(torch.int32),
            temperature.to(torch.float32), seed.to(torch.int32), (ctx_len + 1).to(torch.int32),  # d_1 after p
            conf_base if conf_base is not None else hidden.new_zeros((B, N), dtype=torch.float32),
            conf_w if conf_w is not None else hidden.new_zeros((c.markov_rank,), dtype=torch.float32),
        )
        if self.markov_topm:
            from .topk_op import topk_markov_union

            tokens, logits, conf, union_ids = topk_markov_union(*inputs, self.union_table, base, self.topk,
                                                                float(c.logit_scale), self.markov_topm)
            cand_ids = torch.cat((cand_ids, union_ids), dim=-1)  # [B, N, k + M] int32
        elif head is not None:
            from .topk_op import topk_markov_head

            weights_dtype = d.markov_head.markov_w1.weight.dtype  # the op's W: one type for every weight input
            head = dataclasses.replace(head, weight=head.weight.to(weights_dtype))  # exact: sliced from W
            tokens, logits, conf = topk_markov_head(head, inputs, self.topk, float(c.logit_scale))
        else:
            tokens, logits, conf = topk_markov(*inputs, self.topk, float(c.logit_scale))
        return (tokens, cand_ids, logits) + ((conf,) if conf_base is not None else ())


@dataclass(frozen=True)
class GraphInfo:
    """What a graph was built for (also written to the model's ``metadata_props`` as ``dspark.*``)."""

    graph: str  # "context" | "draft"
    dtype: str  # fp32 | fp16 | bf16
    num_draft_tokens: int
    max_context: int
    topk: int | None
    config_digest: str
    markov_topm: int = 0  # candidate union width M (draft graph); 0 = none, and then not in the metadata

    def metadata(self) -> dict[str, str]:
        fields = {k: v for k, v in self.__dict__.items() if not (k == "markov_topm" and not v)}  # M = 0: as before
        return {f"dspark.{k}": ("off" if v is None else str(v)) for k, v in fields.items()}


def _example_context(drafter, B: int, T: int):
    c, dtype = drafter.config, drafter.fc.weight.dtype
    gen = torch.Generator().manual_seed(0)
    taps = torch.randn(B, T, c.num_taps * c.hidden_size, generator=gen).to(dtype)
    positions = torch.arange(T, dtype=torch.int32).expand(B, T).contiguous()
    return taps, positions


def export_context(drafter, info: GraphInfo):
    """The context graph as an ``onnx_ir.Model``."""
    from ..torch_to_onnx import torch_onnx_export

    B, T = 3, 11  # example sizes: distinct, ≥ 2, so neither dimension specialises
    Bd = torch.export.Dim("B")
    Td = torch.export.Dim("T", max=info.max_context)
    program = torch_onnx_export(
        ContextGraph(drafter), _example_context(drafter, B, T), input_names=list(CONTEXT_INPUTS),
        output_names=list(CONTEXT_OUTPUTS), dynamic_shapes=({0: Bd, 1: Td}, {0: Bd, 1: Td}),
    )
    return _finish(program.model, info)


def export_draft(drafter, info: GraphInfo):
    """The draft graph as an ``onnx_ir.Model`` (top-k: custom node + local function)."""
    from ..torch_to_onnx import torch_onnx_export
    c = drafter.config
    B, T = 3, 11
    taps, positions = _example_context(drafter, B, T)
    ctx_k, ctx_v = drafter.context_kv(taps, positions)  # [L, B, T, H_kv, D]
    keys = [k.transpose(1, 2).contiguous() for k in ctx_k]  # L × [B, H_kv, T, D]
    values = [v.transpose(1, 2).contiguous() for v in ctx_v]
    example = (
        torch.tensor([5, 7, 11], dtype=torch.int32) % c.vocab_size, keys, values,
        torch.tensor([T, 4, 9], dtype=torch.int32), torch.tensor([0, 1, 2], dtype=torch.int32),
        torch.tensor([0.0, 1.0, 0.5]),
        torch.tensor([1, 2, 3], dtype=torch.int32),
    )
    Bd = torch.export.Dim("B")
    Td = torch.export.Dim("T", max=info.max_context)
    kv = [{0: Bd, 2: Td}] * c.num_hidden_layers  # per layer [B, H_kv, T, D]
    has_conf = drafter.confidence_head is not None
    union = bool(info.markov_topm)
    table = None
    if info.topk is not None:
        from .topk_op import head_translation_table, union_translation_table

        table = union_translation_table() if union else head_translation_table(c.markov_head_type)
    program = torch_onnx_export(
        DraftGraph(drafter, info.topk, info.markov_topm), example, input_names=draft_input_names(c.num_hidden_layers),
        output_names=list(draft_outputs(info.topk, has_conf)),
        dynamic_shapes=({0: Bd}, kv, kv, {0: Bd}, {0: Bd}, {0: Bd}, {0: Bd}),
        custom_translation_table=table,
    )
    model = program.model
    if info.topk is not None:
        _attach_local_function(model, info, weights_dtype=drafter.markov_head.markov_w1.weight.dtype,
                               head=c.markov_head_type)
    return _finish(model, info)


def _attach_local_function(model, info: GraphInfo, weights_dtype: torch.dtype, head: str = "vanilla") -> None:
    import functools

    import onnx_ir as ir

    from ..plugins.contract import HEAD_OPS, OP_DOMAIN, UNION_OP_NAME
    from ..plugins.onnx_op import HEAD_OPSET_VERSIONS, UNION_OPSET_VERSION, head_local_function, union_local_function

    opset = model.opset_imports[""]
    if info.markov_topm:
        build, version, name = union_local_function, UNION_OPSET_VERSION, UNION_OP_NAME
    else:  # vanilla: local_function, domain version 1, exactly as before the other heads
        build = functools.partial(head_local_function, head)
        version, name = HEAD_OPSET_VERSIONS[head], HEAD_OPS[head][0]
    fn = ir.serde.deserialize_function(build(info.num_draft_tokens, torch.float32, weights_dtype, opset=opset))
    model.functions[fn.identifier()] = fn
    model.opset_imports[OP_DOMAIN] = version
    for node in model.graph:
        if node.domain == OP_DOMAIN:
            node.name = name  # the one custom node; readable in polygraphy / TensorRT layer names


def _finish(model, info: GraphInfo):
    model.producer_name = "dspark-trt"
    model.graph.name = f"dspark_{info.graph}"
    for key, value in info.metadata().items():
        model.metadata_props[key] = value
    return model
