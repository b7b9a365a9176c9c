"""``DSparkConfig``: both checkpoint formats normalised to one frozen config.

Formats (docs/dspark.md §3):

* **deepseek** (DeepSeek/DeepSpec, ``architectures: ["Qwen3DSparkModel"]``): the target's Qwen3 config
  overridden with ``block_size``, ``target_layer_ids``, ``markov_rank``, ``mask_token_id``, ...
* **speculators** (``speculators_model_type: "dspark"``): draft-layer hyper-parameters nested in
  ``transformer_layer_config``; taps in ``aux_hidden_state_layer_ids`` (capture convention = DeepSeek
  id + 1); ``draft_vocab_size`` always present.

Layer ids are stored in the **DeepSeek convention** (id i = output of target decoder layer i, 0-based;
-1 = embedding output). ``hf_hidden_state_indices`` converts to ``output_hidden_states`` indices; the
speculators/vLLM capture ids are ``id + 1`` as well. This module is the one place that converts.

Attention inside the draft block (per draft layer; the speculators training mask,
``models/dflash/attention.py::create_anchor_block_mask_mod``): a ``full_attention`` layer — and a
``sliding_attention`` layer when sliding windows are off — lets every block query see all context positions
``< p`` and every block slot (bidirectional; DeepSeek's architecture). A ``sliding_attention`` layer with
window ``W`` sees only the context positions ``p - W … p - 1`` and, unless ``sliding_window_non_causal``,
the block slots up to its own (causal). Keys follow transformers' ``Qwen3Config``: ``use_sliding_window``
(default false) switches windows on, ``sliding_window`` (default 4096) is ``W``, and ``layer_types`` defaults
to ``sliding_attention`` from layer ``max_window_layers`` (default 28) on.

Draft layer families (``layer_family``): ``qwen3`` (every format above) and ``gemma4``, DeepSpec's
``Gemma4DSparkModel`` (``architectures: ["Gemma4DSparkModel"]``: the Gemma-4 target's text config overridden,
``deepspec/modeling/dspark/gemma4/``): Gemma-4 layers at the target's ``global_head_dim`` (q/k norms, an unscaled v
norm, sandwich norms, ``layer_scalar``, GELU-tanh MLP, attention scale 1), proportional RoPE
(``rope_parameters["full_attention"]``), embeddings × √d and soft-capped logits; every layer full attention,
bidirectional in the block (docs/checkpoints.md, "The Gemma-4 drafter").

Block layout (§3.4): ``block_size`` is the number of query slots per request, as both ecosystems name
it. With ``sample_from_anchor`` (anchor-first, DeepSeek) every slot is a prediction, so the drafter
proposes ``N = block_size`` tokens; without it (bonus-anchor) slot 0 only carries the anchor and
``N = block_size - 1``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from .errors import DSparkTrtError
from .jsonfile import read_json

__all__ = ["DSparkConfig", "hf_hidden_state_indices", "deepseek_ids_from_capture_ids", "check_layer_ids"]

#: the Markov heads the field trains (speculators, NeMo AutoModel, DeepSpec) and dspark-trt runs (docs/dspark.md §5):
#: "vanilla" bias W2·W1[d]; "gated" W2·(σ(G·[h ; W1[d]] + b) ⊙ W1[d]); "rnn" W2·tanh(o) from a GRU-style state
SUPPORTED_MARKOV_HEADS = ("vanilla", "gated", "rnn")
SUPPORTED_HIDDEN_ACTS = ("silu",)
#: draft layer families: Qwen3 decoder layers, or DeepSpec's Gemma-4 draft layers (module docstring)
LAYER_FAMILIES = ("qwen3", "gemma4")
GEMMA4_HIDDEN_ACTS = ("gelu_pytorch_tanh",)  # Gemma4TextConfig's hidden_activation (GELU, tanh approximation)
#: transformers' Gemma4TextConfig default for a full_attention layer's RoPE, used where rope_parameters is absent
GEMMA4_FULL_ATTENTION_ROPE = {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}
SUPPORTED_LAYER_TYPES = ("full_attention", "sliding_attention")
QWEN3_SLIDING_WINDOW = 4096  # transformers' Qwen3Config defaults, used where a key is absent
QWEN3_MAX_WINDOW_LAYERS = 28


def hf_hidden_state_indices(target_layer_ids: tuple[int, ...] | list[int]) -> list[int]:
    """DeepSeek layer ids → indices into transformers' ``output_hidden_states`` (index 0 = embeddings)."""
    return [i + 1 for i in target_layer_ids]


