"""Tiny, deterministic DSpark drafter + Hugging Face target pairs, so the whole pipeline runs offline.

``write_tiny_checkpoint(out)`` writes ``out/target/`` (a random ``transformers`` Qwen3, Qwen2 or Llama causal LM,
``save_pretrained``) and ``out/drafter/`` (random weights in the exact DeepSeek or speculators layout, with
``embed_tokens`` / ``lm_head`` copied from the target as the real checkpoints do). Defaults are small
enough for fast CPU tests yet exercise the real structure: vocabulary 2500 (≥ 2048 for ``--topk 512``),
2 drafter layers, 6 target layers with 3 taps, GQA (4 query / 2 KV heads).

The weights depend on ``seed`` only, not on ``format``: the same seed in both formats loads to the same
drafter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, NamedTuple

import torch

from ..atomic import atomic_output_dir, write_marker
from ..checkpoint import expected_tensors
from ..config import DSparkConfig
from ..errors import DSparkTrtError
from .drafter_config import deepseek_drafter_config, speculators_drafter_config

__all__ = ["TinyCheckpoint", "write_tiny_checkpoint", "tiny_config", "TARGET_FAMILIES"]

#: target family → transformers config class (Qwen2: q/k/v biases; Llama: no q/k norm; Qwen3: q/k norm)
TARGET_FAMILIES = {"qwen3": "Qwen3Config", "qwen2": "Qwen2Config", "llama": "LlamaConfig"}


class TinyCheckpoint(NamedTuple):
    drafter: Path
    target: Path


def _default_taps(num_target_layers: int) -> tuple[int, ...]:
    """Three taps spread over the target, never its last layer (DeepSeek ids)."""
    last = num_target_layers - 2
    return tuple(sorted({1, max(1, last // 2), last}))


def tiny_config(
    *,
    vocab_size: int = 2500,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_layers: int = 2,
    num_target_layers: int = 6,
    target_layer_ids: tuple[int, ...] | None = None,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    head_dim: int = 16,
    markov_rank: int = 16,
    markov_head_type: str = "vanilla",
    block_size: int = 7,
    draft_vocab_size: int | None = None,
    sample_from_anchor: bool = True,
    logit_scale: float = 1.0,
    confidence_head: bool = True,
    mask_token_id: int | None = None,
    layer_types: tuple[str, ...] | None = None,
    sliding_window: int | None = None,
    sliding_window_non_causal: bool = False,
) -> DSparkConfig:
    """The ``DSparkConfig`` a tiny checkpoint with these options loads to."""
    return DSparkConfig(
        vocab_size=vocab_size,
        draft_vocab_size=draft_vocab_size or vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        head_dim=head_dim,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        block_size=block_size,
        mask_token_id=vocab_size - 1 if mask_token_id is None else mask_token_id,
        target_layer_ids=tuple(target_layer_ids or _default_taps(num_target_layers)),
        num_target_layers=num_target_layers,
        markov_rank=markov_rank,
        markov_head_type=markov_head_type,  # type: ignore[arg-type]
        enable_confidence_head=confidence_head,
        confidence_head_with_markov=confidence_head,
        logit_scale=logit_scale,
        sample_from_anchor=sample_from_anchor,
        layer_types=tuple(layer_types or ()),
        sliding_window=sliding_window,
        sliding_window_non_causal=sliding_window_non_causal,
    )


def write_tiny_checkpoint(
    out_dir: str | Path,
    *,
    format: Literal["deepseek", "speculators"] = "deepseek",
    target_family: Literal["qwen3", "qwen2", "llama"] = "qwen3",
    seed: int = 0,
    force: bool = False,
    target_init_std: float = 0.02,
    **options,
) -> TinyCheckpoint:
    """Write ``out_dir/drafter`` and ``out_dir/target``; return their paths.

    Args:
        out_dir: created atomically; an earlier output (it has ``manifest.json``) is replaced only with ``force``.
        format: drafter checkpoint layout, ``"deepseek"`` (self-contained) or ``"speculators"`` (shares
            ``embed_tokens``, and ``lm_head`` when the vocabulary is not reduced, with the target).
        target_family: ``"qwen3"``, ``"qwen2"`` or ``"llama"`` target architecture.
        seed: the only source of randomness.
        target_init_std: the target's ``initializer_range`` (larger → peakier target distributions).
        **options: ``tiny_config`` fields (vocab_size, hidden_size, markov_rank, block_size, num_layers,
            draft_vocab_size, sample_from_anchor, ...).

    Example:
        >>> drafter_dir, target_dir = write_tiny_checkpoint("/tmp/tiny", seed=0)
    """
    if format not in ("deepseek", "speculators"):
        raise DSparkTrtError(f"unknown checkpoint format {format!r}: use 'deepseek' or 'speculators'")
    if target_family not in TARGET_FAMILIES:
        raise DSparkTrtError(f"unknown target family {target_family!r}: use one of {', '.join(TARGET_FAMILIES)}")
    config = tiny_config(**options)
    with atomic_output_dir(out_dir, force=force) as tmp:
        target_tensors, target_config = _write_target(tmp / "target", config, target_family, seed, target_init_std)
        tensors = _drafter_tensors(config, target_tensors, seed)
        _write_drafter(tmp / "drafter", config, tensors, target_config, format)
        write_marker(tmp, "write_tiny_checkpoint", format=format, target_family=target_family, seed=seed,
                     target_init_std=target_init_std, options=options)
    out = Path(out_dir)
    return TinyCheckpoint(drafter=out / "drafter", target=out / "target")


def _write_target(path: Path, c: DSparkConfig, family: str, seed: int, init_std: float):
    import transformers

    common = dict(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_target_layers,
        num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads,
        head_dim=c.head_dim,
        max_position_embeddings=4096,
        rms_norm_eps=c.rms_norm_eps,
        tie_word_embeddings=False,
        initializer_range=init_std,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    cfg = getattr(transformers, TARGET_FAMILIES[family])(**common)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    from ..hf import no_progress_bars

    with no_progress_bars():
        model.save_pretrained(path, safe_serialization=True)
    state = model.state_dict()
    return {"embed_tokens": state["model.embed_tokens.weight"], "lm_head": state["lm_head.weight"]}, json.loads(
        (path / "config.json").read_text()
    )


def _drafter_tensors(c: DSparkConfig, target: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed + 1)
    out: dict[str, torch.Tensor] = {}
    draft_ids = torch.arange(c.vocab_size)
    if c.has_reduced_vocab:
        draft_ids = torch.randperm(c.vocab_size, generator=gen)[: c.draft_vocab_size].sort().values
    for name, spec in sorted(expected_tensors(c).items()):
        if name == "embed_tokens.weight":
            out[name] = target["embed_tokens"].clone()
        elif name == "lm_head.weight":
            out[name] = target["lm_head"][draft_ids].clone()
        elif name == "d2t":
            out[name] = draft_ids - torch.arange(c.draft_vocab_size)
        elif name.endswith("norm.weight"):
            out[name] = 1.0 + 0.1 * torch.randn(spec.shape, generator=gen)
        elif name.startswith("markov_head."):
            out[name] = 0.2 * torch.randn(spec.shape, generator=gen)
        elif name == "confidence_head.proj.bias":
            out[name] = torch.zeros(spec.shape)
        elif name == "confidence_head.proj.weight":
            out[name] = 0.1 * torch.randn(spec.shape, generator=gen)
        else:
            out[name] = 0.02 * torch.randn(spec.shape, generator=gen)
    if c.has_reduced_vocab:
        t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
        t2d[draft_ids] = True
        out["t2d"] = t2d
    return out


def _write_drafter(path: Path, c: DSparkConfig, tensors, target_config: dict, format: str) -> None:
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    if format == "deepseek":
        config = deepseek_drafter_config(c, target_config)
        tensors = {k: v for k, v in tensors.items() if k != "t2d"}
    else:
        config = speculators_drafter_config(c, target_config)
        drop = {"embed_tokens.weight"} | (set() if c.has_reduced_vocab else {"lm_head.weight", "d2t"})
        tensors = {k: v for k, v in tensors.items() if k not in drop}
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"),
              metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
