"""Write a preset (``presets.py``) as a checkpoint directory with random weights, streamed tensor by tensor.

    write_preset("dspark_qwen3_8b_block7", "ckpt/drafter")                        # 4.74 GB, one model.safetensors
    write_preset("qwen3_8b", "ckpt/target")                                       # 16.4 GB, 5 shards + index
    write_preset("dspark_qwen3_8b_block7", "ckpt/pair", with_target=True,         # pair/drafter + pair/target,
                 layers=1, target_layers=8, vocab=4096, format="speculators")    # like the tiny pair

Weights: normal(0, 0.02) matrices, norm weights 1, the confidence bias 0 — the initialisation of
transformers' Qwen3, so bf16 forward passes stay finite. Each chunk of each tensor is drawn from a generator
seeded by (seed, tensor, chunk) (``safetensors_stream.random_chunks``): the same seed and options give the
same bytes, single file or sharded, and a DeepSeek drafter's ``embed_tokens`` / ``lm_head`` are its target's
(as in a real release, which copies them from the target). Host memory stays at one chunk (64 MB of fp32)
above the interpreter, whatever the checkpoint's size.

The target gets the byte-level tokenizer of the embedded demo pair (``byte_tokenizer.write_byte_tokenizer``: ids
0…255 are UTF-8 bytes, 256 is ``<|mask|>``), so text prompts, ``dspark generate`` and the export's
``tokenizer/`` work; ids above 256 exist in the model but decode to nothing. The vocabulary must hold those
257 ids. The output is written atomically; free disk is checked before anything is written.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..atomic import atomic_output_dir, check_output_dir, write_marker
from ..errors import DSparkTrtError
from .byte_tokenizer import write_byte_tokenizer
from .drafter_config import deepseek_drafter_config, speculators_drafter_config
from .gemma4_presets import Gemma4DrafterPreset, Gemma4TargetPreset
from .presets import (MIN_TOKENIZER_VOCAB, DrafterPreset, TargetPreset, drafter_tensor_shapes, get_preset,
                      parameter_count, scaled, target_tensor_shapes)
from .safetensors_stream import (DTYPES, TensorPlan, constant_chunks, format_size, is_disk_full, parse_size,
                                 random_chunks, sharded_bytes, write_sharded)

__all__ = ["MARKER", "INIT_STD", "WrittenCheckpoint", "write_preset", "plan_preset", "PlannedDir"]

log = logging.getLogger("dspark")

MARKER = "dspark_checkpoint.json"  # marks a directory make-checkpoint wrote (so --force may replace it)
INIT_STD = 0.02  # transformers' Qwen3 initializer_range
METADATA = {"format": "pt"}
SMALL_FILES_BYTES = 4 << 20  # config, generation config, tokenizer, index, marker: well under this
#: drafter tensor → the target tensor whose random bytes it shares (a release copies them from its target)
SHARED_KEYS = {"embed_tokens.weight": "model.embed_tokens.weight", "lm_head.weight": "lm_head.weight"}


@dataclass(frozen=True)
class PlannedDir:
    """One checkpoint directory to write: its JSON files, its tensors and how they are sharded."""

    kind: str  # "drafter" or "target"
    subdir: str  # "" (the output itself), "drafter" or "target"
    json_files: dict[str, dict]
    tensors: list[TensorPlan]
    shard_bytes: int | None
    tokenizer: bool

    @property
    def parameters(self) -> int:
        return sum(p.numel for p in self.tensors)

    @property
    def nbytes(self) -> int:
        """Bytes on disk (safetensors files and index; the small files counted in ``SMALL_FILES_BYTES``)."""
        return sharded_bytes(self.tensors, self.shard_bytes, metadata=METADATA)


@dataclass(frozen=True)
class WrittenCheckpoint:
    path: Path  # the output directory
    drafter: Path | None  # the drafter checkpoint directory, when one was written
    target: Path | None  # the target directory, when one was written
    parameters: int
    nbytes: int  # bytes written, all files


def _plans(shapes: dict[str, tuple[int, ...]], dtype: torch.dtype, seed: int, key: Callable[[str], str]) -> list[TensorPlan]:
    plans = []
    for name, shape in shapes.items():
        n = math.prod(shape)
        if name.endswith("norm.weight") or name.endswith("layer_scalar"):
            chunks = constant_chunks(n, dtype, 1.0)
        elif name == "confidence_head.proj.bias":
            chunks = constant_chunks(n, dtype, 0.0)
        else:
            chunks = random_chunks(n, dtype, std=INIT_STD, seed=seed, key=key(name))
        plans.append(TensorPlan(name, tuple(shape), dtype, chunks))
    return plans


def _shard_bytes(value: str | int | None, default: str | None) -> int | None:
    value = default if value is None else value
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "0", "")):
        return None
    return parse_size(value)


def _target_dir(t: TargetPreset, dtype: str, seed: int, shard_size, subdir: str) -> PlannedDir:
    if t.vocab_size < MIN_TOKENIZER_VOCAB:
        raise DSparkTrtError(f"a target needs vocab_size >= {MIN_TOKENIZER_VOCAB} for its byte-level tokenizer (ids 0…256); "
                             f"got --vocab {t.vocab_size}")
    plans = _plans(target_tensor_shapes(t), DTYPES[dtype][0], seed, key=lambda name: name)
    files = {"config.json": t.config_json(dtype), "generation_config.json": t.generation_config_json()}
    return PlannedDir("target", subdir, files, plans, _shard_bytes(shard_size, t.shard_size), tokenizer=True)


def _drafter_dir(p: DrafterPreset, format: str, dtype: str, seed: int, shard_size, subdir: str,
                 with_target: bool) -> PlannedDir:
    target_config = p.target.config_json(dtype)
    if isinstance(p, Gemma4DrafterPreset):
        drafter_tensor_shapes(p, format)  # refuses a speculators layout
        config = p.config_json(dtype)
    elif format == "deepseek":
        config = deepseek_drafter_config(p.config(), target_config)
    else:
        config = speculators_drafter_config(p.config(), target_config)
        config["speculators_config"]["verifier"]["name_or_path"] = "../target" if with_target else p.target.hub_id
    shared = dict(SHARED_KEYS)
    if p.target.tie_word_embeddings:  # a tied target's lm_head is its embed_tokens
        shared["lm_head.weight"] = "model.embed_tokens.weight"
    plans = _plans(drafter_tensor_shapes(p, format), DTYPES[dtype][0], seed,
                   key=lambda name: shared.get(name, f"dspark.{name}"))
    return PlannedDir("drafter", subdir, {"config.json": config}, plans, _shard_bytes(shard_size, None), tokenizer=False)


def plan_preset(preset: str | TargetPreset | DrafterPreset, *, format: str | None = None, layers: int | None = None,
                target_layers: int | None = None, vocab: int | None = None, shard_size: str | int | None = None,
                target_shard_size: str | int | None = None, dtype: str = "bf16", seed: int = 0,
                with_target: bool = False, **shape) -> list[PlannedDir]:
    """What ``write_preset`` writes with these options (nothing is written); see ``write_preset``."""
    p = get_preset(preset) if isinstance(preset, str) else preset
    if format is None:
        format = getattr(p, "format", "deepseek")  # the release's own layout
    if format not in ("deepseek", "speculators"):
        raise DSparkTrtError(f"unknown checkpoint format {format!r}: use 'deepseek' or 'speculators'")
    if dtype not in DTYPES:
        raise DSparkTrtError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    p = scaled(p, layers=layers, target_layers=target_layers, vocab=vocab, **shape)
    if isinstance(p, (TargetPreset, Gemma4TargetPreset)):
        if with_target or target_layers is not None or target_shard_size is not None:
            raise DSparkTrtError(f"{p.name} is a target preset: --with-target, --target-layers and --target-shard-size "
                                 f"apply to drafter presets")
        return [_target_dir(p, dtype, seed, shard_size, "")]
    if not with_target:
        if target_shard_size is not None:
            raise DSparkTrtError("--target-shard-size needs --with-target (the target is written only with it)")
        return [_drafter_dir(p, format, dtype, seed, shard_size, "", False)]
    return [_drafter_dir(p, format, dtype, seed, shard_size, "drafter", True),
            _target_dir(p.target, dtype, seed, target_shard_size, "target")]


def _check_free_disk(out: Path, need: int) -> None:
    probe = Path(os.path.abspath(out))
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return  # check_output_dir reports a path below a file
    free = shutil.disk_usage(probe).free
    if free < need:
        raise DSparkTrtError(f"not enough free disk for {out}: the checkpoint needs {format_size(need)}, "
                             f"{probe} has {format_size(free)} free; free some space, choose another directory, or "
                             f"write a smaller model (--layers, --target-layers, --vocab)")


def write_preset(preset: str | TargetPreset | DrafterPreset, out_dir: str | Path, *, format: str | None = None,
                 layers: int | None = None, target_layers: int | None = None, vocab: int | None = None,
                 shard_size: str | int | None = None, target_shard_size: str | int | None = None,
                 dtype: str = "bf16", seed: int = 0, with_target: bool = False, force: bool = False,
                 progress: bool = False, **shape) -> WrittenCheckpoint:
    """Write a preset with random weights to ``out_dir``, atomically; return what was written.

    Args:
        preset: a preset name (``presets.PRESETS``) or object.
        format: drafter layout, ``"deepseek"`` (self-contained) or ``"speculators"`` (embed_tokens and lm_head
            from the target); default: the release's own (``DrafterPreset.format``).
        layers, target_layers, vocab, **shape: ``presets.scaled`` options (a smaller model of the same family).
        shard_size: shard limit (``"2GB"``, bytes; ``"none"``: one file) of the drafter, or of a target preset;
            default: drafters one ``model.safetensors``, targets the release's limit (4 GB for Qwen3-8B).
        target_shard_size: the same for the target written with ``with_target``.
        dtype: ``"bf16"``, ``"fp16"`` or ``"fp32"``.
        seed: the only source of randomness.
        with_target: for a drafter preset, write ``out_dir/drafter`` and ``out_dir/target`` (its target
            preset, scaled alike), laid out like the tiny pair; a speculators drafter names ``../target``.
        force: replace an earlier output of ``write_preset`` (it holds ``dspark_checkpoint.json``).
        progress: a progress bar on stderr.
    """
    planned = plan_preset(preset, format=format, layers=layers, target_layers=target_layers, vocab=vocab,
                          shard_size=shard_size, target_shard_size=target_shard_size, dtype=dtype, seed=seed,
                          with_target=with_target, **shape)
    name = preset if isinstance(preset, str) else preset.name
    if format is None:
        format = getattr(get_preset(preset) if isinstance(preset, str) else preset, "format", "deepseek")
    out = check_output_dir(out_dir, force=force, marker=MARKER)
    weight_bytes = sum(d.nbytes for d in planned)
    need = weight_bytes + SMALL_FILES_BYTES
    _check_free_disk(out, need)
    bar = _progress_bar(weight_bytes, f"writing {name}", progress)
    try:
        with atomic_output_dir(out, force=force, marker=MARKER) as tmp:
            files = {}
            for d in planned:
                where = tmp / d.subdir if d.subdir else tmp
                where.mkdir(parents=True, exist_ok=True)
                for file, content in d.json_files.items():
                    (where / file).write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")
                if d.tokenizer:
                    write_byte_tokenizer(where)
                files[d.subdir or "."] = write_sharded(where, d.tensors, shard_bytes=d.shard_bytes, metadata=METADATA,
                                                       progress=bar.update)
            write_marker(tmp, "write_preset", marker=MARKER, preset=name, format=format, dtype=dtype, seed=seed,
                         layers=layers, target_layers=target_layers, vocab=vocab, shape=shape or None,
                         with_target=with_target, parameters=sum(d.parameters for d in planned),
                         weight_bytes=weight_bytes, files=files)
    except OSError as e:
        if is_disk_full(e):
            raise DSparkTrtError(f"the disk filled up while writing {out} (nothing was left behind): the checkpoint "
                                 f"needs {format_size(need)} of free disk") from None
        raise
    finally:
        bar.close()
    out = Path(out_dir)
    written = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    where = {d.kind: out / d.subdir if d.subdir else out for d in planned}
    return WrittenCheckpoint(out, where.get("drafter"), where.get("target"), sum(d.parameters for d in planned),
                             written)


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(total: int, desc: str, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, file=sys.stderr, mininterval=2, leave=False)