def check_layer_ids(ids, num_layers: int) -> None:
    """DeepSeek ids must lie in [-1, L-1] (-1 = embeddings; L-1 = the last layer, tapped before the final norm)."""
    bad = [i for i in ids if not -1 <= i <= num_layers - 1]
    if bad:
        raise DSparkTrtError(
            f"target_layer_ids {list(ids)} are invalid for this {num_layers}-layer target: {bad} outside "
            f"[-1, {num_layers - 1}] (DeepSeek convention: id i = output of decoder layer i); use a drafter "
            f"trained for this target")


def deepseek_ids_from_capture_ids(capture_ids: list[int]) -> list[int]:
    """speculators ``aux_hidden_state_layer_ids`` / vLLM capture ids (input of layer L) → DeepSeek ids."""
    return [i - 1 for i in capture_ids]


@dataclasses.dataclass(frozen=True)
class DSparkConfig:
    """One DSpark drafter's hyper-parameters, whatever format its checkpoint came in.

    Field names follow the ecosystem (DeepSpec, speculators, vLLM, TensorRT-LLM).
    """

    # -- vocabulary -------------------------------------------------------------------------------
    vocab_size: int  # V: target (input) vocabulary; W1 and embed_tokens rows
    draft_vocab_size: int  # V_d: LM-head (output) vocabulary; W2 and lm_head rows
    # -- draft backbone (Qwen3 or Gemma-4 decoder layers: layer_family) ---------------------------
    hidden_size: int  # d
    intermediate_size: int
    num_hidden_layers: int  # draft decoder layers L_d
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int  # D of the draft layers (a Gemma-4 drafter's: the target's global_head_dim)
    rms_norm_eps: float
    rope_theta: float
    # -- DSpark -----------------------------------------------------------------------------------
    block_size: int  # query slots per request (see module docstring)
    mask_token_id: int
    target_layer_ids: tuple[int, ...]  # DeepSeek convention
    num_target_layers: int | None  # target depth, when the checkpoint records it
    markov_rank: int  # r
    markov_head_type: Literal["vanilla", "gated", "rnn"] = "vanilla"
    enable_confidence_head: bool = True
    confidence_head_with_markov: bool = True
    logit_scale: float = 1.0  # s: multiplies the base logits and the Markov bias
    sample_from_anchor: bool = True  # anchor-first (True) or bonus-anchor (False) layout
    draft_topk: int | None = None  # vLLM's `dspark_draft_topk`; None = dense Markov head
    draft_markov_topm: int = 0  # candidate union width M (docs/kernel.md); 0 = top-k only
    source_format: Literal["deepseek", "speculators"] = "deepseek"
    # -- attention pattern inside the draft block (module docstring) -------------------------------
    hidden_act: str = "silu"
    layer_types: tuple[str, ...] = ()  # per draft layer; () = all "full_attention"
    sliding_window: int | None = None  # W of sliding_attention layers; None = windows off (they attend fully)
    sliding_window_non_causal: bool = False  # sliding layers bidirectional (True) or causal in the block
    # -- layer family (module docstring); the defaults are Qwen3's ------------------------------------
    layer_family: Literal["qwen3", "gemma4"] = "qwen3"
    partial_rotary_factor: float = 1.0  # rotated share of D (proportional RoPE: the rest keeps its values)
    final_logit_softcapping: float | None = None  # cap: base logits cap · tanh(lm_head(H) / cap)
    attention_k_eq_v: bool = False  # Gemma-4 K = V projection (no v_proj; V = v_norm(k_proj(h)))

    def __post_init__(self) -> None:
        if not self.layer_types:
            object.__setattr__(self, "layer_types", ("full_attention",) * int(self.num_hidden_layers))
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if self.layer_family not in LAYER_FAMILIES:
            raise DSparkTrtError(f"layer_family {self.layer_family!r} is not one of {list(LAYER_FAMILIES)}")
        unsupported = _attention_problem(self.hidden_act, self.layer_types, self.num_hidden_layers,
                                         self.sliding_window, self.layer_family)
        if unsupported:
            raise DSparkTrtError(unsupported)
        if self.markov_head_type not in SUPPORTED_MARKOV_HEADS:
            raise DSparkTrtError(
                f"markov_head_type {self.markov_head_type!r} is not supported: config.json must name one of "
                f"{', '.join(repr(h) for h in SUPPORTED_MARKOV_HEADS)} (docs/dspark.md §5)"
            )
        problems = []
        for name in ("vocab_size", "draft_vocab_size", "hidden_size", "num_hidden_layers", "head_dim",
                     "num_attention_heads", "num_key_value_heads", "block_size", "markov_rank"):
            if int(getattr(self, name)) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.draft_vocab_size > self.vocab_size:
            problems.append(f"draft_vocab_size {self.draft_vocab_size} exceeds vocab_size {self.vocab_size}")
        if self.num_attention_heads % max(self.num_key_value_heads, 1):
            problems.append(f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                            f"num_key_value_heads {self.num_key_value_heads}")
        if not 0 <= self.mask_token_id < self.vocab_size:
            problems.append(f"mask_token_id {self.mask_token_id} is outside the vocabulary [0, {self.vocab_size})")
        if not self.target_layer_ids:
            problems.append("target_layer_ids is empty: DSpark needs at least one tapped target layer")
        if not self.sample_from_anchor and self.block_size < 2:
            problems.append("block_size must be >= 2 for the bonus-anchor layout (sample_from_anchor=false)")
        if self.draft_topk is not None and not 1 <= self.draft_topk <= self.draft_vocab_size:
            problems.append(f"draft_topk {self.draft_topk} must be in [1, draft_vocab_size={self.draft_vocab_size}]")
        if not 0 <= self.draft_markov_topm <= self.draft_vocab_size:
            problems.append(f"draft_markov_topm {self.draft_markov_topm} must be in [0, draft_vocab_size="
                            f"{self.draft_vocab_size}]")
        if self.draft_markov_topm and self.markov_head_type != "vanilla":
            problems.append(self.union_refusal(f"draft_markov_topm {self.draft_markov_topm}", "set it to 0"))
        if not 0.0 < self.partial_rotary_factor <= 1.0:
            problems.append(f"partial_rotary_factor {self.partial_rotary_factor} must be in (0, 1]")
        if self.final_logit_softcapping is not None and not self.final_logit_softcapping > 0:
            problems.append(f"final_logit_softcapping {self.final_logit_softcapping} must be positive (or null: off)")
        if self.layer_family == "qwen3" and (self.partial_rotary_factor != 1.0 or self.attention_k_eq_v
                                             or self.final_logit_softcapping is not None):
            problems.append("partial_rotary_factor, attention_k_eq_v and final_logit_softcapping are Gemma-4 draft "
                            "layer features (layer_family 'gemma4')")
        if problems:
            raise DSparkTrtError("invalid DSpark config: " + "; ".join(problems))

    # -- derived ----------------------------------------------------------------------------------
    def union_refusal(self, asked: str, fix: str = "use --markov-topm 0") -> str:
        """Why the candidate union (``asked``: the flag or key as given) cannot run with this drafter's head."""
        return (f"{asked} needs the vanilla Markov head: this drafter's {self.markov_head_type} head biases by the "
                f"context, so no static candidate table can rank it; {fix}")

    def check_markov_topm(self, markov_topm: int) -> None:
        """Refuse a candidate union (M > 0) for a gated or RNN head, in one line (docs/kernel.md)."""
        if markov_topm and self.markov_head_type != "vanilla":
            raise DSparkTrtError(self.union_refusal(f"--markov-topm {markov_topm}"))

    @property
    def num_draft_tokens(self) -> int:
        """N: tokens proposed per round (block_size, minus the anchor slot in the bonus-anchor layout)."""
        return self.block_size if self.sample_from_anchor else self.block_size - 1

    @property
    def num_taps(self) -> int:
        """m: number of tapped target layers."""
        return len(self.target_layer_ids)

    @property
    def has_reduced_vocab(self) -> bool:
        return self.draft_vocab_size < self.vocab_size

    @property
    def hf_hidden_state_indices(self) -> list[int]:
        return hf_hidden_state_indices(self.target_layer_ids)

    def layer_attention(self, layer: int) -> tuple[int | None, bool]:
        """(context window W or None, causal inside the block) of draft layer ``layer``."""
        if self.layer_types[layer] != "sliding_attention" or self.sliding_window is None:
            return None, False
        return self.sliding_window, not self.sliding_window_non_causal

    @property
    def context_window(self) -> int | None:
        """W when every draft layer reads only the last W context rows (a sliding cache of them suffices:
        ``runtime/drafter_state.py``), else None (some layer reads the whole context)."""
        windows = {self.layer_attention(i)[0] for i in range(self.num_hidden_layers)}
        return windows.pop() if len(windows) == 1 and None not in windows else None

    @property
    def bidirectional_full_attention(self) -> bool:
        """True when every draft layer sees the whole context and the whole block (DeepSeek's architecture)."""
        return all(self.layer_attention(i) == (None, False) for i in range(self.num_hidden_layers))

    @property
    def embed_scale(self) -> float | None:
        """What the draft block's token embeddings are multiplied by: √d for Gemma-4 (cast to the model dtype
        first, as transformers' ``Gemma4TextScaledWordEmbedding``), None (no scaling) for Qwen3."""
        return float(self.hidden_size) ** 0.5 if self.layer_family == "gemma4" else None

    @property
    def confidence_input_size(self) -> int:
        return self.hidden_size + (self.markov_rank if self.confidence_head_with_markov else 0)

    def digest(self) -> str:
        """A stable sha256 of the normalised config (recorded in export manifests)."""
        fields = dataclasses.asdict(self)
        if not fields["draft_markov_topm"]:  # added later: configs without a union keep their digest
            del fields["draft_markov_topm"]
        for name, default in _LATER_DEFAULTS.items():  # the same for the Gemma-4 fields at Qwen3's values
            if fields[name] == default:
                del fields[name]
        blob = json.dumps(fields, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()

    def replace(self, **changes: Any) -> "DSparkConfig":
        return dataclasses.replace(self, **changes)

    def check_target_layers(self, num_target_layers: int) -> None:
        """Tapped ids must lie in [-1, L_t - 1] (id L_t - 1: the last layer's output before the final norm)."""
        check_layer_ids(self.target_layer_ids, num_target_layers)

    # -- loading ----------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path: str | Path) -> "DSparkConfig":
        """Read ``config.json`` (a file or the directory holding it) in either checkpoint format."""
        path = Path(path)
        if not path.exists():
            raise DSparkTrtError(f"{path} does not exist: pass a DSpark drafter checkpoint directory (config.json + "
                                 f"model.safetensors)")
        if path.is_file() and path.name != "config.json":
            raise DSparkTrtError(f"{path} is a file, not a checkpoint directory: pass the DSpark drafter checkpoint "
                                 f"directory holding config.json and model.safetensors")
        file = path / "config.json" if path.is_dir() else path
        raw = read_json(file, missing=f"no config.json at {path}: point at a DSpark checkpoint directory",
                        fix="fix or re-download the checkpoint")
        return cls.from_dict(raw, where=str(file))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], *, where: str = "config") -> "DSparkConfig":
        if not isinstance(raw, dict):
            raise DSparkTrtError(f"{where}: expected a JSON object")
        if raw.get("speculators_model_type") is not None:
            if raw["speculators_model_type"] != "dspark":
                raise DSparkTrtError(
                    f"{where}: speculators_model_type is {raw['speculators_model_type']!r}, not 'dspark'; "
                    f"dspark-trt exports DSpark drafters only"
                )
            return _from_speculators(raw, where)
        archs = raw.get("architectures") or []
        if "Gemma4DSparkModel" in archs:
            return _from_gemma4(raw, where)
        if any("DSpark" in a for a in archs) or "target_layer_ids" in raw or "dspark_target_layer_ids" in raw:
            return _from_deepseek(raw, where)
        raise DSparkTrtError(
            f"{where}: not a DSpark config (expected architectures ['Qwen3DSparkModel'] with target_layer_ids, "
            f"or speculators_model_type 'dspark'); point at the drafter directory, not the target"
        )


