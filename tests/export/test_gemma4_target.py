"""The Gemma-4 text target: its graph == transformers (logits, taps, new K/V) at prompts longer than the sliding
window, with KV sharing and per-layer inputs; in bf16/fp16 it rounds where transformers rounds; through
dspark-export in fp32, bf16 and fp16 (validated against transformers in that dtype, the sliding layers fed only
their ring) and the runtime: greedy speculative == the target alone (== transformers' generate in fp32)."""

from __future__ import annotations

import pytest
import torch

from dspark_trt.errors import DSparkTrtError

pytestmark = pytest.mark.usefixtures("one_thread")

def tiny_gemma4(**overrides):
    import transformers

    kw = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, global_head_dim=32, sliding_window=4, final_logit_softcapping=30.0,
              hidden_size_per_layer_input=0, num_kv_shared_layers=0, vocab_size_per_layer_input=300)
    kw.update(overrides)
    torch.manual_seed(0)
    model = transformers.Gemma4ForCausalLM(transformers.Gemma4TextConfig(**kw)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0, 0.05)
    return model


LAYERS = ["sliding_attention", "full_attention", "sliding_attention", "full_attention", "sliding_attention",
          "full_attention"]


def graph_matches_transformers(features) -> None:
    """Prefill 11 tokens, then verify 5 with the sliding layers holding only a rotated ring of the last 6 positions
    (window 4: two stale slots the graph must mask by position); assert logits, taps and new K/V."""
    from dspark_trt.config import hf_hidden_state_indices
    from dspark_trt.export.gemma4_target_graph import Gemma4TargetGraph

    model = tiny_gemma4(**features)
    model.config._attn_implementation = "eager"
    T, T0, taps = 16, 11, [1, 2, 4]  # not the last layer (tapped before the final norm, unlike hidden_states[-1])
    ids = torch.randint(0, 300, (1, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids, output_hidden_states=True, use_cache=True)
    graph = Gemma4TargetGraph(model, taps)
    if features.get("num_kv_shared_layers"):
        assert graph.stored == [0, 1, 2, 3] and graph.reuse_of == {4: 2, 5: 3}  # shared K/V: stored once
    glob = [i for i in graph.stored if graph.layer_types[i] == "full_attention"]
    slid = [i for i in graph.stored if graph.layer_types[i] == "sliding_attention"]
    empty = [torch.zeros(1, graph.kv_shape[i][0], 1, graph.kv_shape[i][1]) for i in graph.stored]
    mask = torch.cat([torch.zeros(1, 1, dtype=torch.int64), torch.ones(1, T0, dtype=torch.int64)], 1)
    with torch.no_grad():
        _, _, kg, vg, ks, vs = graph(ids[:, :T0], torch.arange(T0)[None], mask, -torch.ones(1, 1, dtype=torch.int64),
                                     torch.arange(T0)[None], empty, [e.clone() for e in empty])
        ring = torch.roll(torch.arange(T0 - 6, T0), 2)  # slot order ≠ position order
        past = {i: (kg[glob.index(i)], vg[glob.index(i)]) if i in glob else
                (ks[slid.index(i)][:, :, ring], vs[slid.index(i)][:, :, ring]) for i in graph.stored}
        Q = T - T0
        logits, got_taps, kg2, _, _, _ = graph(
            ids[:, T0:], torch.arange(T0, T)[None], torch.ones(1, T0 + Q, dtype=torch.int64), ring[None],
            torch.arange(Q)[None], [past[i][0] for i in graph.stored], [past[i][1] for i in graph.stored])
    assert torch.allclose(logits, ref.logits[:, T0:], atol=1e-4)
    assert ref.logits.abs().max() < 30.0  # soft-capped
    ref_taps = torch.cat([ref.hidden_states[k][:, T0:] for k in hf_hidden_state_indices(taps)], -1)
    assert torch.allclose(got_taps, ref_taps, atol=1e-3)
    assert torch.allclose(kg2[-1], ref.past_key_values.layers[glob[-1]].keys[:, :, -Q:], atol=1e-5)


@pytest.mark.parametrize("features", [
    dict(),
    dict(num_kv_shared_layers=2, hidden_size_per_layer_input=8, layer_types=LAYERS),
    dict(attention_k_eq_v=True, num_global_key_value_heads=1),
], ids=["dense", "kv-shared+per-layer-inputs", "k-eq-v"])
def test_the_graph_equals_transformers_past_the_window_from_a_ring(features):
    graph_matches_transformers(features)


def test_a_graph_that_ignores_the_window_differs(monkeypatch):
    """The same check fails when the sliding bias lets the stale ring slots through (the test can fail)."""
    import dspark_trt.export.gemma4_target_graph as g

    window_bias = g.window_bias
    monkeypatch.setattr(g, "window_bias", lambda wp, pos, new, window, groups: window_bias(wp, pos, new, 10 ** 6,
                                                                                           groups))
    with pytest.raises(AssertionError):
        graph_matches_transformers(dict())


@pytest.mark.onnx
def test_the_export_is_validated_against_transformers_past_the_window(gemma4_export):
    from dspark_trt.artifact.export_dir import read_manifest

    target = read_manifest(gemma4_export)["target"]
    assert target["kv_interface"] == "gemma4-windowed-v1" and target["architecture"] == "Gemma4ForCausalLM"
    assert target["gemma4"]["global_layers"] == [5] and target["gemma4"]["sliding_layers"] == [0, 1, 2, 3, 4]
    assert target["gemma4"]["ring"] == 8 - 1 + 64  # the sliding layers' cache per request (runtime, engine profile)
    lines = target["validation"]
    assert "sliding window 8" in lines[0] and all(line.strip().startswith("ok") for line in lines[1:])
    assert any("held only their ring" in line for line in lines)


@pytest.mark.onnx
def test_greedy_speculative_equals_the_target_alone_and_transformers(gemma4_export, gemma4_pair):
    import transformers

    from dspark_trt.runtime import SpeculativeDecoder

    dec = SpeculativeDecoder.from_export(gemma4_export)
    assert type(dec.target).__name__ == "Gemma4OnnxRuntimeTarget"
    gen = torch.Generator().manual_seed(3)
    # 150 tokens: longer than the window (8) and the sliding layers' ring (71); a padded batch of three
    prompts = [torch.randint(0, 600, (n,), generator=gen).tolist() for n in (150, 21, 3)]
    spec = dec.generate(prompts, 10, eos_token_id=[])
    alone = dec.generate(prompts, 10, eos_token_id=[], draft=False)
    assert spec.tokens == alone.tokens and spec.stats.rounds >= 5  # rounds that roll rejected tokens back
    ring = dec.target.cache.slid
    assert ring.k.shape[3] == ring.ring == 8 - 1 + 64 < 150  # the sliding layers hold their ring, not the context
    model = transformers.AutoModelForCausalLM.from_pretrained(gemma4_pair.target, dtype=torch.float32)
    for p, got in zip(prompts, alone.tokens):
        out = model.generate(torch.tensor([p]), max_new_tokens=10, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert out[0, len(p):].tolist() == got


@pytest.mark.onnx
def test_the_validation_fails_against_another_window(gemma4_export, gemma4_pair):
    import transformers

    from dspark_trt.export.gemma4_target_onnx import validate_gemma4_target_onnx

    model = transformers.AutoModelForCausalLM.from_pretrained(gemma4_pair.target, dtype=torch.float32)
    model.config.sliding_window = 12  # the reference attends further back than the exported graph (8)
    report = validate_gemma4_target_onnx(gemma4_export / "onnx" / "target.onnx", model, [1, 3, 4],
                                         raise_on_failure=False)
    assert not report.ok


@pytest.mark.onnx
def test_a_built_reference_is_dropped_before_onnxruntime_maps_the_graph(gemma4_export, gemma4_pair, monkeypatch):
    """Given a builder (as the export passes it), the validation holds one copy of the weights at a time: the
    transformers model is gone when the onnxruntime session opens, and the graph still validates against it; a
    reference with another window still fails through the same path."""
    import gc
    import weakref

    import transformers

    from dspark_trt.export import gemma4_target_onnx
    from dspark_trt.runtime import ort_session

    built, alive_at_session = [], []

    def build(window=None):
        model = transformers.AutoModelForCausalLM.from_pretrained(gemma4_pair.target, dtype=torch.float32)
        if window is not None:
            model.config.sliding_window = window
        built.append(weakref.ref(model))
        return model

    class Probe(ort_session.OrtGraph):
        def __init__(self, *args, **kwargs):
            gc.collect()
            alive_at_session.append((built[-1]() is not None, kwargs.get("low_memory")))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(ort_session, "OrtGraph", Probe)
    path = gemma4_export / "onnx" / "target.onnx"
    report = gemma4_target_onnx.validate_gemma4_target_onnx(path, build, [1, 3, 4], raise_on_failure=False)
    assert report.ok, report.lines()
    assert not gemma4_target_onnx.validate_gemma4_target_onnx(path, lambda: build(12), [1, 3, 4],
                                                              raise_on_failure=False).ok
    assert alive_at_session == [(False, True), (False, True)]


def test_moe_and_multimodal_gemma4_targets_are_refused_in_one_line():
    from dspark_trt.export.target_graph import check_architecture

    with pytest.raises(DSparkTrtError, match="MoE") as e:
        check_architecture({"architectures": ["Gemma4ForCausalLM"], "enable_moe_block": True})
    assert "\n" not in str(e.value) and "--skip-target" in str(e.value)
    with pytest.raises(DSparkTrtError, match="multimodal Gemma-4"):
        check_architecture({"architectures": ["Gemma4ForConditionalGeneration"]})


# -- half precision ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_the_half_precision_graph_rounds_where_transformers_does(dtype, monkeypatch):
    """Without a past (a first prefill chunk, where the graph's attention is transformers' own) the bf16/fp16
    graph gives transformers' logits and taps bit for bit: the √d embedding scale, the per-layer inputs' two
    scales and the logit soft-capping round in the model dtype where transformers rounds. Rounding a scale to the
    model dtype first (as a plain exported ``x * 2**-0.5`` would) breaks it (the test can fail)."""
    import dspark_trt.export.gemma4_target_graph as g

    def graph_vs_transformers():
        model = tiny_gemma4(sliding_window=8, num_kv_shared_layers=2, hidden_size_per_layer_input=8,
                            layer_types=LAYERS).to(dtype)
        model.config._attn_implementation = "eager"
        ids = torch.randint(0, 300, (1, 11), generator=torch.Generator().manual_seed(2))
        with torch.no_grad():
            ref = model(ids, output_hidden_states=True)
        graph = g.Gemma4TargetGraph(model, [1, 2, 4])
        empty = [torch.zeros(1, graph.kv_shape[i][0], 1, graph.kv_shape[i][1], dtype=dtype) for i in graph.stored]
        mask = torch.cat([torch.zeros(1, 1, dtype=torch.int64), torch.ones(1, 11, dtype=torch.int64)], 1)
        with torch.no_grad():
            logits, taps, *_ = graph(ids, torch.arange(11)[None], mask, -torch.ones(1, 1, dtype=torch.int64),
                                     torch.arange(11)[None], empty, [e.clone() for e in empty])
        ref_taps = torch.cat([ref.hidden_states[k] for k in (2, 3, 5)], -1)
        assert ref.logits.dtype == dtype and ref.logits.abs().max() < 30.0  # transformers soft-caps in the dtype
        return torch.equal(logits, ref.logits.float()) and torch.equal(taps, ref_taps)

    assert graph_vs_transformers()
    monkeypatch.setattr(g, "scale", lambda x, factor: x * torch.tensor(factor, dtype=x.dtype))
    assert not graph_vs_transformers()


@pytest.fixture(scope="module", params=["bf16", "fp16"])
def half_export(request, gemma4_pair, tmp_path_factory):
    """The Gemma-4 pair through dspark-export in bf16 / fp16 (the target validated against transformers in it)."""
    from dspark_trt.export.pipeline import ExportOptions, export_model

    out = tmp_path_factory.mktemp(f"gemma4-{request.param}") / "export"
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = export_model(gemma4_pair.drafter, out, ExportOptions(topk=8, dtype=request.param, engine="none",
                                                                      max_context=256), target_dir=gemma4_pair.target)
    finally:
        torch.set_num_threads(before)
    return request.param, out, result.manifest


@pytest.mark.onnx
@pytest.mark.slow  # one export per dtype (~1 min each on 2 cores)
def test_a_half_precision_export_is_validated_and_decodes_as_the_target_alone(half_export, gemma4_pair):
    """bf16/fp16: the target graph in that dtype (K/V and taps too), validated against transformers in it past the
    window (the graph as its fp32 emulation twin); greedy speculative decoding from the export == the target
    alone for prompts longer than the window and the ring; a graph read with taps one layer off fails the same
    validation, and so does a reference attending over another window."""
    import transformers

    from dspark_trt.export.gemma4_target_onnx import GEMMA4_ROW_RMS, validate_gemma4_target_onnx
    from dspark_trt.runtime import SpeculativeDecoder

    dtype, out, manifest = half_export
    target = manifest["target"]
    lines = target["validation"]
    assert target["dtype"] == dtype and f"({dtype}:" in lines[0] and f"rms|Δ| ≤ {GEMMA4_ROW_RMS:g}·u·√n" in lines[0]
    assert all(line.strip().startswith("ok") for line in lines[1:]), lines
    past = next(t for t in target["io"]["inputs"] if t["name"] == "past_key_0")
    assert past["dtype"] == {"bf16": "bfloat16", "fp16": "float16"}[dtype]
    assert ("fp16_range" in target) == (dtype == "fp16")

    dec = SpeculativeDecoder.from_export(out)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 600, (n,), generator=gen).tolist() for n in (90, 13, 2)]
    spec = dec.generate(prompts, 8, eos_token_id=[])
    assert spec.tokens == dec.generate(prompts, 8, eos_token_id=[], draft=False).tokens and spec.stats.rounds >= 4

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    model = transformers.AutoModelForCausalLM.from_pretrained(gemma4_pair.target, dtype=torch_dtype)
    path = out / "onnx" / "target.onnx"
    shifted = validate_gemma4_target_onnx(path, model, [0, 2, 3], raise_on_failure=False)  # the graph taps 1, 3, 4
    assert not shifted.ok and all(c.ok for c in shifted.checks if "taps" not in c.name)
    model.config.sliding_window = 12
    assert not validate_gemma4_target_onnx(path, model, [1, 3, 4], raise_on_failure=False).ok


