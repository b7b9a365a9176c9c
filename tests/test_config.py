"""DSparkConfig: both checkpoint formats, layer-id conventions, unsupported options."""

from __future__ import annotations

import json

import pytest

from dspark_trt.config import DSparkConfig, deepseek_ids_from_capture_ids, hf_hidden_state_indices
from dspark_trt.errors import DSparkTrtError

QWEN3_8B_DSPARK = {  # the published keys of deepseek-ai/dspark_qwen3_8b_block7 (docs/dspark.md §3.1)
    "architectures": ["Qwen3DSparkModel"],
    "model_type": "qwen3",
    "block_size": 7,
    "mask_token_id": 151669,
    "target_layer_ids": [1, 9, 17, 25, 33],
    "num_target_layers": 36,
    "num_hidden_layers": 5,
    "layer_types": ["full_attention"] * 5,
    "markov_rank": 256,
    "markov_head_type": "vanilla",
    "enable_confidence_head": True,
    "confidence_head_with_markov": True,
    "num_anchors": 512,
    "tie_word_embeddings": False,
    "vocab_size": 151936,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "attention_bias": False,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
}


def speculators_version(raw: dict) -> dict:
    layer = {k: raw[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                                 "num_key_value_heads", "head_dim", "rms_norm_eps", "attention_bias")}
    layer.update(model_type="qwen3", num_hidden_layers=raw["num_hidden_layers"],
                 rope_parameters={"rope_theta": raw["rope_theta"], "rope_type": "default"})
    return {
        "speculators_model_type": "dspark",
        "architectures": ["DSparkDraftModel"],
        "transformer_layer_config": layer,
        "draft_vocab_size": raw["vocab_size"],
        "block_size": raw["block_size"],
        "aux_hidden_state_layer_ids": [i + 1 for i in raw["target_layer_ids"]],
        "mask_token_id": raw["mask_token_id"],
        "sample_from_anchor": True,
        "markov_rank": raw["markov_rank"],
        "markov_head_type": "vanilla",
        "enable_confidence_head": True,
        "confidence_head_with_markov": True,
        "num_target_layers": raw["num_target_layers"],
    }


def test_deepseek_config_with_absent_keys_defaults():
    c = DSparkConfig.from_dict(QWEN3_8B_DSPARK)
    assert (c.block_size, c.num_draft_tokens, c.markov_rank, c.mask_token_id) == (7, 7, 256, 151669)
    assert c.target_layer_ids == (1, 9, 17, 25, 33) and c.num_taps == 5
    assert c.draft_vocab_size == c.vocab_size == 151936 and not c.has_reduced_vocab
    assert c.logit_scale == 1.0 and c.sample_from_anchor is True and c.rope_theta == 1e6
    assert c.confidence_input_size == 4096 + 256


def test_speculators_config_normalises_to_the_same_fields():
    deepseek = DSparkConfig.from_dict(QWEN3_8B_DSPARK)
    spec = DSparkConfig.from_dict(speculators_version(QWEN3_8B_DSPARK))
    assert spec.source_format == "speculators"
    assert spec.replace(source_format="deepseek") == deepseek
    assert spec.target_layer_ids == (1, 9, 17, 25, 33)  # aux capture ids [2, 10, ...] minus one


def test_layer_id_conventions():
    ds = [1, 9, 17, 25, 33]
    assert hf_hidden_state_indices(ds) == [2, 10, 18, 26, 34]  # output_hidden_states indices
    assert deepseek_ids_from_capture_ids([2, 10, 18, 26, 34]) == ds  # speculators / vLLM capture ids
    c = DSparkConfig.from_dict(QWEN3_8B_DSPARK)
    assert c.hf_hidden_state_indices == [2, 10, 18, 26, 34]


