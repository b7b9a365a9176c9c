"""Named real-shape checkpoints: DSpark drafters and their Hugging Face targets, at the sizes people deploy.

A preset is shapes only; ``preset_checkpoint.write_preset`` fills them with random weights (docs/checkpoints.md,
"Real-shape checkpoints"). ``scaled`` keeps a preset's shape family but changes its depth or vocabulary, so
tests run the same widths in a few hundred MB:

    preset = get_preset("dspark_qwen3_8b_block7")          # 2.37 B parameters, 4.74 GB in bf16
    small = scaled(preset, layers=1, vocab=1024)           # one draft layer, V = 1024: 0.28 B parameters

Drafter presets follow DeepSpec's published configs; their target is a preset too (``preset.target``), and
the drafter's width, heads and vocabulary are the target's (a DeepSeek drafter config is its target's config,
overridden).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ..checkpoint import expected_tensors
from ..config import DSparkConfig, check_layer_ids
from ..errors import DSparkTrtError
from .byte_tokenizer import BYTE_VOCAB

__all__ = ["TargetPreset", "DrafterPreset", "PRESETS", "get_preset", "scaled", "spread_layer_ids",
           "target_tensor_shapes", "drafter_tensor_shapes", "parameter_count", "drafter_parameter_formula",
           "target_parameter_formula", "MIN_TOKENIZER_VOCAB"]

MIN_TOKENIZER_VOCAB = BYTE_VOCAB  # the byte-level tokenizer written with a target: ids 0…255 bytes, 256 <|mask|>

QWEN3_LAYER = ("input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
               "self_attn.v_proj.weight", "self_attn.o_proj.weight", "self_attn.q_norm.weight",
               "self_attn.k_norm.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight",
               "mlp.up_proj.weight", "mlp.down_proj.weight")


@dataclass(frozen=True)
class TargetPreset:
    """A Hugging Face Qwen3 causal LM's shapes and the ``config.json`` keys its release carries (or, for a release
    whose target is not a Qwen3 model, a Qwen3-shaped stand-in: docs/checkpoints.md says which)."""

    name: str
    description: str
    hub_id: str  # the release this preset mirrors (recorded as the speculators verifier of its drafters)
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    bos_token_id: int | None
    eos_token_id: int | None
    generation_eos_token_ids: tuple[int, ...]  # generation_config.json's eos_token_id
    shard_size: str  # the release's shard limit (save_pretrained's max_shard_size)
    tie_word_embeddings: bool = False  # Qwen3-4B ties lm_head to embed_tokens (no lm_head.weight)
    kind: str = "target"

    def config_json(self, dtype: str) -> dict:
        """``config.json`` as transformers wrote the release (ids outside a reduced vocabulary dropped)."""
        return {
            "architectures": ["Qwen3ForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": _in_vocab(self.bos_token_id, self.vocab_size),
            "eos_token_id": _in_vocab(self.eos_token_id, self.vocab_size),
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "initializer_range": 0.02,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "max_window_layers": self.num_hidden_layers,
            "model_type": "qwen3",
            "num_attention_heads": self.num_attention_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "num_key_value_heads": self.num_key_value_heads,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_scaling": None,
            "rope_theta": self.rope_theta,
            "sliding_window": None,
            "tie_word_embeddings": self.tie_word_embeddings,
            "torch_dtype": _TORCH_DTYPE[dtype],
            "transformers_version": "4.51.0",
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": self.vocab_size,
        }

    def generation_config_json(self) -> dict:
        eos = [i for i in self.generation_eos_token_ids if i < self.vocab_size]
        out = {"bos_token_id": _in_vocab(self.bos_token_id, self.vocab_size), "do_sample": True,
               "eos_token_id": eos or None, "pad_token_id": _in_vocab(self.bos_token_id, self.vocab_size),
               "temperature": 0.6, "top_k": 20, "top_p": 0.95, "transformers_version": "4.51.0"}
        return {k: v for k, v in out.items() if v is not None}


@dataclass(frozen=True)
class DrafterPreset:
    """A DSpark drafter's shapes beside its target preset (the width, heads and vocabulary are the target's)."""

    name: str
    description: str
    target: TargetPreset
    num_hidden_layers: int
    markov_rank: int
    block_size: int
    target_layer_ids: tuple[int, ...]  # DeepSeek ids into target.num_hidden_layers layers
    mask_token_id: int
    confidence_head: bool = True
    markov_head_type: str = "vanilla"  # vanilla | gated (+ gate_proj) | rnn (+ joint_proj): reference/markov_heads.py
    format: str = "deepseek"  # the release's layout: make-checkpoint's default --format
    lm_head: bool = True  # False: the release ships no lm_head.weight (read from the target, V_d = V)
    layer_types: tuple[str, ...] = ()  # () = all full_attention
    sliding_window: int | None = None
    sliding_window_non_causal: bool = False
    hub_id: str = ""  # the release this preset mirrors
    kind: str = "drafter"

    @property
    def vocab_size(self) -> int:
        return self.target.vocab_size

    def config(self) -> DSparkConfig:
        t = self.target
        return DSparkConfig(
            vocab_size=t.vocab_size, draft_vocab_size=t.vocab_size, hidden_size=t.hidden_size,
            intermediate_size=t.intermediate_size, num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=t.num_attention_heads, num_key_value_heads=t.num_key_value_heads,
            head_dim=t.head_dim, rms_norm_eps=t.rms_norm_eps, rope_theta=t.rope_theta, block_size=self.block_size,
            mask_token_id=self.mask_token_id, target_layer_ids=tuple(self.target_layer_ids),
            num_target_layers=t.num_hidden_layers, markov_rank=self.markov_rank,
            markov_head_type=self.markov_head_type,  # type: ignore[arg-type]
            enable_confidence_head=self.confidence_head, confidence_head_with_markov=self.confidence_head,
            layer_types=tuple(self.layer_types), sliding_window=self.sliding_window,
            sliding_window_non_causal=self.sliding_window_non_causal,
        )


#: the width fields ``scaled(**shape)`` may change (depth and vocabulary have their own arguments)
WIDTH_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim")
_TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _in_vocab(token: int | None, vocab: int) -> int | None:
    return token if token is not None and token < vocab else None


QWEN3_8B = TargetPreset(
    name="qwen3_8b", description="Qwen3-8B-shaped target (Qwen3ForCausalLM, untied lm_head, 5 shards like the release)",
    hub_id="Qwen/Qwen3-8B", vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
    num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1000000.0,
    max_position_embeddings=40960, bos_token_id=151643, eos_token_id=151645,
    generation_eos_token_ids=(151645, 151643), shard_size="4GB",
)

DSPARK_QWEN3_8B_BLOCK7 = DrafterPreset(
    name="dspark_qwen3_8b_block7",
    description="DeepSeek's DSpark drafter for Qwen3-8B: 5 layers, Markov rank 256, block 7, embed_tokens + lm_head",
    target=QWEN3_8B, num_hidden_layers=5, markov_rank=256, block_size=7, target_layer_ids=(1, 9, 17, 25, 33),
    mask_token_id=151669,
)

#: the same drafter with the other Markov heads speculators 0.9.0 trains (``--markov-head-type gated | rnn``), at
#: the rank of its training CLI's default for every head (``--markov-rank`` 256; docs/checkpoints.md)
DSPARK_QWEN3_8B_BLOCK7_GATED = dataclasses.replace(
    DSPARK_QWEN3_8B_BLOCK7, name="dspark_qwen3_8b_block7_gated", markov_head_type="gated",
    description="dspark_qwen3_8b_block7 with a gated Markov head (gate_proj [256, 4096 + 256] over [h ; W1[prev]])")
DSPARK_QWEN3_8B_BLOCK7_RNN = dataclasses.replace(
    DSPARK_QWEN3_8B_BLOCK7, name="dspark_qwen3_8b_block7_rnn", markov_head_type="rnn",
    description="dspark_qwen3_8b_block7 with an RNN Markov head "
                "(joint_proj [768, 2·256 + 4096] over [s ; W1[prev] ; h])")

# -- the release matrix (docs/checkpoints.md, "The release matrix": where each key and shape comes from) ----------
QWEN3_4B = TargetPreset(
    name="qwen3_4b", description="Qwen3-4B-shaped target (Qwen3ForCausalLM, lm_head tied to embed_tokens)",
    hub_id="Qwen/Qwen3-4B", vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
    num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1000000.0,
    max_position_embeddings=40960, bos_token_id=151643, eos_token_id=151645,
    generation_eos_token_ids=(151645, 151643), shard_size="4GB", tie_word_embeddings=True,
)
QWEN3_14B = TargetPreset(
    name="qwen3_14b", description="Qwen3-14B-shaped target (Qwen3ForCausalLM, untied lm_head)",
    hub_id="Qwen/Qwen3-14B", vocab_size=151936, hidden_size=5120, intermediate_size=17408, num_hidden_layers=40,
    num_attention_heads=40, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1000000.0,
    max_position_embeddings=40960, bos_token_id=151643, eos_token_id=151645,
    generation_eos_token_ids=(151645, 151643), shard_size="4GB",
)
DSPARK_QWEN3_4B_BLOCK7 = DrafterPreset(
    name="dspark_qwen3_4b_block7", hub_id="deepseek-ai/dspark_qwen3_4b_block7",
    description="DeepSeek's DSpark drafter for Qwen3-4B: 5 layers, Markov rank 256, block 7 (DeepSpec dspark_qwen3_4b)",
    target=QWEN3_4B, num_hidden_layers=5, markov_rank=256, block_size=7, target_layer_ids=(1, 9, 17, 25, 33),
    mask_token_id=151669,
)
DSPARK_QWEN3_14B_BLOCK7 = DrafterPreset(
    name="dspark_qwen3_14b_block7", hub_id="deepseek-ai/dspark_qwen3_14b_block7",
    description="DeepSeek's DSpark drafter for Qwen3-14B: 5 layers, Markov rank 256, block 7 (DeepSpec dspark_qwen3_14b)",
    target=QWEN3_14B, num_hidden_layers=5, markov_rank=256, block_size=7, target_layer_ids=(1, 10, 19, 28, 37),
    mask_token_id=151669,
)
#: Model Optimizer writes DeepSpec's weight names and config keys; nothing else about its output is established here,
#: so the preset is the Qwen3-4B drafter that TensorRT-Edge-LLM's docs build (7 drafted tokens, 8 verified)
MODELOPT_QWEN3_4B_BLOCK7 = dataclasses.replace(
    DSPARK_QWEN3_4B_BLOCK7, name="modelopt_qwen3_4b_block7", hub_id="(Model Optimizer output, no public release)",
    description="a Model Optimizer-format drafter (DeepSpec names and keys) for Qwen3-4B: dspark_qwen3_4b_block7's shapes")
#: stand-in target of the speculators GLM-5 drafter: the drafter's own widths (a speculators drafter's layers are
#: Qwen3 layers), GLM-5's vocabulary and the depth its taps need; GLM-5 itself (GlmMoeDsa) is not a Qwen3 model
GLM5_STANDIN = TargetPreset(
    name="glm5_standin", description="Qwen3-shaped stand-in for GLM-5 (GlmMoeDsaForCausalLM is not exportable)",
    hub_id="zai-org/GLM-5.2", vocab_size=154880, hidden_size=6144, intermediate_size=14336, num_hidden_layers=78,
    num_attention_heads=64, num_key_value_heads=16, head_dim=64, rms_norm_eps=1e-5, rope_theta=1000000.0,
    max_position_embeddings=202752, bos_token_id=None, eos_token_id=None, generation_eos_token_ids=(),
    shard_size="5GB",
)
SPECULATORS_GLM5_BLOCK8 = DrafterPreset(
    name="speculators_glm5_block8", hub_id="RedHatAI/GLM-5.2-speculator.dspark", format="speculators",
    description="a speculators-format DSpark drafter for GLM-5 (RedHatAI's GLM-5.x speculators): 3 layers, block 8, "
                "taps 2/20/39/58/75, V 154880, causal sliding window 2048",
    target=GLM5_STANDIN, num_hidden_layers=3, markov_rank=256, block_size=8, target_layer_ids=(1, 19, 38, 57, 74),
    mask_token_id=154879, layer_types=("sliding_attention",) * 3, sliding_window=2048,
)
#: DeepSeek-V4-Flash's built-in drafter: block 5 and target layers [40, 41, 42] are established, nothing else; the
#: widths are Qwen3-8B's and the target depth the least that holds layer 42 with one layer to spare
DEEPSEEK_V4_FLASH_STANDIN = dataclasses.replace(
    QWEN3_8B, name="deepseek_v4_flash_standin", hub_id="deepseek-ai/DeepSeek-V4-Flash", num_hidden_layers=44,
    description="Qwen3-8B-shaped stand-in for DeepSeek-V4-Flash at 44 layers (its own shapes are not established)")
DSPARK_BLOCK5_TAPS40_42 = DrafterPreset(
    name="dspark_block5_taps40_42", hub_id="deepseek-ai/DeepSeek-V4-Flash (built-in drafter)",
    description="a block-5 drafter tapping target layers 40, 41, 42 (DeepSeek-V4-Flash's built-in drafter's block and "
                "taps; Qwen3-8B widths stand in)",
    target=DEEPSEEK_V4_FLASH_STANDIN, num_hidden_layers=5, markov_rank=256, block_size=5,
    target_layer_ids=(40, 41, 42), mask_token_id=151669,
)
#: RadixArk's Qwen3.8-27B drafter (Qwen3DSparkModel, rank 256, block 7) ships no lm_head; its target (64 layers:
#: 48 linear-attention, 16 full-attention) is not exportable, so Qwen3-14B widths at 64 layers stand in
QWEN3_8_27B_STANDIN = dataclasses.replace(
    QWEN3_14B, name="qwen3_8_27b_standin", hub_id="Qwen/Qwen3.8-27B", num_hidden_layers=64,
    description="Qwen3-14B-shaped stand-in for Qwen3.8-27B at its 64 layers (its linear-attention layers are not exported)")
DSPARK_QWEN3_8_27B_NO_LM_HEAD = DrafterPreset(
    name="dspark_qwen3_8_27b_no_lm_head", hub_id="RadixArk/Qwen3.8-27B-DSpark", lm_head=False,
    description="a DeepSeek-format drafter without lm_head.weight (RadixArk/Qwen3.8-27B-DSpark): the target's lm_head "
                "is read; 5 layers, rank 256, block 7",
    target=QWEN3_8_27B_STANDIN, num_hidden_layers=5, markov_rank=256, block_size=7,
    target_layer_ids=(1, 16, 31, 46, 61), mask_token_id=151669,
)

from .gemma4_presets import (DSPARK_GEMMA4_12B_BLOCK7, GEMMA4_12B, GEMMA4_WIDTH_FIELDS,  # noqa: E402
                             Gemma4DrafterPreset, Gemma4TargetPreset, gemma4_drafter_tensor_shapes,
                             gemma4_target_tensor_shapes)

PRESETS: dict[str, TargetPreset | DrafterPreset] = {
    p.name: p for p in (DSPARK_QWEN3_4B_BLOCK7, DSPARK_QWEN3_8B_BLOCK7, DSPARK_QWEN3_8B_BLOCK7_GATED,
                        DSPARK_QWEN3_8B_BLOCK7_RNN, DSPARK_QWEN3_14B_BLOCK7, MODELOPT_QWEN3_4B_BLOCK7,
                        DSPARK_GEMMA4_12B_BLOCK7, SPECULATORS_GLM5_BLOCK8, DSPARK_BLOCK5_TAPS40_42,
                        DSPARK_QWEN3_8_27B_NO_LM_HEAD, QWEN3_4B, QWEN3_8B, QWEN3_14B, GEMMA4_12B)}


def get_preset(name: str) -> TargetPreset | DrafterPreset:
    if name not in PRESETS:
        raise DSparkTrtError(f"unknown checkpoint preset {name!r}: use one of {', '.join(PRESETS)} "
                             f"(dspark make-checkpoint --list shows their sizes)")
    return PRESETS[name]


def spread_layer_ids(num_taps: int, num_target_layers: int) -> tuple[int, ...]:
    """``num_taps`` distinct DeepSeek ids spread over a ``num_target_layers``-layer target.

    DFlash/DeepSpec's rule (``build_target_layer_ids``: from layer 1 to layer L − 3, evenly) — it gives
    [1, 9, 17, 25, 33] for 5 taps of 36 layers — and, where that rule repeats a layer on a shallow target,
    ids spread evenly over all L layers instead.
    """
    if num_taps > num_target_layers:
        raise DSparkTrtError(f"a {num_target_layers}-layer target cannot feed {num_taps} distinct tapped layers: use at "
                             f"least {num_taps} target layers (--target-layers)")
    if num_taps == 1:
        return (num_target_layers // 2,)
    start, end = 1, num_target_layers - 3
    ids = tuple(int(round(start + i * (end - start) / (num_taps - 1))) for i in range(num_taps))
    if len(set(ids)) == num_taps and all(0 <= i < num_target_layers for i in ids):
        return ids
    return tuple(int(round(i * (num_target_layers - 1) / (num_taps - 1))) for i in range(num_taps))


def scaled(preset: TargetPreset | DrafterPreset, *, layers: int | None = None, target_layers: int | None = None,
           vocab: int | None = None, **shape) -> TargetPreset | DrafterPreset:
    """The same shape family with fewer (or more) layers or another vocabulary.

    Args:
        layers: draft layers of a drafter preset; decoder layers of a target preset.
        target_layers: a drafter preset's target depth; its ``target_layer_ids`` are spread over it anew
            (``spread_layer_ids``), so the drafter config stays valid.
        vocab: vocabulary of drafter and target; a ``mask_token_id`` outside it becomes ``vocab − 1``.
        **shape: other ``TargetPreset`` width fields (``hidden_size``, ``intermediate_size``, ``head_dim``, ...),
            for tests that need a narrow model.
    """
    for name, value in (("layers", layers), ("target_layers", target_layers), ("vocab", vocab)):
        if value is not None and int(value) < 1:
            raise DSparkTrtError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    gemma = isinstance(preset, (Gemma4TargetPreset, Gemma4DrafterPreset))
    fields = GEMMA4_WIDTH_FIELDS if gemma else WIDTH_FIELDS
    unknown = sorted(set(shape) - set(fields))
    if unknown:
        raise DSparkTrtError(f"unknown preset shape fields {unknown}: use {', '.join(fields)}")
    if isinstance(preset, (TargetPreset, Gemma4TargetPreset)):
        if target_layers is not None:
            raise DSparkTrtError(f"--target-layers applies to drafter presets; {preset.name} is a target: use --layers")
        changes = dict(shape)
        if layers is not None:
            changes["num_hidden_layers"] = int(layers)
        if vocab is not None:
            changes["vocab_size"] = int(vocab)
        return dataclasses.replace(preset, **changes)
    target = scaled(preset.target, layers=target_layers, vocab=vocab, **shape)
    changes = {"target": target}
    if layers is not None:
        changes["num_hidden_layers"] = int(layers)
        if preset.layer_types:  # one attention kind per release: the same kind on every layer
            changes["layer_types"] = (preset.layer_types[0],) * int(layers)
    if target.num_hidden_layers != preset.target.num_hidden_layers:
        changes["target_layer_ids"] = spread_layer_ids(len(preset.target_layer_ids), target.num_hidden_layers)
    if preset.mask_token_id >= target.vocab_size:
        changes["mask_token_id"] = target.vocab_size - 1
    out = dataclasses.replace(preset, **changes)
    check_layer_ids(out.target_layer_ids, target.num_hidden_layers)
    if not gemma:
        out.config()  # the DSparkConfig checks (heads, vocabulary, mask token)
    return out


# -- tensors ------------------------------------------------------------------------------------------------
def target_tensor_shapes(t: TargetPreset) -> dict[str, tuple[int, ...]]:
    """A Qwen3ForCausalLM state dict's names and shapes, in module order (as save_pretrained shards them)."""
    if isinstance(t, Gemma4TargetPreset):
        return gemma4_target_tensor_shapes(t)
    d, D = t.hidden_size, t.head_dim
    q_out, kv_out = t.num_attention_heads * D, t.num_key_value_heads * D
    per_layer = dict(zip(QWEN3_LAYER, [(d,), (q_out, d), (kv_out, d), (kv_out, d), (d, q_out), (D,), (D,), (d,),
                                       (t.intermediate_size, d), (t.intermediate_size, d), (d, t.intermediate_size)]))
    shapes = {"model.embed_tokens.weight": (t.vocab_size, d)}
    for i in range(t.num_hidden_layers):
        shapes.update({f"model.layers.{i}.{name}": shape for name, shape in per_layer.items()})
    shapes["model.norm.weight"] = (d,)
    if not t.tie_word_embeddings:
        shapes["lm_head.weight"] = (t.vocab_size, d)
    return shapes