@pytest.mark.onnx
@pytest.mark.slow  # reads the bf16 export of half_export
@pytest.mark.parametrize("half_export", ["bf16"], indirect=True)
def test_a_bf16_bound_is_the_models_own_rounding_and_still_tells_a_shifted_tap(half_export, gemma4_pair):
    """Given the same weights in fp32, each block's bound is max(c, √2 · transformers' own rounding error), measured
    independently here (bf16 vs fp32 transformers, per tap), and the graph run unrounded matches transformers in
    fp32 to summation order; the export's own validation (which builds the fp32 reference) passes, a graph read with
    taps one layer off and a reference over another window still fail (the unrounded checks too), and an fp32 run
    that does not fit the memory given falls back to c and says so."""
    import re

    import transformers

    from dspark_trt.export.gemma4_target_onnx import GEMMA4_ROW_RMS, OWN_ROUNDING_FACTOR, UNROUNDED_ROW_RMS
    from dspark_trt.export.gemma4_target_onnx import gemma4_tolerance, validate_gemma4_target_onnx
    from dspark_trt.taps import LayerTaps

    _, out, manifest = half_export
    lines = manifest["target"]["validation"]
    assert "max(c, 1.41·transformers' own bf16 rounding error" in lines[0], lines[0]
    assert all(line.strip().startswith("ok") for line in lines[1:]), lines
    # the pair's checkpoint is fp32: the export's fp32 reference is rounded to the graph's bf16 weights first
    assert sum(line.strip().startswith("ok   unrounded") for line in lines) == 7

    load = lambda dt: transformers.AutoModelForCausalLM.from_pretrained(gemma4_pair.target, dtype=dt).eval()  # noqa: E731
    half, fp32 = load(torch.bfloat16), load(torch.bfloat16).float()  # the graph's weights, upcast
    ids = [1, 3, 4]
    path = out / "onnx" / "target.onnx"
    report = validate_gemma4_target_onnx(path, half, ids, reference_fp32=fp32, raise_on_failure=False)
    assert report.ok, report.lines()
    # the limits the report states for the first chunk's taps == max(c, √2 · own), own measured here
    window = int(half.config.sliding_window)
    x = torch.randint(0, int(half.config.vocab_size), (1, 2 * window + 5), generator=torch.Generator().manual_seed(0))
    tol, taps = gemma4_tolerance("bf16"), []
    for model in (half, fp32):
        model.config._attn_implementation = "eager"
        t = LayerTaps(ids, int(model.config.num_hidden_layers))
        with torch.no_grad(), t.capture(model):
            taps.append(t.select(model(x, output_hidden_states=True).hidden_states)[:, :window + 2].float())
    d = taps[0].shape[-1] // len(ids)
    own = [tol.measure(taps[0][..., j * d:(j + 1) * d], taps[1][..., j * d:(j + 1) * d], [i + 1]).worst_row
           for j, i in enumerate(ids)]
    line = next(c.detail for c in report.checks if c.name.startswith("prefill chunk 1 taps"))
    stated = [float(x) for x in re.search(r"\(limit ([^)]*)\)", line).group(1).split("/")]
    assert stated == pytest.approx([max(GEMMA4_ROW_RMS, OWN_ROUNDING_FACTOR * e) for e in own], rel=0.05, abs=0.05), \
        (line, own)

    unrounded = [c for c in report.checks if c.name.startswith("unrounded")]  # the graph in fp32 arithmetic
    assert len(unrounded) == 7 and all(c.ok for c in unrounded)
    stats = [float(x) for c in unrounded for x in re.search(r"worst row rms\|Δ\| ([^·]*)·", c.detail).group(1).split("/")]
    assert max(stats) < 0.01 * UNROUNDED_ROW_RMS  # summation order only: far inside its bound

    shifted = validate_gemma4_target_onnx(path, half, [0, 2, 3], reference_fp32=fp32, raise_on_failure=False)
    assert not shifted.ok and all(c.ok for c in shifted.checks if "taps" not in c.name)
    assert all(not c.ok for c in shifted.checks if c.name.startswith("unrounded") and "taps" in c.name)
    half.config.sliding_window = fp32.config.sliding_window = 12  # both references attend further back
    window_12 = validate_gemma4_target_onnx(path, half, ids, reference_fp32=fp32, raise_on_failure=False)
    assert not window_12.ok and not all(c.ok for c in window_12.checks if c.name.startswith("unrounded"))
    half.config.sliding_window = window
    small = validate_gemma4_target_onnx(path, half, ids, reference_fp32=lambda: load(torch.float32), available=0,
                                        raise_on_failure=False)
    assert small.ok and "own rounding not measured" in small.title and f"(limit {GEMMA4_ROW_RMS:g}/" in small.lines()[2]
    assert not any(c.name.startswith("unrounded") for c in small.checks)


