"""The exported context and draft graphs, run in onnxruntime, against the reference drafter on the tiny pairs."""

from __future__ import annotations

import functools

import pytest
import torch

from dspark_trt.export.validate import TOLERANCES, compare_context, compare_draft

pytestmark = pytest.mark.onnx

V_D = 2500  # draft vocabulary of the default tiny pair


@functools.cache
def _drafter(path, dtype):
    from dspark_trt import load_drafter

    return load_drafter(path.drafter, dtype=dtype, target_dir=path.target)


@functools.cache
def _graphs(export_dir):
    from dspark_trt.runtime.ort_session import OrtGraph

    return OrtGraph(export_dir / "onnx" / "context.onnx"), OrtGraph(export_dir / "onnx" / "draft.onnx")


def round_inputs(drafter, B: int, *, seed: int = 0, sampled: bool):
    """Random taps → reference K/V (padded: per-request valid lengths), anchors, temperatures, seeds."""
    c = drafter.config
    g = torch.Generator().manual_seed(seed)
    T = 9 + 2 * B
    taps = torch.randn(B, T, c.num_taps * c.hidden_size, generator=g).to(drafter.fc.weight.dtype)
    ctx_k, ctx_v = drafter.context_kv(taps, torch.arange(T).expand(B, T))
    return dict(
        anchor=torch.randint(0, c.vocab_size, (B,), generator=g), ctx_k=ctx_k, ctx_v=ctx_v,
        ctx_len=torch.randint(1, T + 1, (B,), generator=g),
        temperature=(torch.tensor([1.0, 0.0, 0.7])[torch.arange(B) % 3] if sampled else None),
        seed=torch.randint(0, 2**40, (B,), generator=g),  # > int32: the graph feeds seed mod 2^31-1
    )


def run_both(drafter, draft_graph, inputs, topk):
    from dspark_trt.runtime.drafter_graphs import run_draft

    ref = drafter.draft(inputs["anchor"], inputs["ctx_k"], inputs["ctx_v"], inputs["ctx_len"], topk=topk,
                        temperature=inputs["temperature"], seed=inputs["seed"])
    got = run_draft(draft_graph, **inputs, draft_vocab=drafter.config.draft_vocab_size)
    return got, ref


def by_id(ids, values, vocab):
    """Candidates scattered into −inf rows: compare by id, never by position."""
    rows = torch.full((*ids.shape[:2], vocab), float("-inf"))
    return rows.scatter(-1, ids.to(torch.int64), values.to(torch.float32))