def drafter_tensor_shapes(p: DrafterPreset, format: str) -> dict[str, tuple[int, ...]]:
    """The tensors a drafter checkpoint of ``format`` holds: DeepSeek's are self-contained (embed_tokens and
    lm_head included); speculators' leave embed_tokens and lm_head to the target (full vocabulary)."""
    if isinstance(p, Gemma4DrafterPreset):
        if format != "deepseek":
            raise DSparkTrtError(f"{p.name} is a DeepSpec Gemma4DSparkModel: no speculators layout of a Gemma-4 drafter "
                                 f"is established; use --format deepseek")
        return gemma4_drafter_tensor_shapes(p)
    spec = expected_tensors(p.config())
    shared = {"embed_tokens.weight", "lm_head.weight"}
    out = {}
    for name, ts in spec.items():
        if name == "d2t":  # identity mapping (V_d = V): never written
            continue
        if format == "speculators" and name in shared:
            continue
        if name == "lm_head.weight" and not p.lm_head:  # read from the target (V_d = V)
            continue
        out[name] = ts.shape
    return out


def parameter_count(shapes: dict[str, tuple[int, ...]]) -> int:
    return sum(math.prod(s) for s in shapes.values())


def target_parameter_formula(t: TargetPreset) -> int:
    """Closed form of a Qwen3 target's parameters: 2·V·d (embeddings, untied head) + d (final norm) + L·layer."""
    d, D, V = t.hidden_size, t.head_dim, t.vocab_size
    attn = 2 * d * t.num_attention_heads * D + 2 * d * t.num_key_value_heads * D + 2 * D
    layer = attn + 3 * d * t.intermediate_size + 2 * d
    return (1 if t.tie_word_embeddings else 2) * V * d + d + t.num_hidden_layers * layer


def drafter_parameter_formula(p: DrafterPreset, format: str = "deepseek") -> int:
    """Closed form of a DSpark drafter's parameters (docs/checkpoints.md): its Qwen3 layers, fc [d, m·d], two
    norms, the Markov head 2·V·r (+ gated: gate_proj r·(d + r) + r; rnn: joint_proj 3r·(2r + d) + 3r), the
    confidence head d + r + 1 and, in DeepSeek format, embed_tokens and lm_head (2·V·d)."""
    t = p.target
    d, D, V, r, m = t.hidden_size, t.head_dim, t.vocab_size, p.markov_rank, len(p.target_layer_ids)
    attn = 2 * d * t.num_attention_heads * D + 2 * d * t.num_key_value_heads * D + 2 * D
    layer = attn + 3 * d * t.intermediate_size + 2 * d
    total = p.num_hidden_layers * layer + m * d * d + 2 * d + 2 * V * r
    total += {"vanilla": 0, "gated": r * (d + r) + r, "rnn": 3 * r * (2 * r + d) + 3 * r}[p.markov_head_type]
    if p.confidence_head:
        total += d + r + 1
    if format == "deepseek":
        total += (2 if p.lm_head else 1) * V * d
    return total