def test_tapping_beyond_the_last_target_layer_is_refused():
    c = DSparkConfig.from_dict({**QWEN3_8B_DSPARK, "target_layer_ids": [1, 9, 36]})
    with pytest.raises(DSparkTrtError, match=r"\[36\] outside \[-1, 35\]"):
        c.check_target_layers(36)
    c.replace(target_layer_ids=(-1, 35)).check_target_layers(36)  # embeddings and the last layer (pre-norm) are fine


def test_dspark_target_layer_ids_is_accepted():
    raw = {k: v for k, v in QWEN3_8B_DSPARK.items() if k != "target_layer_ids"}
    assert DSparkConfig.from_dict({**raw, "dspark_target_layer_ids": [2, 4, 6]}).target_layer_ids == (2, 4, 6)


@pytest.mark.parametrize("head", ["gated", "rnn", "GATED"])
def test_the_three_markov_heads_are_read(head):
    config = DSparkConfig.from_dict({**QWEN3_8B_DSPARK, "markov_head_type": head})
    assert config.markov_head_type == head.lower()
    assert config.digest() != DSparkConfig.from_dict(QWEN3_8B_DSPARK).digest()


@pytest.mark.parametrize("head", ["lstm", 3])
def test_unknown_markov_heads_are_refused(head):
    with pytest.raises(DSparkTrtError, match="markov_head_type.*(is not supported|must be a string)"):
        DSparkConfig.from_dict({**QWEN3_8B_DSPARK, "markov_head_type": head})


def test_rope_parameters_form_and_unsupported_rope():
    raw = {k: v for k, v in QWEN3_8B_DSPARK.items() if k != "rope_theta"}
    assert DSparkConfig.from_dict({**raw, "rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}}).rope_theta == 5e5
    with pytest.raises(DSparkTrtError, match="rope_type 'yarn' is not supported"):
        DSparkConfig.from_dict({**raw, "rope_parameters": {"rope_theta": 5e5, "rope_type": "yarn"}})


def test_bonus_anchor_layout_drafts_block_size_minus_one():
    c = DSparkConfig.from_dict({**QWEN3_8B_DSPARK, "sample_from_anchor": False, "block_size": 8})
    assert c.num_draft_tokens == 7


def test_vllm_topk_alias_and_logit_scale():
    c = DSparkConfig.from_dict({**QWEN3_8B_DSPARK, "dspark_draft_topk": 512, "logit_scale": 0.5})
    assert c.draft_topk == 512 and c.logit_scale == 0.5


@pytest.mark.parametrize("change, message", [
    ({"mask_token_id": 151936}, "mask_token_id 151936 is outside the vocabulary"),
    ({"num_attention_heads": 30}, "not a multiple of num_key_value_heads"),
    ({"draft_vocab_size": 200000}, "exceeds vocab_size"),
    ({"markov_rank": 0}, "markov_rank must be >= 1"),
    ({"target_layer_ids": []}, "target_layer_ids is empty"),
    ({"draft_markov_topm": -1}, "draft_markov_topm -1 must be in"),
])
def test_inconsistent_configs_are_refused(change, message):
    with pytest.raises(DSparkTrtError, match=message):
        DSparkConfig.from_dict({**QWEN3_8B_DSPARK, **change})


def test_not_a_dspark_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "vocab_size": 10}))
    with pytest.raises(DSparkTrtError, match="not a DSpark config"):
        DSparkConfig.from_pretrained(tmp_path)
    with pytest.raises(DSparkTrtError, match="does not exist"):
        DSparkConfig.from_pretrained(tmp_path / "missing")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(DSparkTrtError, match="cannot read"):
        DSparkConfig.from_pretrained(tmp_path)


def test_missing_required_key_is_named():
    raw = {k: v for k, v in QWEN3_8B_DSPARK.items() if k != "mask_token_id"}
    with pytest.raises(DSparkTrtError, match="missing required key 'mask_token_id'"):
        DSparkConfig.from_dict(raw)