def test_the_fp32_reference_holds_the_graphs_weights_and_embedding_scale():
    """``_round_like``: an fp32 model's weights rounded to bf16 (kept fp32) are the bf16 model's, upcast, and so is
    its embedding scale, which transformers casts to the weight dtype where it is used (√48 = 6.93 → 6.94 in bf16)."""
    import copy

    from dspark_trt.export.gemma4_target_onnx import _round_like

    fp32 = tiny_gemma4(hidden_size=48)
    half = copy.deepcopy(fp32).to(torch.bfloat16)
    names = {n for n, t in half.state_dict().items() if t.dtype == torch.bfloat16}
    _round_like(fp32, names, torch.bfloat16)
    for name, tensor in half.state_dict().items():
        assert torch.equal(fp32.state_dict()[name], tensor.float()), name
    scale = fp32.model.embed_tokens.embed_scale
    assert scale.dtype == torch.float32 and float(scale) == float(torch.tensor(48 ** 0.5).to(torch.bfloat16)) != 48 ** 0.5
    ids = torch.randint(0, 300, (1, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # the scaled embeddings now agree to the bf16 model's values, exactly
        assert torch.equal(fp32.model.embed_tokens(ids).to(torch.bfloat16), half.model.embed_tokens(ids))


def test_a_widened_bound_keeps_its_tail_in_proportion():
    from dspark_trt.export.validate_target import RoundingTolerance

    tol = RoundingTolerance("bf16", "r", row_rms=30.0, row_tail=300.0)
    assert tol.widened(10.0, 2 ** 0.5) == tol  # the model's own error under c: c stays
    wide = tol.widened(100.0, 2 ** 0.5)
    assert wide.row_rms == pytest.approx(141.42, rel=1e-4) and wide.row_tail / wide.row_rms == pytest.approx(10.0)


def test_the_ring_keeps_each_requests_last_tokens_past_its_padding():
    """Right-padded rows: a row whose real tokens end early keeps them, though the batch writes more than a ring."""
    from dspark_trt.runtime.targets.gemma4 import RingCache

    ring = RingCache(num_layers=1, kv_heads=1, head_dim=1, ring=4, dtype=torch.float32, device=torch.device("cpu"))
    ring.ensure(2)
    positions = torch.arange(10).expand(2, 10)
    valid = positions < torch.tensor([[10], [3]])  # row 1: 3 real tokens, then padding
    values = positions.float().view(1, 2, 1, 10, 1)
    ring.write(values, values, positions, valid)
    assert sorted(ring.pos[0].tolist()) == [6, 7, 8, 9] and sorted(ring.pos[1].tolist()) == [-1, 0, 1, 2]
    assert torch.equal(ring.k[0, :, 0, :, 0], ring.pos.clamp_min(0).float() * (ring.pos >= 0))
    assert ring.positions(torch.tensor([8, 2]))[0].tolist().count(-1) == 2  # slots at/after the first new token
    ring.ensure(3)  # a padded bucket of rows (TensorRT): an empty row after the running ones
    assert ring.pos[2].tolist() == [-1] * 4 and ring.positions(torch.tensor([8, 2])).shape == (2, 4)
    kept = ring.pos[0].clone()
    ring.ensure(1)  # a smaller bucket: the first row kept, as the global cache keeps it
    assert ring.batch == 1 and torch.equal(ring.pos[0], kept) and ring.k.is_contiguous()

