"""The ``config.json`` of a DSpark drafter checkpoint, from its ``DSparkConfig`` and its target's config.

Two layouts, as the released checkpoints write them:

    deepseek_drafter_config(c, target)      DeepSpec: the target's config.json, overridden by the drafter's keys
    speculators_drafter_config(c, target)   speculators: a ``transformer_layer_config`` + the DSpark keys

Written by the synthetic checkpoints (tiny pairs, real-shape presets) and by ``dspark distill``.
"""

from __future__ import annotations

from ..config import DSparkConfig

__all__ = ["deepseek_drafter_config", "speculators_drafter_config"]


def _dspark_keys(c: DSparkConfig) -> dict:
    keys = {
        "block_size": c.block_size,
        "mask_token_id": c.mask_token_id,
        "markov_rank": c.markov_rank,
        "markov_head_type": c.markov_head_type,
        "enable_confidence_head": c.enable_confidence_head,
        "confidence_head_with_markov": c.confidence_head_with_markov,
        "sample_from_anchor": c.sample_from_anchor,
    }
    if c.has_reduced_vocab:
        keys["draft_vocab_size"] = c.draft_vocab_size
    if c.logit_scale != 1.0:
        keys["logit_scale"] = c.logit_scale
    return keys


def _attention_keys(c: DSparkConfig) -> dict:
    """The attention-pattern keys as transformers' Qwen3Config and speculators write them."""
    return {"hidden_act": c.hidden_act, "layer_types": list(c.layer_types),
            "use_sliding_window": c.sliding_window is not None, "sliding_window": c.sliding_window}


def deepseek_drafter_config(c: DSparkConfig, target_config: dict) -> dict:
    """A DeepSeek-format drafter's ``config.json``: DeepSpec's build_draft_config, the target's config overridden."""
    config = {k: v for k, v in target_config.items() if not k.startswith("_")}
    config.update(
        architectures=["Qwen3DSparkModel"],
        model_type="qwen3",
        num_hidden_layers=c.num_hidden_layers,
        **_attention_keys(c),
        target_layer_ids=list(c.target_layer_ids),
        num_target_layers=c.num_target_layers,
        num_anchors=512,
        tie_word_embeddings=False,
        attention_bias=False,
        rope_parameters={"rope_theta": c.rope_theta, "rope_type": "default"},
        **_dspark_keys(c),
    )
    if c.sliding_window_non_causal:
        config["sliding_window_non_causal"] = True
    config.pop("rope_theta", None)
    config.pop("mlp_bias", None)
    return config


def speculators_drafter_config(c: DSparkConfig, target_config: dict) -> dict:
    """A speculators-format drafter's ``config.json`` (its verifier: ``../target``)."""
    layer = {
        "model_type": "qwen3",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_parameters": {"rope_theta": c.rope_theta, "rope_type": "default"},
        "attention_bias": False,
        **_attention_keys(c),
    }
    keys = _dspark_keys(c)
    keys["draft_vocab_size"] = c.draft_vocab_size
    return {
        "speculators_model_type": "dspark",
        "architectures": ["DSparkDraftModel"],
        "transformer_layer_config": layer,
        "aux_hidden_state_layer_ids": [i + 1 for i in c.target_layer_ids],
        "target_hidden_size": c.hidden_size,
        "num_anchors": 256,
        "sliding_window_non_causal": c.sliding_window_non_causal,
        **keys,
        "speculators_config": {
            "algorithm": "dspark",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": c.num_draft_tokens}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": "../target", "architectures": target_config.get("architectures", [])},
        },
    }