def test_digest_is_stable_and_sensitive():
    a = DSparkConfig.from_dict(QWEN3_8B_DSPARK)
    assert a.digest() == DSparkConfig.from_dict(dict(QWEN3_8B_DSPARK)).digest()
    assert a.digest() != a.replace(logit_scale=0.5).digest()
    assert a.digest() != a.replace(draft_markov_topm=8).digest()


def test_draft_markov_topm_is_read_and_absent_means_zero():
    import dataclasses
    import hashlib

    a = DSparkConfig.from_dict(QWEN3_8B_DSPARK)
    assert a.draft_markov_topm == 0
    assert DSparkConfig.from_dict({**QWEN3_8B_DSPARK, "draft_markov_topm": 32}).draft_markov_topm == 32
    # the field came later: a config without a union keeps the digest it had before (export manifests); so did the
    # Gemma-4 layer fields, which a Qwen3 drafter leaves at their defaults
    later = ("draft_markov_topm", "layer_family", "partial_rotary_factor", "final_logit_softcapping",
             "attention_k_eq_v")
    before = {k: v for k, v in dataclasses.asdict(a).items() if k not in later}
    assert a.digest() == hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()


# -- attention pattern inside the block and hidden_act ---------------------------------------------------------
def speculators_with(layer_keys: dict, **top) -> dict:
    raw = speculators_version(QWEN3_8B_DSPARK)
    raw["transformer_layer_config"].update(layer_keys)
    raw.update(top)
    return raw


TRAINING_CLI_DEFAULTS = {  # what speculators' training CLI writes by default (5 draft layers here)
    "layer_types": ["sliding_attention"] * 5, "use_sliding_window": True, "sliding_window": 2048,
    "hidden_act": "silu", "max_window_layers": 28,
}


def test_speculators_training_defaults_are_causal_and_windowed():
    c = DSparkConfig.from_dict(speculators_with(TRAINING_CLI_DEFAULTS, sliding_window_non_causal=False))
    assert [c.layer_attention(i) for i in range(5)] == [(2048, True)] * 5
    assert not c.bidirectional_full_attention
    assert (c.hidden_act, c.sliding_window, c.sliding_window_non_causal) == ("silu", 2048, False)
    absent = speculators_with(TRAINING_CLI_DEFAULTS)  # sliding_window_non_causal absent: speculators' default
    assert DSparkConfig.from_dict(absent) == c


def test_deepseek_published_config_is_bidirectional_and_full():
    c = DSparkConfig.from_dict(QWEN3_8B_DSPARK)
    assert c.bidirectional_full_attention and c.layer_types == ("full_attention",) * 5
    assert [c.layer_attention(i) for i in range(5)] == [(None, False)] * 5


