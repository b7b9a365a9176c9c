"""Checkpoint presets: the published parameter counts, the release's sharding, scaling within a shape family."""

from __future__ import annotations

import pytest

from dspark_trt.checkpoint import check_checkpoint
from dspark_trt.config import DSparkConfig
from dspark_trt.errors import DSparkTrtError
from dspark_trt.synthetic.preset_checkpoint import plan_preset
from dspark_trt.synthetic.presets import (PRESETS, drafter_parameter_formula, drafter_tensor_shapes, get_preset,
                                        parameter_count, scaled, spread_layer_ids, target_parameter_formula,
                                        target_tensor_shapes)
from dspark_trt.synthetic.safetensors_stream import plan_shards, shard_names


def test_dspark_qwen3_8b_block7_has_the_published_shapes_and_2_37_b_parameters():
    p = get_preset("dspark_qwen3_8b_block7")
    c = p.config()
    assert (c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads,
            c.head_dim, c.vocab_size, c.markov_rank, c.block_size, c.mask_token_id) == (
        5, 4096, 12288, 32, 8, 128, 151936, 256, 7, 151669)
    assert c.target_layer_ids == (1, 9, 17, 25, 33) and c.num_target_layers == 36
    shapes = drafter_tensor_shapes(p, "deepseek")
    assert {"embed_tokens.weight", "lm_head.weight"} <= set(shapes)
    n = parameter_count(shapes)
    assert n == drafter_parameter_formula(p, "deepseek") == 2_371_081_729
    assert round(n / 1e9, 2) == 2.37 and round(2 * n / 1e9, 2) == 4.74  # bf16 bytes
    speculators = drafter_tensor_shapes(p, "speculators")
    assert set(shapes) - set(speculators) == {"embed_tokens.weight", "lm_head.weight"}
    assert parameter_count(speculators) == drafter_parameter_formula(p, "speculators") == n - 2 * 151936 * 4096
    assert check_checkpoint(c, {k: (list(v), "BF16") for k, v in shapes.items()}) == []


def test_qwen3_8b_has_8_19_b_parameters_in_five_shards_like_the_release():
    t = get_preset("qwen3_8b")
    shapes = target_tensor_shapes(t)
    n = parameter_count(shapes)
    assert n == target_parameter_formula(t) == 8_190_735_360 and round(2 * n / 1e9, 2) == 16.38
    assert list(shapes)[0] == "model.embed_tokens.weight" and list(shapes)[-1] == "lm_head.weight"
    assert len(shapes) == 2 + 36 * 11 + 1
    (planned,) = plan_preset("qwen3_8b")
    shards = plan_shards(planned.tensors, planned.shard_bytes)
    assert shard_names(len(shards))[-1] == "model-00005-of-00005.safetensors"
    assert [round(sum(p.nbytes for p in s) / 1e9, 2) for s in shards] == [4.0, 3.99, 3.96, 3.19, 1.24]
    config = t.config_json("bf16")
    assert {k: config[k] for k in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                                   "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings", "rope_theta",
                                   "rms_norm_eps", "max_position_embeddings", "torch_dtype")} == {
        "num_hidden_layers": 36, "hidden_size": 4096, "intermediate_size": 12288, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": False,
        "rope_theta": 1e6, "rms_norm_eps": 1e-6, "max_position_embeddings": 40960, "torch_dtype": "bfloat16"}


def test_the_target_config_reads_in_transformers_as_qwen3_8b():
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(**get_preset("qwen3_8b").config_json("bf16"))
    assert type(cfg).__name__ == "Qwen3Config"
    assert (cfg.num_hidden_layers, cfg.head_dim, cfg.num_key_value_heads, cfg.vocab_size) == (36, 128, 8, 151936)