@pytest.mark.parametrize("topk", [16, V_D, "off"])  # k = 1: test_odd_checkpoint
@pytest.mark.parametrize("B", [1, 3])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_fp32_draft_graph_matches_reference(tiny_pair, onnx_export, topk, B, sampled):
    drafter = _drafter(tiny_pair, "fp32")
    _, draft = _graphs(onnx_export(tiny_pair, "fp32", topk))
    got, ref = run_both(drafter, draft, round_inputs(drafter, B, seed=B, sampled=sampled),
                        None if topk == "off" else topk)
    assert torch.equal(got.tokens, ref.tokens)  # fp32: greedy and (same seeds) sampled tokens identical
    assert torch.equal(got.cand_ids.sort(-1).values, ref.cand_ids.sort(-1).values)  # same candidate sets
    # ORT and torch sum the GEMMs in different orders: ~1e-7 absolute on logits of magnitude ~1
    torch.testing.assert_close(by_id(got.cand_ids, got.cand_logits, V_D), by_id(ref.cand_ids, ref.cand_logits, V_D),
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.confidence, ref.confidence, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_low_precision_draft_graph_matches_reference(tiny_pair, onnx_export, dtype, sampled):
    """fp16 natively, bf16 through the emulation twin: dtype tolerances, tie-robust tokens and candidate sets."""
    drafter = _drafter(tiny_pair, dtype)
    _, draft = _graphs(onnx_export(tiny_pair, dtype, 16))
    inputs = round_inputs(drafter, 3, seed=7, sampled=sampled)
    got, ref = run_both(drafter, draft, inputs, 16)
    checks = compare_draft(got, ref, TOLERANCES[dtype], vocab=V_D, temperature=inputs["temperature"],
                           seed=inputs["seed"], positions=inputs["ctx_len"] + 1)
    assert all(c.ok for c in checks), [c.line() for c in checks]
    assert (got.tokens == ref.tokens).float().mean() >= 0.8  # near-ties are rare, not the rule


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("B", [1, 3])
def test_context_graph_matches_reference(tiny_pair, onnx_export, dtype, B):
    from dspark_trt.runtime.drafter_graphs import run_context

    drafter = _drafter(tiny_pair, dtype)
    context, _ = _graphs(onnx_export(tiny_pair, dtype, 16))
    c = drafter.config
    T = 5 + 3 * B
    taps = torch.randn(B, T, c.num_taps * c.hidden_size, generator=torch.Generator().manual_seed(B)).to(
        drafter.fc.weight.dtype)
    positions = (torch.arange(T) + torch.arange(B).view(B, 1) * 17)  # requests at different offsets
    got_k, got_v = run_context(context, taps, positions)
    ref_k, ref_v = drafter.context_kv(taps, positions)
    assert got_k.dtype == ref_k.dtype and got_k.shape == ref_k.shape == (c.num_hidden_layers, B, T,
                                                                         c.num_key_value_heads, c.head_dim)
    checks = compare_context(got_k, got_v, ref_k, ref_v, TOLERANCES[dtype])
    assert all(ch.ok for ch in checks), [ch.line() for ch in checks]
    if dtype == "fp32":
        torch.testing.assert_close(got_k, ref_k, atol=1e-5, rtol=1e-5)


def test_topk_full_vocab_graph_equals_dense_graph(tiny_pair, onnx_export):
    """docs/dspark.md §10.1 at graph level: the custom node with k = V_d drafts what the dense walk drafts."""
    drafter = _drafter(tiny_pair, "fp32")
    inputs = round_inputs(drafter, 3, seed=11, sampled=True)
    from dspark_trt.runtime.drafter_graphs import run_draft

    topk = run_draft(_graphs(onnx_export(tiny_pair, "fp32", V_D))[1], **inputs, draft_vocab=V_D)
    dense = run_draft(_graphs(onnx_export(tiny_pair, "fp32", "off"))[1], **inputs, draft_vocab=V_D)
    assert torch.equal(topk.tokens, dense.tokens)
    torch.testing.assert_close(by_id(topk.cand_ids, topk.cand_logits, V_D), dense.cand_logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_causal_windowed_draft_graph_matches_reference(tiny_causal_pair, onnx_export, sampled):
    """speculators' default pattern (a causal sliding-window layer) is in the graph: ORT = reference, and both
    differ from reading the checkpoint as bidirectional and full."""
    drafter = _drafter(tiny_causal_pair, "fp32")
    c = drafter.config
    assert c.layer_attention(0) == (4, True) and c.layer_attention(1) == (None, False)
    _, draft = _graphs(onnx_export(tiny_causal_pair, "fp32", 16))
    inputs = round_inputs(drafter, 3, seed=9, sampled=sampled)
    inputs["ctx_len"] = torch.tensor([15, 8, 2])  # T = 15: the window of 4 drops rows for the first two
    got, ref = run_both(drafter, draft, inputs, 16)
    assert torch.equal(got.tokens, ref.tokens)
    torch.testing.assert_close(by_id(got.cand_ids, got.cand_logits, V_D), by_id(ref.cand_ids, ref.cand_logits, V_D),
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.confidence, ref.confidence, atol=1e-6, rtol=1e-6)
    wrong = type(drafter)(c.replace(layer_types=("full_attention",) * 2))  # read as DeepSeek's pattern
    wrong.load_state_dict(drafter.state_dict())
    round_inputs_ = (inputs["anchor"], inputs["ctx_k"], inputs["ctx_v"], inputs["ctx_len"])
    base = drafter.base_logits(drafter.block_hidden(*round_inputs_))
    other = wrong.base_logits(wrong.block_hidden(*round_inputs_))
    assert (base - other).abs().amax(dim=(1, 2)).min() > 1e-3  # every request: the mask matters


def test_bidirectional_windowed_draft_graph_matches_reference(tiny_windowed_pair, onnx_export):
    """The recipe's context window (every layer reads the last W = 4 context rows, the block bidirectional):
    ORT = reference, and both differ from full attention where a request's context is longer than W."""
    drafter = _drafter(tiny_windowed_pair, "fp32")
    c = drafter.config
    assert all(c.layer_attention(i) == (4, False) for i in range(2))
    _, draft = _graphs(onnx_export(tiny_windowed_pair, "fp32", 16))
    inputs = round_inputs(drafter, 3, seed=11, sampled=False)
    inputs["ctx_len"] = torch.tensor([15, 3, 9])  # T = 15: rows dropped for requests 0 and 2, none for 1
    got, ref = run_both(drafter, draft, inputs, 16)
    assert torch.equal(got.tokens, ref.tokens)
    torch.testing.assert_close(by_id(got.cand_ids, got.cand_logits, V_D), by_id(ref.cand_ids, ref.cand_logits, V_D),
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.confidence, ref.confidence, atol=1e-6, rtol=1e-6)
    full = type(drafter)(c.replace(layer_types=("full_attention",) * 2, sliding_window=None))
    full.load_state_dict(drafter.state_dict())
    args = (inputs["anchor"], inputs["ctx_k"], inputs["ctx_v"], inputs["ctx_len"])
    diff = (drafter.base_logits(drafter.block_hidden(*args)) - full.base_logits(full.block_hidden(*args))).abs()
    per_request = diff.amax(dim=(1, 2))  # [B]
    assert per_request[0] > 1e-3 and per_request[2] > 1e-3 and per_request[1] < 1e-5  # only past the window


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_a_sliding_context_drafts_what_the_whole_context_drafts(tiny_windowed_pair, onnx_export, sampled):
    """The runtime's sliding cache for a windowed drafter: each request's rows from ``ctx_start`` on, moved to
    row 0 (what ``DrafterState`` keeps), and ``ctx_start`` telling the graph their position. The exported graph
    over the slid rows = the reference over the whole context; the offset matters (fed without it, the mask
    reads the wrong rows and the drafts change)."""
    from dspark_trt.runtime.drafter_graphs import run_draft

    drafter = _drafter(tiny_windowed_pair, "fp32")
    _, draft = _graphs(onnx_export(tiny_windowed_pair, "fp32", 16))
    inputs = round_inputs(drafter, 3, seed=5, sampled=sampled)
    inputs["ctx_len"] = torch.tensor([15, 3, 9])  # T = 15, W = 4
    start = torch.tensor([11, 0, 2])  # request 0 kept its last 4 rows, request 1 everything, request 2 rows 2 …
    ref = drafter.draft(inputs["anchor"], inputs["ctx_k"], inputs["ctx_v"], inputs["ctx_len"], topk=16,
                        temperature=inputs["temperature"], seed=inputs["seed"])
    slid = {}
    noise = torch.Generator().manual_seed(6)
    for name in ("ctx_k", "ctx_v"):  # [L, B, T, H_kv, D]: rows start … moved to the front, other rows noise
        x = torch.randn(inputs[name].shape, generator=noise).to(inputs[name].dtype)
        for b, s in enumerate(start.tolist()):
            x[:, b, : x.shape[2] - s] = inputs[name][:, b, s:]
        slid[name] = x
    got = run_draft(draft, **{**inputs, **slid}, ctx_start=start, draft_vocab=V_D)
    assert torch.equal(got.tokens, ref.tokens)
    torch.testing.assert_close(by_id(got.cand_ids, got.cand_logits, V_D), by_id(ref.cand_ids, ref.cand_logits, V_D),
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.confidence, ref.confidence, atol=1e-6, rtol=1e-6)
    ours = drafter.draft(inputs["anchor"], slid["ctx_k"], slid["ctx_v"], inputs["ctx_len"], topk=16,
                         temperature=inputs["temperature"], seed=inputs["seed"], ctx_start=start)
    assert torch.equal(ours.tokens, ref.tokens)  # the reference itself, over the slid rows
    blind = run_draft(draft, **{**inputs, **slid}, draft_vocab=V_D)  # the offset left out
    diff = (blind.cand_logits - ref.cand_logits).abs().amax(dim=(1, 2))  # [B] (candidates sorted by logit)
    assert torch.isfinite(diff).all() and diff[[0, 2]].min() > 1e-3 and diff[1] < 1e-5  # the slid ones change


@pytest.mark.parametrize("B", [1, 3])
def test_odd_checkpoint_k1(tiny_odd_pair, onnx_export, B):
    """k = 1 on the awkward pair: reduced vocab (d2t), logit_scale 0.5, bonus-anchor layout (N = 4), no
    confidence head."""
    topk = 1
    drafter = _drafter(tiny_odd_pair, "fp32")
    c = drafter.config
    assert c.has_reduced_vocab and c.num_draft_tokens == 4 and drafter.confidence_head is None
    _, draft = _graphs(onnx_export(tiny_odd_pair, "fp32", topk))
    assert "confidence" not in draft.output_names
    for sampled in (False, True):
        got, ref = run_both(drafter, draft, round_inputs(drafter, B, seed=5, sampled=sampled), topk)
        assert got.confidence is None and ref.confidence is None
        assert torch.equal(got.tokens, ref.tokens)
        vd = c.draft_vocab_size
        assert torch.isin(got.tokens, torch.arange(vd) + drafter.d2t).all()  # target ids, through d2t
        assert (drafter.d2t != 0).any()
        torch.testing.assert_close(by_id(got.cand_ids, got.cand_logits, vd), by_id(ref.cand_ids, ref.cand_logits, vd),
                                   atol=1e-5, rtol=1e-5)


def test_dynamic_batch_and_bounded_context(tiny_pair, onnx_export):
    import onnx

    path = onnx_export(tiny_pair, "fp32", 16)
    model = onnx.load(str(path / "onnx" / "draft.onnx"), load_external_data=False)
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in model.graph.input}
    assert dims["anchor"] == ["B"] and "ctx_k" not in dims
    assert dims["ctx_key_0"] == dims["ctx_value_1"] == ["B", 2, "T", 16]  # per layer, heads first
    assert [v.name for v in model.graph.input][:5] == ["anchor", "ctx_key_0", "ctx_key_1", "ctx_value_0", "ctx_value_1"]
    outs = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in model.graph.output}
    assert outs == {"draft_tokens": ["B", 7], "cand_ids": ["B", 7, 16], "cand_logits": ["B", 7, 16],
                    "confidence": ["B", 7]}
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["dspark.max_context"] == "8192" and meta["dspark.topk"] == "16" and meta["dspark.graph"] == "draft"
    # B = 5 and T = 1 were never seen at export time
    drafter = _drafter(tiny_pair, "fp32")
    inputs = round_inputs(drafter, 5, seed=1, sampled=True)
    inputs.update(ctx_k=inputs["ctx_k"][:, :, :1], ctx_v=inputs["ctx_v"][:, :, :1], ctx_len=torch.ones(5, dtype=torch.int64))
    got, ref = run_both(drafter, _graphs(path)[1], inputs, 16)
    assert torch.equal(got.tokens, ref.tokens)


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_the_node_tensorrt_looks_up(tiny_pair, onnx_export, dtype):
    """One dspark::DSparkTopKMarkov node with plugin name/version/namespace + op attributes, fed by a TopK;
    weights as initializer inputs; the same-named local function attached; full checker passes."""
    import onnx
    from onnx import helper

    from dspark_trt.plugins.contract import INPUTS, OP_DOMAIN, OP_NAME
    from dspark_trt.plugins.onnx_op import register_schema

    register_schema()
    path = onnx_export(tiny_pair, dtype, 16)
    model = onnx.load(str(path / "onnx" / "draft.onnx"))
    onnx.checker.check_model(model, full_check=True)
    custom = [n for n in model.graph.node if n.domain == OP_DOMAIN]
    assert [n.op_type for n in custom] == [OP_NAME]
    node = custom[0]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs == {"k": 16, "logit_scale": 1.0, "plugin_version": b"1", "plugin_namespace": b"dspark"}
    assert len(node.input) == len(INPUTS)
    inits = {i.name: i for i in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    w1, w2 = (inits.get(node.input[i]) for i in (3, 4))
    assert w1 is not None and w2 is not None and list(w2.dims) == [V_D, 16]
    assert {onnx.TensorProto.FLOAT: "fp32", onnx.TensorProto.FLOAT16: "fp16",
            onnx.TensorProto.BFLOAT16: "bf16"}[w1.data_type] == dtype
    source = producers[node.input[0]]
    while source.op_type != "TopK":
        source = producers[source.input[0]]
    assert int(onnx.numpy_helper.to_array(inits[source.input[1]]).reshape(-1)[0]) == 16
    assert [(f.domain, f.name) for f in model.functions] == [(OP_DOMAIN, OP_NAME)]
    assert {(o.domain, o.version) for o in model.opset_import} >= {(OP_DOMAIN, 1)}


def test_dense_export_has_no_custom_node(tiny_pair, onnx_export):
    import onnx

    model = onnx.load(str(onnx_export(tiny_pair, "fp32", "off") / "onnx" / "draft.onnx"))
    assert not [n for n in model.graph.node if n.domain not in ("", "ai.onnx")] and not model.functions
    onnx.checker.check_model(model, full_check=True)
    assert [o.name for o in model.graph.output] == ["draft_tokens", "cand_logits", "confidence"]


def test_sessions_do_not_spin_between_calls(tiny_pair, onnx_export):
    """A decoder alternates the drafter's and the target's sessions on the same cores: idle onnxruntime pool
    threads must sleep, not spin (spinning halved the export path's speed on 2 cores; docs/benchmarks.md)."""
    for graph in _graphs(onnx_export(tiny_pair, "fp32", 16)):
        options = graph.session.get_session_options()
        assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
        assert options.get_session_config_entry("session.inter_op.allow_spinning") == "0"
