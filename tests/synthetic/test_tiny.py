"""Tiny checkpoint pairs: both formats load to the same drafter, determinism, real structure, atomicity."""

from __future__ import annotations

import json

import pytest
import torch

from dspark_trt import load_drafter
from dspark_trt.errors import DSparkTrtError
from dspark_trt.synthetic import write_tiny_checkpoint

SMALL = dict(vocab_size=300, hidden_size=32, intermediate_size=48, head_dim=8, markov_rank=8)


def outputs(drafter_dir, target_dir=None):
    model = load_drafter(drafter_dir, target_dir=target_dir)
    c = model.config
    gen = torch.Generator().manual_seed(0)
    taps = torch.randn(2, 6, c.num_taps * c.hidden_size, generator=gen)
    k, v = model.context_kv(taps, torch.arange(6).expand(2, 6))
    res = model.draft(torch.tensor([5, 7]), k, v, torch.tensor([6, 4]), topk=16, temperature=torch.tensor([0.0, 1.0]),
                      seed=torch.tensor([1, 2]))
    return model.config, res


@pytest.mark.parametrize("draft_vocab_size", [None, 120], ids=["full-vocab", "reduced-vocab"])
def test_same_seed_in_both_formats_loads_to_identical_outputs(tmp_path, draft_vocab_size):
    ds = write_tiny_checkpoint(tmp_path / "ds", format="deepseek", draft_vocab_size=draft_vocab_size, **SMALL)
    sp = write_tiny_checkpoint(tmp_path / "sp", format="speculators", draft_vocab_size=draft_vocab_size, **SMALL)
    assert "speculators_model_type" in json.loads((sp.drafter / "config.json").read_text())
    c_ds, r_ds = outputs(ds.drafter)
    c_sp, r_sp = outputs(sp.drafter, sp.target)
    assert c_sp.source_format == "speculators" and c_sp.replace(source_format="deepseek") == c_ds
    assert torch.equal(r_ds.tokens, r_sp.tokens) and torch.equal(r_ds.cand_logits, r_sp.cand_logits)
    assert torch.equal(r_ds.confidence, r_sp.confidence)


def test_speculators_format_needs_the_target_for_shared_weights(tmp_path):
    sp = write_tiny_checkpoint(tmp_path / "sp", format="speculators", **SMALL)
    config = sp.drafter / "config.json"
    raw = json.loads(config.read_text())
    raw["speculators_config"]["verifier"]["name_or_path"] = "Qwen/Qwen3-8B"  # a Hub id: no local default target
    config.write_text(json.dumps(raw))
    with pytest.raises(DSparkTrtError, match="embed_tokens.weight is absent"):
        load_drafter(sp.drafter)


@pytest.mark.parametrize("attention", [
    {},
    {"layer_types": ("sliding_attention", "full_attention"), "sliding_window": 4},
    {"layer_types": ("sliding_attention", "sliding_attention"), "sliding_window": 2, "sliding_window_non_causal": True},
], ids=["full", "causal-windowed-mixed", "non-causal-windowed"])
def test_attention_options_round_trip_in_both_formats(tmp_path, attention):
    ds = write_tiny_checkpoint(tmp_path / "ds", format="deepseek", **SMALL, **attention)
    sp = write_tiny_checkpoint(tmp_path / "sp", format="speculators", **SMALL, **attention)
    c_ds, r_ds = outputs(ds.drafter)
    c_sp, r_sp = outputs(sp.drafter, sp.target)
    assert c_sp.replace(source_format="deepseek") == c_ds
    assert (c_ds.layer_types, c_ds.sliding_window) == (attention.get("layer_types", ("full_attention",) * 2),
                                                       attention.get("sliding_window"))
    assert torch.equal(r_ds.cand_logits, r_sp.cand_logits)
    layer = json.loads((sp.drafter / "config.json").read_text())["transformer_layer_config"]
    assert layer["use_sliding_window"] == ("sliding_window" in attention)  # as speculators' training CLI writes


def test_seed_is_the_only_source_of_randomness(tmp_path):
    a = write_tiny_checkpoint(tmp_path / "a", seed=3, **SMALL)
    b = write_tiny_checkpoint(tmp_path / "b", seed=3, **SMALL)
    c = write_tiny_checkpoint(tmp_path / "c", seed=4, **SMALL)
    for part in ("drafter", "target"):
        assert (getattr(a, part) / "model.safetensors").read_bytes() == (getattr(b, part) / "model.safetensors").read_bytes()
        assert (getattr(a, part) / "model.safetensors").read_bytes() != (getattr(c, part) / "model.safetensors").read_bytes()


def test_defaults_exercise_the_real_structure(tiny_pair):
    model = load_drafter(tiny_pair.drafter, target_dir=tiny_pair.target)
    c = model.config
    assert c.vocab_size >= 2048 and c.draft_vocab_size >= 512  # room for --topk 512
    assert c.num_hidden_layers >= 2 and c.num_taps >= 3
    assert c.num_key_value_heads < c.num_attention_heads  # GQA
    assert c.num_target_layers - 1 not in c.target_layer_ids


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_target_is_a_transformers_causal_lm_with_the_tapped_layers(tmp_path, family):
    transformers = pytest.importorskip("transformers")
    pair = write_tiny_checkpoint(tmp_path / family, target_family=family, **SMALL)
    target = transformers.AutoModelForCausalLM.from_pretrained(pair.target)
    config = load_drafter(pair.drafter, target_dir=pair.target).config
    out = target(torch.tensor([[1, 2, 3]]), output_hidden_states=True)
    taps = torch.cat([out.hidden_states[i] for i in config.hf_hidden_state_indices], dim=-1)
    assert taps.shape == (1, 3, config.num_taps * config.hidden_size)
    assert torch.equal(target.get_input_embeddings().weight, load_drafter(pair.drafter).embed_tokens.weight)


def test_existing_output_is_kept_unless_forced(tmp_path):
    out = tmp_path / "pair"
    write_tiny_checkpoint(out, seed=1, **SMALL)
    before = (out / "drafter" / "model.safetensors").read_bytes()
    with pytest.raises(DSparkTrtError, match="holds an earlier output; pass --force"):
        write_tiny_checkpoint(out, seed=2, **SMALL)
    assert (out / "drafter" / "model.safetensors").read_bytes() == before
    write_tiny_checkpoint(out, seed=2, force=True, **SMALL)
    assert (out / "drafter" / "model.safetensors").read_bytes() != before
    assert [p.name for p in tmp_path.iterdir()] == ["pair"]  # no temporary directories left behind


def test_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    from dspark_trt.synthetic import tiny

    def crash(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(tiny, "_write_drafter", crash)  # fails after the target was written
    with pytest.raises(RuntimeError, match="disk full"):
        write_tiny_checkpoint(tmp_path / "bad", **SMALL)
    assert list(tmp_path.iterdir()) == []


def test_invalid_options_are_refused_before_writing(tmp_path):
    with pytest.raises(DSparkTrtError, match="not a multiple of num_key_value_heads"):
        write_tiny_checkpoint(tmp_path / "bad", num_attention_heads=3, num_key_value_heads=2)
    assert list(tmp_path.iterdir()) == []