def test_spread_layer_ids_reproduces_the_preset_and_stays_distinct_and_in_range():
    assert spread_layer_ids(5, 36) == (1, 9, 17, 25, 33)  # DFlash/DeepSpec's rule gives the published taps
    for layers in range(5, 80):
        ids = spread_layer_ids(5, layers)
        assert len(set(ids)) == 5 and ids == tuple(sorted(ids)) and 0 <= ids[0] and ids[-1] <= layers - 1, layers
    for taps in (1, 2, 3, 7):
        assert len(set(spread_layer_ids(taps, 12))) == taps
    with pytest.raises(DSparkTrtError, match="at least 5 target layers"):
        spread_layer_ids(5, 4)


def test_scaled_keeps_the_family_and_a_valid_config():
    p = scaled(get_preset("dspark_qwen3_8b_block7"), layers=1, target_layers=8, vocab=1024)
    c = p.config()
    assert (c.num_hidden_layers, c.num_target_layers, c.vocab_size, c.hidden_size, c.num_taps) == (1, 8, 1024, 4096, 5)
    assert c.target_layer_ids == (1, 2, 3, 4, 5) and c.mask_token_id == 1023  # 151669 is outside 1024 tokens
    assert p.target.num_hidden_layers == 8 and p.target.vocab_size == 1024
    assert scaled(get_preset("dspark_qwen3_8b_block7"), vocab=200_000).config().mask_token_id == 151669
    assert scaled(get_preset("dspark_qwen3_8b_block7"), layers=2).target_layer_ids == (1, 9, 17, 25, 33)
    config = DSparkConfig.from_dict(plan_preset(p, vocab=None)[0].json_files["config.json"])
    assert config.replace(source_format="deepseek") == c


@pytest.mark.parametrize("kwargs, message", [
    (dict(target_layers=3), "a 3-layer target cannot feed 5 distinct tapped layers"),
    (dict(layers=0), "--layers must be >= 1"),
    (dict(vocab=0), "--vocab must be >= 1"),
    (dict(hidden=64), "unknown preset shape fields ['hidden']"),
])
def test_scaled_refuses_bad_options_in_one_line(kwargs, message):
    with pytest.raises(DSparkTrtError) as e:
        scaled(get_preset("dspark_qwen3_8b_block7"), **kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_an_unknown_preset_lists_the_known_ones():
    with pytest.raises(DSparkTrtError) as e:
        get_preset("qwen3_32b")
    assert str(e.value) == (f"unknown checkpoint preset 'qwen3_32b': use one of {', '.join(PRESETS)} "
                            f"(dspark make-checkpoint --list shows their sizes)")


@pytest.mark.parametrize("head, extra", [
    ("gated", {"markov_head.gate_proj.weight": (256, 4096 + 256), "markov_head.gate_proj.bias": (256,)}),
    ("rnn", {"markov_head.joint_proj.weight": (768, 2 * 256 + 4096), "markov_head.joint_proj.bias": (768,)}),
])
@pytest.mark.parametrize("format", ["deepseek", "speculators"])
def test_gated_and_rnn_presets_satisfy_the_checkpoint_contract_at_full_size(head, extra, format):
    """Planned, never written: the config.json and tensor list make-checkpoint would write, read back as a
    checkpoint would be (the vanilla preset's tensors plus the head's projection, rank 256)."""
    from dspark_trt.errors import CheckpointContractError

    name = f"dspark_qwen3_8b_block7_{head}"
    (planned,) = plan_preset(name, format=format)
    config = DSparkConfig.from_dict(planned.json_files["config.json"])
    assert (config.markov_head_type, config.markov_rank) == (head, 256)
    shapes = {p.name: (list(p.shape), "BF16") for p in planned.tensors}
    vanilla = drafter_tensor_shapes(get_preset("dspark_qwen3_8b_block7"), format)
    assert {k: tuple(v[0]) for k, v in shapes.items()} == {**vanilla, **extra}
    assert planned.parameters == drafter_parameter_formula(get_preset(name), format)
    check_checkpoint(config, shapes, target_available=format == "speculators")
    broken = dict(shapes)
    del broken[next(iter(extra))]  # the head's projection missing: refused
    with pytest.raises(CheckpointContractError):
        check_checkpoint(config, broken, target_available=format == "speculators")
