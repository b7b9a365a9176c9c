"""The Gemma-4 pair of the release matrix: a Gemma-4 text target and DeepSpec's Gemma-4 DSpark drafter, as shapes.

    GEMMA4_12B                 Gemma4ForCausalLM (the text tower of google/gemma-4-12B-it): sliding-window and global
                               layers (5:1), per-type head sizes, tied embeddings, logit soft-capping
    DSPARK_GEMMA4_12B_BLOCK7   Gemma4DSparkModel (DeepSpec deepspec/modeling/dspark/gemma4): Gemma-4 draft layers

What is established and what stands in is in docs/checkpoints.md ("The release matrix"). dspark-trt writes both
(``dspark make-checkpoint``) and runs them: the drafter's Gemma-4 layers are ``reference/gemma4_layers.py``, the
target's graph ``export/gemma4_target_graph.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Gemma4TargetPreset", "Gemma4DrafterPreset", "GEMMA4_12B", "DSPARK_GEMMA4_12B_BLOCK7", "GEMMA4_WIDTH_FIELDS"]

_TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _in_vocab(token: int | None, vocab: int) -> int | None:
    return token if token is not None and token < vocab else None


GEMMA4_WIDTH_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                       "global_head_dim", "sliding_window")


@dataclass(frozen=True)
class Gemma4TargetPreset:
    """A Gemma-4 text model's shapes (``Gemma4ForCausalLM``, dense: no per-layer inputs, MoE or shared KV)."""

    name: str
    description: str
    hub_id: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int  # sliding layers
    head_dim: int  # sliding layers
    global_head_dim: int  # full-attention layers (their K/V heads: num_key_value_heads, attention_k_eq_v false)
    sliding_window: int
    final_logit_softcapping: float | None
    rms_norm_eps: float
    max_position_embeddings: int
    shard_size: str
    bos_token_id: int | None = 2
    eos_token_id: int | None = 1
    pad_token_id: int | None = 0
    generation_eos_token_ids: tuple[int, ...] = (1, 106)
    tie_word_embeddings: bool = True
    sliding_window_pattern: int = 6  # every 6th layer is global, and the last
    kind: str = "target"

    def layer_types(self) -> list[str]:
        types = ["sliding_attention" if (i + 1) % self.sliding_window_pattern else "full_attention"
                 for i in range(self.num_hidden_layers)]
        types[-1] = "full_attention"  # transformers forces it
        return types

    def text_config(self) -> dict:
        return {
            "attention_bias": False, "attention_dropout": 0.0, "attention_k_eq_v": False,
            "bos_token_id": _in_vocab(self.bos_token_id, self.vocab_size),
            "enable_moe_block": False,
            "eos_token_id": _in_vocab(self.eos_token_id, self.vocab_size),
            "final_logit_softcapping": self.final_logit_softcapping,
            "global_head_dim": self.global_head_dim, "head_dim": self.head_dim,
            "hidden_activation": "gelu_pytorch_tanh", "hidden_size": self.hidden_size,
            "hidden_size_per_layer_input": 0, "initializer_range": 0.02,
            "intermediate_size": self.intermediate_size, "layer_types": self.layer_types(),
            "max_position_embeddings": self.max_position_embeddings,
            "num_attention_heads": self.num_attention_heads, "num_hidden_layers": self.num_hidden_layers,
            "num_key_value_heads": self.num_key_value_heads, "num_kv_shared_layers": 0,
            "pad_token_id": _in_vocab(self.pad_token_id, self.vocab_size), "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": {
                "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
                "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
            "sliding_window": self.sliding_window, "tie_word_embeddings": self.tie_word_embeddings,
            "use_bidirectional_attention": None, "use_cache": True, "use_double_wide_mlp": False,
            "vocab_size": self.vocab_size, "vocab_size_per_layer_input": self.vocab_size,
        }

    def config_json(self, dtype: str) -> dict:
        return {"architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text", **self.text_config(),
                "dtype": _TORCH_DTYPE[dtype], "transformers_version": "5.25.0"}

    def generation_config_json(self) -> dict:
        eos = [i for i in self.generation_eos_token_ids if i < self.vocab_size]
        out = {"bos_token_id": self.bos_token_id, "eos_token_id": eos or None, "pad_token_id": self.pad_token_id,
               "do_sample": True, "temperature": 1.0, "top_k": 64, "top_p": 0.95}
        return {k: v for k, v in out.items() if v is not None and (not isinstance(v, int) or v < self.vocab_size)}

    def layer_attention(self, i: int) -> tuple[int, int]:
        """(K/V heads, head size) of layer ``i``."""
        if self.layer_types()[i] == "full_attention":
            return self.num_key_value_heads, self.global_head_dim
        return self.num_key_value_heads, self.head_dim


def _gemma4_layer(prefix: str, d: int, heads: int, kv_heads: int, head: int, inter: int) -> dict:
    return {
        f"{prefix}.self_attn.q_proj.weight": (heads * head, d),
        f"{prefix}.self_attn.q_norm.weight": (head,),
        f"{prefix}.self_attn.k_norm.weight": (head,),
        f"{prefix}.self_attn.k_proj.weight": (kv_heads * head, d),
        f"{prefix}.self_attn.v_proj.weight": (kv_heads * head, d),
        f"{prefix}.self_attn.o_proj.weight": (d, heads * head),
        f"{prefix}.mlp.gate_proj.weight": (inter, d),
        f"{prefix}.mlp.up_proj.weight": (inter, d),
        f"{prefix}.mlp.down_proj.weight": (d, inter),
        f"{prefix}.input_layernorm.weight": (d,),
        f"{prefix}.post_attention_layernorm.weight": (d,),
        f"{prefix}.pre_feedforward_layernorm.weight": (d,),
        f"{prefix}.post_feedforward_layernorm.weight": (d,),
        f"{prefix}.layer_scalar": (1,),  # a persistent buffer, 1
    }


def gemma4_target_tensor_shapes(t: Gemma4TargetPreset) -> dict[str, tuple[int, ...]]:
    """A Gemma4ForCausalLM state dict's names and shapes (tied: no lm_head.weight); tests check them against
    transformers' own model."""
    d = t.hidden_size
    shapes = {"model.embed_tokens.weight": (t.vocab_size, d)}
    for i in range(t.num_hidden_layers):
        kv, head = t.layer_attention(i)
        shapes.update(_gemma4_layer(f"model.layers.{i}", d, t.num_attention_heads, kv, head, t.intermediate_size))
    shapes["model.norm.weight"] = (d,)
    if not t.tie_word_embeddings:
        shapes["lm_head.weight"] = (t.vocab_size, d)
    return shapes


@dataclass(frozen=True)
class Gemma4DrafterPreset:
    """DeepSpec's Gemma-4 DSpark drafter: Gemma-4 layers at the target's global head size, full attention."""

    name: str
    description: str
    target: Gemma4TargetPreset
    num_hidden_layers: int
    markov_rank: int
    block_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    hub_id: str = ""
    confidence_head: bool = True
    markov_head_type: str = "vanilla"
    format: str = "deepseek"
    lm_head: bool = True
    layer_types: tuple[str, ...] = ()
    kind: str = "drafter"

    @property
    def vocab_size(self) -> int:
        return self.target.vocab_size

    def config_json(self, dtype: str) -> dict:
        """DeepSpec's ``build_draft_config``: the target's text config, overridden (deepspec/modeling/dspark/gemma4/
        config.py)."""
        config = self.target.text_config()
        config.update(
            architectures=["Gemma4DSparkModel"], model_type="gemma4_unified_text",
            target_model_type="gemma4_unified", target_text_model_type="gemma4_unified_text",
            num_target_layers=self.target.num_hidden_layers, num_hidden_layers=self.num_hidden_layers,
            enable_moe_block=False, hidden_size_per_layer_input=0, block_size=self.block_size,
            tie_word_embeddings=False, layer_types=["full_attention"] * self.num_hidden_layers,
            mask_token_id=self.mask_token_id, target_layer_ids=list(self.target_layer_ids), num_anchors=512,
            enable_confidence_head=self.confidence_head, confidence_head_with_markov=self.confidence_head,
            markov_rank=self.markov_rank, markov_head_type=self.markov_head_type,
            num_global_key_value_heads=None, dtype=_TORCH_DTYPE[dtype],
        )
        return config

    def check(self) -> None:
        from ..config import check_layer_ids

        check_layer_ids(self.target_layer_ids, self.target.num_hidden_layers)


def gemma4_drafter_tensor_shapes(p: Gemma4DrafterPreset) -> dict[str, tuple[int, ...]]:
    """Gemma4DSparkModel's state dict: embed_tokens, Gemma-4 layers (head size global_head_dim), norm, fc,
    hidden_norm, lm_head, the vanilla Markov head (markov_w1 / markov_w2) and the confidence head."""
    t = p.target
    d, V, r = t.hidden_size, t.vocab_size, p.markov_rank
    shapes = {"embed_tokens.weight": (V, d)}
    for i in range(p.num_hidden_layers):
        shapes.update(_gemma4_layer(f"layers.{i}", d, t.num_attention_heads, t.num_key_value_heads,
                                    t.global_head_dim, t.intermediate_size))
    shapes.update({"norm.weight": (d,), "fc.weight": (d, len(p.target_layer_ids) * d), "hidden_norm.weight": (d,)})
    if p.lm_head:
        shapes["lm_head.weight"] = (V, d)
    shapes.update({"markov_head.markov_w1.weight": (V, r), "markov_head.markov_w2.weight": (V, r)})
    if p.confidence_head:
        shapes.update({"confidence_head.proj.weight": (1, d + r), "confidence_head.proj.bias": (1,)})
    return shapes


GEMMA4_12B = Gemma4TargetPreset(
    name="gemma4_12b", hub_id="google/gemma-4-12B-it",
    description="Gemma-4-12B-shaped text target (Gemma4ForCausalLM: 48 layers, 5 sliding (window 1024) : 1 global, "
                "tied embeddings, soft-capped logits); head sizes stand in",
    vocab_size=262144, hidden_size=3840, intermediate_size=15360, num_hidden_layers=48, num_attention_heads=16,
    num_key_value_heads=8, head_dim=256, global_head_dim=512, sliding_window=1024, final_logit_softcapping=30.0,
    rms_norm_eps=1e-6, max_position_embeddings=262144, shard_size="5GB",
)
DSPARK_GEMMA4_12B_BLOCK7 = Gemma4DrafterPreset(
    name="dspark_gemma4_12b_block7", hub_id="deepseek-ai/dspark_gemma4_12b_block7",
    description="DeepSeek's DSpark drafter for Gemma-4-12B (Gemma4DSparkModel: Gemma-4 layers): 5 layers, rank 256, "
                "block 7, taps 5/17/29/41/46, mask 4",
    target=GEMMA4_12B, num_hidden_layers=5, markov_rank=256, block_size=7, target_layer_ids=(5, 17, 29, 41, 46),
    mask_token_id=4,
)