#: fields added after the first exports, with the value that leaves a config's digest as it was
_LATER_DEFAULTS = {"layer_family": "qwen3", "partial_rotary_factor": 1.0, "final_logit_softcapping": None,
                   "attention_k_eq_v": False}


def _require(raw: dict[str, Any], key: str, where: str) -> Any:
    if raw.get(key) is None:
        raise DSparkTrtError(f"{where}: missing required key {key!r}; the checkpoint's config.json is incomplete")
    return raw[key]


def _rope_theta(raw: dict[str, Any], where: str) -> float:
    """RoPE base from ``rope_parameters`` (newer transformers) or top-level ``rope_theta``; default RoPE only."""
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", None):
        raise DSparkTrtError(
            f"{where}: rope_type {rope_type!r} is not supported; dspark-trt implements default RoPE (Qwen3)"
        )
    theta = params.get("rope_theta", raw.get("rope_theta"))
    return float(theta if theta is not None else 10000.0)


def _backbone_fields(layer: dict[str, Any], where: str) -> dict[str, Any]:
    if layer.get("attention_bias"):
        raise DSparkTrtError(f"{where}: attention_bias=true is not supported (Qwen3 DSpark has no attention bias)")
    hidden = int(_require(layer, "hidden_size", where))
    heads = int(_require(layer, "num_attention_heads", where))
    return dict(
        hidden_size=hidden,
        intermediate_size=int(_require(layer, "intermediate_size", where)),
        num_hidden_layers=int(_require(layer, "num_hidden_layers", where)),
        num_attention_heads=heads,
        num_key_value_heads=int(layer.get("num_key_value_heads") or heads),
        head_dim=int(layer.get("head_dim") or hidden // heads),
        rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(layer, where),
    )


def _attention_problem(hidden_act: str, layer_types: tuple[str, ...], num_layers: int,
                       window: int | None, family: str = "qwen3") -> str | None:
    """The one-line refusal of an attention/MLP variant dspark-trt cannot run, or None."""
    if family == "gemma4":
        if hidden_act not in GEMMA4_HIDDEN_ACTS:
            return (f"hidden_activation {hidden_act!r} is not supported: dspark-trt implements the GELU-tanh MLP of "
                    f"Gemma-4 draft layers ({GEMMA4_HIDDEN_ACTS[0]!r})")
        if set(layer_types) - {"full_attention"} or window is not None:
            return (f"layer_types {sorted(set(layer_types))} are not all 'full_attention': a Gemma-4 DSpark drafter's "
                    f"layers attend to the whole context (DeepSpec writes full_attention for every draft layer)")
    elif hidden_act not in SUPPORTED_HIDDEN_ACTS:
        return (f"hidden_act {hidden_act!r} is not supported: dspark-trt implements the silu MLP of Qwen3 draft "
                f"layers; use a drafter trained with hidden_act 'silu'")
    bad = sorted({t for t in layer_types if t not in SUPPORTED_LAYER_TYPES})
    if bad:
        return (f"layer_types {bad} are not supported: dspark-trt implements 'full_attention' and "
                f"'sliding_attention' draft layers only")
    if len(layer_types) != num_layers:
        return (f"layer_types lists {len(layer_types)} layers but num_hidden_layers is {num_layers}; fix the "
                f"checkpoint's config.json")
    if window is not None and window < 1:
        return f"sliding_window must be >= 1 (or use_sliding_window false), got {window}"
    return None


def _attention_fields(layer: dict[str, Any], non_causal: Any, where: str) -> dict[str, Any]:
    """hidden_act and the per-layer attention pattern, read as transformers' Qwen3Config reads them."""
    num_layers = int(_require(layer, "num_hidden_layers", where))
    window = None
    if layer.get("use_sliding_window", False):
        window = layer.get("sliding_window", QWEN3_SLIDING_WINDOW)
        window = None if window is None else int(window)
    types = layer.get("layer_types")
    if types is None:
        first = int(layer.get("max_window_layers", QWEN3_MAX_WINDOW_LAYERS))
        types = ["sliding_attention" if window is not None and i >= first else "full_attention"
                 for i in range(num_layers)]
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise DSparkTrtError(f"{where}: layer_types must be a list of strings, got {types!r}")
    hidden_act = layer.get("hidden_act") or "silu"
    problem = _attention_problem(hidden_act, tuple(types), num_layers, window)
    if problem:
        raise DSparkTrtError(f"{where}: {problem}")
    return dict(hidden_act=hidden_act, layer_types=tuple(types), sliding_window=window,
                sliding_window_non_causal=bool(non_causal or False))


def _markov_head_type(raw: dict[str, Any], where: str) -> str:
    value = raw.get("markov_head_type") or "vanilla"
    if not isinstance(value, str):
        raise DSparkTrtError(f"{where}: markov_head_type must be a string, one of {list(SUPPORTED_MARKOV_HEADS)}; "
                             f"got {value!r}")
    return value.lower()


def _draft_topk(raw: dict[str, Any]) -> int | None:
    value = raw.get("draft_topk", raw.get("dspark_draft_topk"))
    return None if value in (None, 0) else int(value)


def _from_deepseek(raw: dict[str, Any], where: str) -> DSparkConfig:
    if "target_layer_ids" in raw and raw["target_layer_ids"] is not None:
        ids = raw["target_layer_ids"]
    else:
        ids = raw.get("dspark_target_layer_ids")
    if ids is None:
        raise DSparkTrtError(f"{where}: missing required key 'target_layer_ids'")
    return DSparkConfig(
        **_backbone_fields(raw, where),
        **_deepseek_dspark_fields(raw, ids, where),
        sample_from_anchor=bool(raw.get("sample_from_anchor", True)),
        **_attention_fields(raw, raw.get("sliding_window_non_causal"), where),
    )


def _deepseek_dspark_fields(raw: dict[str, Any], ids, where: str) -> dict[str, Any]:
    """The DSpark keys of a DeepSeek-format config (DeepSpec's Qwen3 and Gemma-4 drafters alike): vocabularies,
    block, taps, Markov and confidence heads, draft defaults."""
    vocab = int(_require(raw, "vocab_size", where))
    return dict(
        vocab_size=vocab,
        draft_vocab_size=int(raw.get("draft_vocab_size") or vocab),
        block_size=int(_require(raw, "block_size", where)),
        mask_token_id=int(_require(raw, "mask_token_id", where)),
        target_layer_ids=tuple(int(i) for i in ids),
        num_target_layers=None if raw.get("num_target_layers") is None else int(raw["num_target_layers"]),
        markov_rank=int(_require(raw, "markov_rank", where)),
        markov_head_type=_markov_head_type(raw, where),
        enable_confidence_head=bool(raw.get("enable_confidence_head", True)),
        confidence_head_with_markov=bool(raw.get("confidence_head_with_markov", True)),
        logit_scale=float(raw.get("logit_scale", 1.0)),
        draft_topk=_draft_topk(raw),
        draft_markov_topm=int(raw.get("draft_markov_topm") or 0),
        source_format="deepseek",
    )


def _from_speculators(raw: dict[str, Any], where: str) -> DSparkConfig:
    layer = raw.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise DSparkTrtError(f"{where}: speculators config without a transformer_layer_config object")
    vocab = int(_require(layer, "vocab_size", where + ":transformer_layer_config"))
    capture = _require(raw, "aux_hidden_state_layer_ids", where)
    verifier = (raw.get("speculators_config") or {}).get("verifier") or {}
    num_target = raw.get("num_target_layers", verifier.get("num_hidden_layers"))
    return DSparkConfig(
        vocab_size=vocab,
        draft_vocab_size=int(raw.get("draft_vocab_size") or vocab),
        **_backbone_fields(layer, where + ":transformer_layer_config"),
        block_size=int(raw.get("block_size", 8)),
        mask_token_id=int(_require(raw, "mask_token_id", where)),
        target_layer_ids=tuple(deepseek_ids_from_capture_ids([int(i) for i in capture])),
        num_target_layers=None if num_target is None else int(num_target),
        markov_rank=int(_require(raw, "markov_rank", where)),
        markov_head_type=_markov_head_type(raw, where),
        enable_confidence_head=bool(raw.get("enable_confidence_head", False)),
        confidence_head_with_markov=bool(raw.get("confidence_head_with_markov", False)),
        logit_scale=float(raw.get("logit_scale", 1.0)),
        sample_from_anchor=bool(raw.get("sample_from_anchor", True)),
        draft_topk=_draft_topk(raw),
        draft_markov_topm=int(raw.get("draft_markov_topm") or 0),
        source_format="speculators",
        **_attention_fields(layer, raw.get("sliding_window_non_causal"), where + ":transformer_layer_config"),
    )


def _gemma4_rope(raw: dict[str, Any], where: str) -> tuple[float, float]:
    """(θ, partial rotary factor) of a Gemma-4 drafter: every draft layer uses the target's ``full_attention`` RoPE
    (DeepSpec builds ``Gemma4TextRotaryEmbedding`` for ``layer_type="full_attention"``) at ``global_head_dim``."""
    params = raw.get("rope_parameters") or {}
    full = params.get("full_attention") if isinstance(params, dict) else None
    if full is None:
        full = GEMMA4_FULL_ATTENTION_ROPE
    if not isinstance(full, dict):
        raise DSparkTrtError(f"{where}: rope_parameters['full_attention'] must be an object, got {full!r}")
    rope_type = full.get("rope_type", "default")
    if rope_type not in ("proportional", "default"):
        raise DSparkTrtError(f"{where}: rope_type {rope_type!r} of the full_attention layers is not supported; "
                             f"dspark-trt implements Gemma-4's proportional and default RoPE")
    if float(full.get("factor", 1.0)) != 1.0:
        raise DSparkTrtError(f"{where}: a RoPE factor of {full['factor']} in rope_parameters['full_attention'] is not "
                             f"supported; dspark-trt implements proportional RoPE with factor 1 (Gemma-4's)")
    factor = float(full.get("partial_rotary_factor", 1.0)) if rope_type == "proportional" else 1.0
    return float(full.get("rope_theta", 1_000_000.0)), factor


def _from_gemma4(raw: dict[str, Any], where: str) -> DSparkConfig:
    """DeepSpec's ``Gemma4DSparkModel`` config (the target's Gemma-4 text config overridden by
    ``deepspec/modeling/dspark/gemma4/config.py: build_draft_config``)."""
    if raw.get("enable_moe_block"):
        raise DSparkTrtError(f"{where}: a Gemma-4 drafter with MoE blocks (enable_moe_block) is not supported (nor "
                             f"by DeepSpec's Gemma4DSparkModel); use a dense drafter")
    if int(raw.get("hidden_size_per_layer_input") or 0):
        raise DSparkTrtError(f"{where}: a Gemma-4 drafter with per-layer inputs (hidden_size_per_layer_input "
                             f"{raw['hidden_size_per_layer_input']}) is not supported (nor by DeepSpec's "
                             f"Gemma4DSparkModel)")
    if raw.get("use_double_wide_mlp") and int(raw.get("num_kv_shared_layers") or 0):
        raise DSparkTrtError(f"{where}: use_double_wide_mlp with num_kv_shared_layers > 0 would widen some draft "
                             f"layers' MLP in transformers' Gemma4TextMLP; dspark-trt does not implement that")
    k_eq_v = bool(raw.get("attention_k_eq_v", False))
    backbone = _backbone_fields({**raw, "rope_theta": None, "rope_parameters": None, "rope_scaling": None}, where)
    backbone["head_dim"] = int(_require(raw, "global_head_dim", where))
    if k_eq_v:
        backbone["num_key_value_heads"] = int(_require(raw, "num_global_key_value_heads", where))
    theta, factor = _gemma4_rope(raw, where)
    backbone["rope_theta"] = theta
    ids = _require(raw, "target_layer_ids", where)
    cap = raw.get("final_logit_softcapping")
    num_layers = backbone["num_hidden_layers"]
    types = raw.get("layer_types") or ["full_attention"] * num_layers
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise DSparkTrtError(f"{where}: layer_types must be a list of strings, got {types!r}")
    hidden_act = raw.get("hidden_activation") or raw.get("hidden_act") or GEMMA4_HIDDEN_ACTS[0]
    problem = _attention_problem(hidden_act, tuple(types), num_layers, None, "gemma4")
    if problem:
        raise DSparkTrtError(f"{where}: {problem}")
    return DSparkConfig(
        **backbone,
        **_deepseek_dspark_fields(raw, ids, where),
        sample_from_anchor=True,  # DeepSpec: every slot predicts (anchor-first)
        hidden_act=hidden_act,
        layer_types=tuple(types),
        layer_family="gemma4",
        partial_rotary_factor=factor,
        final_logit_softcapping=None if cap is None else float(cap),
        attention_k_eq_v=k_eq_v,
    )
