"""The Gemma-4 text target: its graph == transformers (logits, taps, new K/V) at prompts longer than the sliding
window, with KV sharing and per-layer inputs; through dspark-export (validated against transformers, the sliding
layers fed only their ring) and the runtime: greedy speculative == the target alone == transformers' generate."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dspark_trt.errors import DSparkTrtError

pytestmark = pytest.mark.usefixtures("one_thread")

GEMMA = dict(hidden_size=64, intermediate_size=96, head_dim=16, global_head_dim=32, num_attention_heads=4,
             num_key_value_heads=2, sliding_window=8)


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


@pytest.fixture(scope="module")
def gemma_export(tmp_path_factory):
    """A tiny Gemma-4 target (6 layers, window 8) and a Qwen3-layer drafter of its width, through dspark-export."""
    from dspark_trt.export.pipeline import ExportOptions, export_model
    from dspark_trt.synthetic.preset_checkpoint import write_preset
    from dspark_trt.synthetic.presets import get_preset, scaled

    work = tmp_path_factory.mktemp("gemma4")
    write_preset("gemma4_12b", work / "target", layers=6, vocab=600, dtype="fp32", **GEMMA)
    drafter = scaled(get_preset("dspark_qwen3_8b_block7"), layers=1, target_layers=6, vocab=600,
                     **{k: v for k, v in GEMMA.items() if k not in ("global_head_dim", "sliding_window")})
    write_preset(dataclasses.replace(drafter, target_layer_ids=(1, 3, 4)), work / "drafter", dtype="fp32")
    result = export_model(work / "drafter", work / "export", ExportOptions(topk=8, dtype="fp32", engine="none",
                                                                           max_context=256), target_dir=work / "target")
    return work, result


@pytest.mark.onnx
def test_the_export_is_validated_against_transformers_past_the_window(gemma_export):
    _, result = gemma_export
    target = result.manifest["target"]
    assert target["kv_interface"] == "gemma4-windowed-v1" and target["architecture"] == "Gemma4ForCausalLM"
    assert target["gemma4"]["global_layers"] == [5] and target["gemma4"]["sliding_layers"] == [0, 1, 2, 3, 4]
    lines = target["validation"]
    assert "sliding window 8" in lines[0] and all(line.strip().startswith("ok") for line in lines[1:])
    assert any("held only their ring" in line for line in lines)


@pytest.mark.onnx
def test_greedy_speculative_equals_the_target_alone_and_transformers(gemma_export):
    import transformers

    from dspark_trt.runtime import SpeculativeDecoder

    work, _ = gemma_export
    dec = SpeculativeDecoder.from_export(work / "export")
    assert type(dec.target).__name__ == "Gemma4OnnxRuntimeTarget"
    gen = torch.Generator().manual_seed(3)
    # 150 tokens: longer than the window (8) and the sliding layers' ring (71); a padded batch of three
    prompts = [torch.randint(0, 600, (n,), generator=gen).tolist() for n in (150, 21, 3)]
    spec = dec.generate(prompts, 10, eos_token_id=[])
    alone = dec.generate(prompts, 10, eos_token_id=[], draft=False)
    assert spec.tokens == alone.tokens and spec.stats.rounds >= 5  # rounds that roll rejected tokens back
    ring = dec.target.cache.slid
    assert ring.k.shape[3] == ring.ring == 8 - 1 + 64 < 150  # the sliding layers hold their ring, not the context
    model = transformers.AutoModelForCausalLM.from_pretrained(work / "target", dtype=torch.float32)
    for p, got in zip(prompts, alone.tokens):
        out = model.generate(torch.tensor([p]), max_new_tokens=10, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert out[0, len(p):].tolist() == got


@pytest.mark.onnx
def test_the_validation_fails_against_another_window(gemma_export):
    import transformers

    from dspark_trt.export.gemma4_target_onnx import validate_gemma4_target_onnx

    work, _ = gemma_export
    model = transformers.AutoModelForCausalLM.from_pretrained(work / "target", dtype=torch.float32)
    model.config.sliding_window = 12  # the reference attends further back than the exported graph (8)
    report = validate_gemma4_target_onnx(work / "export" / "onnx" / "target.onnx", model, [1, 3, 4],
                                         raise_on_failure=False)
    assert not report.ok


def test_half_precision_gemma4_targets_and_moe_are_refused_in_one_line(tmp_path):
    from dspark_trt.export.pipeline import TargetForExport
    from dspark_trt.export.target_graph import check_architecture

    target = TargetForExport(None, tmp_path, {"architectures": ["Gemma4ForCausalLM"]}, dtype="bf16", max_context=64,
                             validate=True)
    with pytest.raises(DSparkTrtError) as e:
        target(tmp_path)
    assert "fp32 only" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(DSparkTrtError, match="MoE"):
        check_architecture({"architectures": ["Gemma4ForCausalLM"], "enable_moe_block": True})
    with pytest.raises(DSparkTrtError, match="multimodal Gemma-4"):
        check_architecture({"architectures": ["Gemma4ForConditionalGeneration"]})


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

