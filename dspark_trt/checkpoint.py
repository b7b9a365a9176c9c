"""DSpark checkpoints: lazy safetensors reading (single file or sharded) and the checkpoint contract.

``expected_tensors(config)`` is the whole contract as data (name → shape); ``check_checkpoint`` compares
a checkpoint with it and reports *every* violation at once, sorted, in one ``CheckpointContractError``.
Weights that DSpark drafters share with their target (``embed_tokens``; ``lm_head`` when V_d = V) may be
absent, and are then read from the target checkpoint (docs/dspark.md §3.5).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .config import DSparkConfig
from .errors import CheckpointContractError, DSparkTrtError

__all__ = [
    "SafetensorsCheckpoint",
    "expected_tensors",
    "check_checkpoint",
    "SHARED_WITH_TARGET",
    "IGNORED_TENSORS",
    "markov_head_tensors",
]

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")

#: drafter tensor name → tensor name in a Hugging Face target checkpoint (tried in order)
SHARED_WITH_TARGET = {
    "embed_tokens.weight": ("model.embed_tokens.weight", "embed_tokens.weight"),
    "lm_head.weight": ("lm_head.weight", "model.embed_tokens.weight"),  # 2nd: tied embeddings
}
#: tensors that may appear in a checkpoint and are dropped on load (training-only or unused)
IGNORED_TENSORS = ("t2d", "mask_embedding", "verifier_lm_head.weight", "verifier_norm.weight")

LAYER_TENSORS = (
    "input_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)
#: a Gemma-4 draft layer's (DeepSpec's Gemma4DSparkModel): the Qwen3 layer's with a norm before and after the MLP and
#: ``layer_scalar``; no v_proj with attention_k_eq_v, and v_norm has no weight
_ATTENTION_END = LAYER_TENSORS.index("post_attention_layernorm.weight") + 1
GEMMA4_LAYER_TENSORS = (LAYER_TENSORS[:_ATTENTION_END] + ("pre_feedforward_layernorm.weight",)
                        + LAYER_TENSORS[_ATTENTION_END:] + ("post_feedforward_layernorm.weight", "layer_scalar"))


class SafetensorsCheckpoint:
    """Shard-aware, lazy view of a directory of safetensors files; host memory ≈ one tensor at a time.

    Example:
        >>> with SafetensorsCheckpoint("ckpt/") as ck:
        ...     w2 = ck.get("markov_head.markov_w2.weight")
    """

    def __init__(self, model_dir: str | Path):
        self.model_dir = Path(model_dir)
        self._weight_map = _weight_map(self.model_dir)  # tensor name -> file name
        self._handles: dict[str, object] = {}
        self._meta: dict[str, tuple[list[int], str]] | None = None

    def __enter__(self) -> "SafetensorsCheckpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for handle in self._handles.values():
            handle.__exit__(None, None, None)  # type: ignore[attr-defined]
        self._handles.clear()

    def _handle(self, file: str):
        from safetensors import safe_open

        if file not in self._handles:
            path = self.model_dir / file
            if not path.is_file():
                raise DSparkTrtError(f"{self.model_dir}: shard {file} named in {INDEX_FILE} is missing")
            try:
                handle = safe_open(str(path), framework="pt", device="cpu")
                self._handles[file] = handle.__enter__()
            except Exception as e:  # safetensors raises its own error types for corrupt headers
                raise DSparkTrtError(f"{path} is not a readable safetensors file ({e}); re-download it") from None
        return self._handles[file]

    def keys(self) -> list[str]:
        return sorted(self._weight_map)

    def __contains__(self, name: str) -> bool:
        return name in self._weight_map

    def shapes(self) -> dict[str, tuple[list[int], str]]:
        """name → (shape, dtype string) from the headers, without reading any data."""
        if self._meta is None:
            self._meta = {}
            for name, file in self._weight_map.items():
                sl = self._handle(file).get_slice(name)
                self._meta[name] = (list(sl.get_shape()), str(sl.get_dtype()))
        return self._meta

    def get(self, name: str):
        if name not in self._weight_map:
            raise KeyError(name)
        return self._handle(self._weight_map[name]).get_tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())


def _weight_map(model_dir: Path) -> dict[str, str]:
    if not model_dir.is_dir():
        raise DSparkTrtError(f"{model_dir} is not a directory; pass the checkpoint directory")
    index = model_dir / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise DSparkTrtError(f"{index} has no readable weight_map ({e}); re-download the checkpoint") from None
        return {str(k): str(v) for k, v in weight_map.items()}
    single = model_dir / SINGLE_FILE
    if single.is_file():
        from safetensors import safe_open

        try:
            with safe_open(str(single), framework="pt", device="cpu") as f:
                return {k: SINGLE_FILE for k in f.keys()}
        except Exception as e:
            raise DSparkTrtError(f"{single} is not a readable safetensors file ({e}); re-download it") from None
    loose = sorted(p.name for p in model_dir.glob("*.safetensors"))
    if len(loose) == 1:
        from safetensors import safe_open

        with safe_open(str(model_dir / loose[0]), framework="pt", device="cpu") as f:
            return {k: loose[0] for k in f.keys()}
    pickles = sorted(p.name for p in model_dir.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise DSparkTrtError(
            f"{model_dir} holds only pickle weights ({', '.join(pickles)}); dspark-trt refuses pickle files because "
            f"loading them can execute arbitrary code: convert them to safetensors "
            f"(safetensors.torch.save_file(torch.load(f, weights_only=True), 'model.safetensors'))"
        )
    raise DSparkTrtError(f"{model_dir} has no {SINGLE_FILE} or {INDEX_FILE}; point at a safetensors checkpoint")


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    optional: str | None = None  # why it may be absent, or None when required


def expected_tensors(config: DSparkConfig) -> dict[str, TensorSpec]:
    """The checkpoint contract as data: every tensor a DSpark drafter checkpoint may hold, with its shape."""
    c = config
    d, r, D = c.hidden_size, c.markov_rank, c.head_dim
    q_out, kv_out = c.num_attention_heads * D, c.num_key_value_heads * D
    shapes: dict[str, TensorSpec] = {
        "embed_tokens.weight": TensorSpec((c.vocab_size, d), optional="target"),
        "fc.weight": TensorSpec((d, c.num_taps * d)),
        "hidden_norm.weight": TensorSpec((d,)),
        "norm.weight": TensorSpec((d,)),
        "lm_head.weight": TensorSpec((c.draft_vocab_size, d), optional=None if c.has_reduced_vocab else "target"),
        "markov_head.markov_w1.weight": TensorSpec((c.vocab_size, r)),
        "markov_head.markov_w2.weight": TensorSpec((c.draft_vocab_size, r)),
        **markov_head_tensors(c),
    }
    per_layer = {
        "input_layernorm.weight": (d,),
        "self_attn.q_proj.weight": (q_out, d),
        "self_attn.k_proj.weight": (kv_out, d),
        "self_attn.v_proj.weight": (kv_out, d),
        "self_attn.o_proj.weight": (d, q_out),
        "self_attn.q_norm.weight": (D,),
        "self_attn.k_norm.weight": (D,),
        "post_attention_layernorm.weight": (d,),
        "mlp.gate_proj.weight": (c.intermediate_size, d),
        "mlp.up_proj.weight": (c.intermediate_size, d),
        "mlp.down_proj.weight": (d, c.intermediate_size),
    }
    assert tuple(per_layer) == LAYER_TENSORS
    if c.layer_family == "gemma4":
        per_layer = _gemma4_layer(per_layer, d, c.attention_k_eq_v)
    for i in range(c.num_hidden_layers):
        for name, shape in per_layer.items():
            shapes[f"layers.{i}.{name}"] = TensorSpec(shape)
    if c.enable_confidence_head:
        shapes["confidence_head.proj.weight"] = TensorSpec((1, c.confidence_input_size), optional="confidence")
        shapes["confidence_head.proj.bias"] = TensorSpec((1,), optional="confidence")
    shapes["d2t"] = TensorSpec((c.draft_vocab_size,), optional=None if c.has_reduced_vocab else "identity")
    return shapes


def _gemma4_layer(qwen3: dict[str, tuple[int, ...]], d: int, k_eq_v: bool) -> dict[str, tuple[int, ...]]:
    """A Gemma-4 draft layer's tensors: the Qwen3 layer's (at D = global_head_dim), the two feed-forward norms and
    ``layer_scalar``; no ``v_proj`` with ``attention_k_eq_v``."""
    shapes = {**qwen3, "pre_feedforward_layernorm.weight": (d,), "post_feedforward_layernorm.weight": (d,),
              "layer_scalar": (1,)}
    if k_eq_v:
        del shapes["self_attn.v_proj.weight"]
    out = {name: shapes[name] for name in GEMMA4_LAYER_TENSORS if name in shapes}
    assert len(out) == len(shapes)
    return out


def markov_head_tensors(config: DSparkConfig) -> dict[str, TensorSpec]:
    """The head-specific Markov tensors (speculators', NeMo AutoModel's and DeepSpec's names; docs/dspark.md §5):
    gated ``gate_proj`` Linear(d + r → r) over [h ; W1[d]], rnn ``joint_proj`` Linear(2r + d → 3r) over
    [state ; W1[d] ; h] with outputs [gate ; candidate ; output]; none for vanilla."""
    d, r = config.hidden_size, config.markov_rank
    if config.markov_head_type == "gated":
        return {"markov_head.gate_proj.weight": TensorSpec((r, d + r)), "markov_head.gate_proj.bias": TensorSpec((r,))}
    if config.markov_head_type == "rnn":
        return {"markov_head.joint_proj.weight": TensorSpec((3 * r, 2 * r + d)),
                "markov_head.joint_proj.bias": TensorSpec((3 * r,))}
    return {}


def check_checkpoint(
    config: DSparkConfig,
    tensor_shapes: dict[str, tuple[list[int], str]],
    *,
    model_dir: str = "checkpoint",
    target_available: bool = False,
) -> list[str]:
    """Check a checkpoint's tensors (name → (shape, dtype)) against the contract; raise on any violation.

    Returns the names that must come from the target checkpoint (empty when self-contained).
    Raises ``CheckpointContractError`` listing every violation, sorted.
    """
    spec = expected_tensors(config)
    violations: list[str] = []
    from_target: list[str] = []
    present = {n for n in tensor_shapes if n not in IGNORED_TENSORS}

    for name, ts in spec.items():
        if name in present:
            shape = tuple(tensor_shapes[name][0])
            if shape != ts.shape:
                violations.append(f"{name} has shape {list(shape)}, expected {list(ts.shape)} from config.json")
            continue
        if ts.optional == "target":
            from_target.append(name)
            if not target_available:
                violations.append(
                    f"{name} is absent: DSpark drafters share it with the target, so pass the target checkpoint "
                    f"(target_dir= / --target DIR)"
                )
        elif ts.optional is None:
            if name == "lm_head.weight":
                violations.append(
                    f"checkpoint must include lm_head weights: draft_vocab_size {config.draft_vocab_size} < "
                    f"vocab_size {config.vocab_size}, so the target's head cannot stand in; re-export the drafter "
                    f"with its lm_head.weight"
                )
            elif name == "d2t":
                violations.append(
                    f"checkpoint must include a d2t token mapping: draft_vocab_size {config.draft_vocab_size} < "
                    f"vocab_size {config.vocab_size}; save the drafter with its d2t tensor [draft_vocab_size]"
                )
            elif name in markov_head_tensors(config):
                violations.append(f"missing tensor {name} (expected shape {list(ts.shape)}): config.json has "
                                  f"markov_head_type={config.markov_head_type!r}, whose head needs it; fix "
                                  f"markov_head_type or save the drafter with its whole Markov head")
            else:
                violations.append(f"missing tensor {name} (expected shape {list(ts.shape)})")
    conf = ("confidence_head.proj.weight", "confidence_head.proj.bias")
    if config.enable_confidence_head and sum(n in present for n in conf) == 1:
        missing = next(n for n in conf if n not in present)
        violations.append(f"missing tensor {missing}: the confidence head needs both its weight and its bias")
    for name in sorted(present - set(spec)):
        hint = ""
        if name.startswith("confidence_head.") and not config.enable_confidence_head:
            hint = " (config.json has enable_confidence_head=false)"
        elif name.startswith(("markov_head.gate_proj.", "markov_head.joint_proj.")):
            hint = (f" (config.json has markov_head_type={config.markov_head_type!r}; a "
                    f"{'gated' if 'gate_proj' in name else 'rnn'} head's tensor: fix markov_head_type)")
        elif name.endswith(".self_attn.v_proj.weight") and config.attention_k_eq_v:
            hint = " (config.json has attention_k_eq_v=true: V is the k_proj output)"
        elif name.startswith("layers."):
            hint = f" (config.json has num_hidden_layers={config.num_hidden_layers})"
        violations.append(f"unexpected tensor {name}{hint}")
    if "d2t" in present and tensor_shapes["d2t"][1] not in ("I64", "I32", "int64", "int32"):
        violations.append(f"d2t has dtype {tensor_shapes['d2t'][1]}, expected an integer offset table (int64)")
    if config.num_target_layers is not None:
        bad = [i for i in config.target_layer_ids if not -1 <= i <= config.num_target_layers - 1]
        if bad:
            violations.append(
                f"target_layer_ids {list(config.target_layer_ids)} contain {bad} outside [-1, "
                f"{config.num_target_layers - 1}] for num_target_layers={config.num_target_layers} (DeepSeek "
                f"convention: id i = output of target decoder layer i)"
            )
    if violations:
        raise CheckpointContractError(model_dir, violations)
    return sorted(from_target)