@pytest.mark.parametrize("keys, top, expect", [
    # per-layer layer_types (speculators' --full-attention-indices)
    ({**TRAINING_CLI_DEFAULTS, "layer_types": ["full_attention", "sliding_attention"] * 2 + ["full_attention"]}, {},
     [(None, False), (2048, True)] * 2 + [(None, False)]),
    # sliding_window_non_causal: windowed but bidirectional inside the block
    (TRAINING_CLI_DEFAULTS, {"sliding_window_non_causal": True}, [(2048, False)] * 5),
    # use_sliding_window false (or absent, Qwen3Config's default): sliding_attention layers attend fully
    ({**TRAINING_CLI_DEFAULTS, "use_sliding_window": False}, {}, [(None, False)] * 5),
    ({k: v for k, v in TRAINING_CLI_DEFAULTS.items() if k != "use_sliding_window"}, {}, [(None, False)] * 5),
    # sliding_window absent: Qwen3Config's 4096; null: windows off
    ({k: v for k, v in TRAINING_CLI_DEFAULTS.items() if k != "sliding_window"}, {}, [(4096, True)] * 5),
    ({**TRAINING_CLI_DEFAULTS, "sliding_window": None}, {}, [(None, False)] * 5),
    # layer_types absent: Qwen3Config derives it, sliding from layer max_window_layers on
    ({"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 3}, {},
     [(None, False)] * 3 + [(64, True)] * 2),
    ({"use_sliding_window": True, "sliding_window": 64}, {}, [(None, False)] * 5),  # default max_window_layers 28
], ids=["mixed", "non-causal", "use-false", "use-absent", "window-absent", "window-null", "derived", "derived-28"])
def test_each_attention_key_is_honoured(keys, top, expect):
    c = DSparkConfig.from_dict(speculators_with(keys, **top))
    assert [c.layer_attention(i) for i in range(5)] == expect


def test_deepseek_format_reads_the_same_keys_at_top_level():
    raw = {**QWEN3_8B_DSPARK, **TRAINING_CLI_DEFAULTS, "sliding_window_non_causal": True}
    c = DSparkConfig.from_dict(raw)
    assert [c.layer_attention(i) for i in range(5)] == [(2048, False)] * 5
    assert DSparkConfig.from_dict({**QWEN3_8B_DSPARK, "use_sliding_window": False, "sliding_window": None}) == \
        DSparkConfig.from_dict(QWEN3_8B_DSPARK)  # a Qwen3 target's copied keys change nothing


WHERE = "config:transformer_layer_config"


@pytest.mark.parametrize("keys, message", [
    ({"hidden_act": "gelu"}, f"{WHERE}: hidden_act 'gelu' is not supported: dspark-trt implements the silu MLP of "
                             f"Qwen3 draft layers; use a drafter trained with hidden_act 'silu'"),
    ({"layer_types": ["full_attention", "linear_attention", "chunked_attention", "full_attention",
                      "full_attention"]},
     f"{WHERE}: layer_types ['chunked_attention', 'linear_attention'] are not supported: dspark-trt implements "
     f"'full_attention' and 'sliding_attention' draft layers only"),
    ({"layer_types": ["full_attention"] * 4},
     f"{WHERE}: layer_types lists 4 layers but num_hidden_layers is 5; fix the checkpoint's config.json"),
    ({"use_sliding_window": True, "sliding_window": 0},
     f"{WHERE}: sliding_window must be >= 1 (or use_sliding_window false), got 0"),
    ({"layer_types": "sliding_attention"},
     f"{WHERE}: layer_types must be a list of strings, got 'sliding_attention'"),
], ids=["hidden-act", "layer-type", "layer-count", "window-0", "not-a-list"])
def test_unsupported_attention_and_activation_are_refused_in_one_line(keys, message):
    with pytest.raises(DSparkTrtError) as e:
        DSparkConfig.from_dict(speculators_with(keys))
    assert str(e.value) == message


def test_hidden_act_default_and_direct_construction():
    assert DSparkConfig.from_dict(QWEN3_8B_DSPARK).hidden_act == "silu"  # absent: Qwen3's silu
    c = DSparkConfig.from_dict(QWEN3_8B_DSPARK)
    with pytest.raises(DSparkTrtError, match="hidden_act 'relu' is not supported"):
        c.replace(hidden_act="relu")
    with pytest.raises(DSparkTrtError, match="layer_types lists 2 layers"):
        c.replace(layer_types=("full_attention",) * 2)
    assert c.digest() != c.replace(layer_types=("sliding_attention",) * 5, sliding_window=8).digest()


# -- DeepSpec's Gemma-4 drafter (Gemma4DSparkModel) -------------------------------------------------------------
def gemma4_drafter_config(**changes) -> dict:
    """DeepSpec's ``build_draft_config`` output for the 12B preset (the target's text config, overridden)."""
    from dspark_trt.synthetic.presets import get_preset

    raw = get_preset("dspark_gemma4_12b_block7").config_json("bf16")
    raw.update(changes)
    return raw


def test_a_gemma4_drafter_config_normalises_to_its_draft_layers():
    c = DSparkConfig.from_dict(gemma4_drafter_config())
    assert c.layer_family == "gemma4" and c.hidden_act == "gelu_pytorch_tanh"
    assert (c.head_dim, c.num_attention_heads, c.num_key_value_heads) == (512, 16, 8)  # global_head_dim, not 256
    assert (c.rope_theta, c.partial_rotary_factor) == (1_000_000.0, 0.25)  # the full_attention RoPE, proportional
    assert c.final_logit_softcapping == 30.0 and c.embed_scale == 3840 ** 0.5
    assert (c.block_size, c.num_draft_tokens, c.mask_token_id, c.markov_rank) == (7, 7, 4, 256)
    assert c.target_layer_ids == (5, 17, 29, 41, 46) and c.num_target_layers == 48
    assert c.confidence_head_with_markov and c.bidirectional_full_attention and c.context_window is None
    assert c.digest() != DSparkConfig.from_dict(gemma4_drafter_config(final_logit_softcapping=None)).digest()


def test_a_qwen3_config_keeps_qwen3s_scale_and_refuses_gemma4_features():
    c = DSparkConfig.from_dict(QWEN3_8B_DSPARK)
    assert c.layer_family == "qwen3" and c.embed_scale is None
    with pytest.raises(DSparkTrtError, match="Gemma-4 draft layer features"):
        c.replace(final_logit_softcapping=30.0)


def test_gemma4_k_eq_v_reads_the_global_kv_heads():
    c = DSparkConfig.from_dict(gemma4_drafter_config(attention_k_eq_v=True, num_global_key_value_heads=2))
    assert c.attention_k_eq_v and c.num_key_value_heads == 2
    with pytest.raises(DSparkTrtError, match="num_global_key_value_heads"):
        DSparkConfig.from_dict(gemma4_drafter_config(attention_k_eq_v=True, num_global_key_value_heads=None))


def test_gemma4_rope_defaults_to_transformers_full_attention_rope():
    raw = gemma4_drafter_config()
    del raw["rope_parameters"]
    c = DSparkConfig.from_dict(raw)
    assert (c.rope_theta, c.partial_rotary_factor) == (1_000_000.0, 0.25)
    c = DSparkConfig.from_dict(gemma4_drafter_config(rope_parameters={"full_attention": {
        "rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 0.5}}))
    assert (c.rope_theta, c.partial_rotary_factor) == (5e5, 1.0)  # default RoPE turns every pair


@pytest.mark.parametrize("changes, words", [
    (dict(enable_moe_block=True), "MoE blocks"),
    (dict(hidden_size_per_layer_input=256), "per-layer inputs"),
    (dict(layer_types=["full_attention", "sliding_attention", "full_attention", "full_attention",
                       "full_attention"]), "not all 'full_attention'"),
    (dict(hidden_activation="relu"), "GELU-tanh"),
    (dict(rope_parameters={"full_attention": {"rope_type": "yarn", "rope_theta": 1e6}}), "rope_type 'yarn'"),
    (dict(rope_parameters={"full_attention": {"rope_type": "proportional", "factor": 8.0}}), "RoPE factor"),
    (dict(use_double_wide_mlp=True, num_kv_shared_layers=2), "use_double_wide_mlp"),
    (dict(attention_bias=True), "attention_bias"),
    (dict(global_head_dim=None), "global_head_dim"),
    (dict(final_logit_softcapping=-1.0), "final_logit_softcapping"),
], ids=["moe", "per-layer-inputs", "sliding", "relu", "yarn", "rope-factor", "double-wide", "bias", "no-global-head",
        "negative-cap"])
def test_unsupported_gemma4_drafters_are_refused_in_one_line(changes, words):
    with pytest.raises(DSparkTrtError) as e:
        DSparkConfig.from_dict(gemma4_drafter_config(**changes), where="config.json")
    assert words in str(e.value) and "\n" not in str(e.value)
