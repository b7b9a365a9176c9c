"""``load_drafter``: checkpoint directory → reference ``DSparkDrafter`` with its weights, contract-checked.

A speculators checkpoint names its verifier (``speculators_config.verifier.name_or_path``) but never its
layer count: ``default_target_dir`` turns that name into the default target directory when it is a local
directory that exists, and the target's ``config.json`` supplies ``num_target_layers``.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from .checkpoint import SHARED_WITH_TARGET, SafetensorsCheckpoint, check_checkpoint, expected_tensors
from .config import DSparkConfig
from .errors import DSparkTrtError
from .jsonfile import read_json

__all__ = ["load_drafter", "read_target_config", "resolve_dtype", "default_target_dir", "resolve_target_dir"]

log = logging.getLogger("dspark")

_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "fp16": torch.float16, "float16": torch.float16,
           "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in _DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in _DTYPES:
        return _DTYPES[dtype]
    raise DSparkTrtError(f"unknown dtype {dtype!r}: use one of fp32, fp16, bf16")


def read_target_config(target_dir: str | Path) -> dict:
    """The target's ``config.json`` as a dict (text-model part for multimodal configs)."""
    raw = read_json(Path(target_dir) / "config.json", fix="fix or re-download the target checkpoint",
                    missing=f"no config.json in target directory {target_dir}; pass the target model directory")
    return raw.get("text_config", raw)


def default_target_dir(model_dir: str | Path) -> Path | None:
    """The verifier a speculators checkpoint was trained against, when it is a local directory that exists.

    ``speculators_config.verifier.name_or_path`` is tried relative to the drafter directory, then as given
    (absolute, or relative to the working directory); a Hub id or a missing path gives None.
    """
    model_dir = Path(model_dir)
    try:
        raw = read_json(model_dir / "config.json", missing="no config.json", fix="fix the checkpoint")
    except DSparkTrtError:
        return None  # load_drafter reports the unreadable config itself
    verifier = ((raw.get("speculators_config") or {}).get("verifier") or {}) if isinstance(raw, dict) else {}
    name = verifier.get("name_or_path") if isinstance(verifier, dict) else None
    if not isinstance(name, str) or not name:
        return None
    for candidate in (model_dir / name, Path(name).expanduser()):
        if candidate.is_dir():
            return candidate
    return None


def resolve_target_dir(model_dir: str | Path, target_dir: str | Path | None) -> Path | None:
    """``target_dir`` when given, else the checkpoint's local verifier directory (``default_target_dir``), else None."""
    if target_dir is not None:
        return Path(target_dir)
    found = default_target_dir(model_dir)
    if found is not None:
        log.info("target: %s (the verifier named in the drafter's speculators_config)", found)
    return found


def load_drafter(
    model_dir: str | Path,
    *,
    dtype: torch.dtype | str = torch.float32,
    device: str | torch.device = "cpu",
    target_dir: str | Path | None = None,
    placeholders=None,
    num_layers: int | None = None,
):
    """Load a DSpark drafter checkpoint into the reference module.

    Args:
        model_dir (str or Path): drafter directory with ``config.json`` and ``model.safetensors`` or a sharded
            ``model.safetensors.index.json``, in DeepSeek or speculators format.
        dtype (torch.dtype or str, *optional*, defaults to fp32): parameter dtype (``d2t`` stays int64; in
            fp16, ``fc`` and ``hidden_norm`` load in fp32: ``reference/precision.py``).
        device (*optional*, defaults to "cpu").
        target_dir (*optional*): the target model directory; required when the drafter shares
            ``embed_tokens`` / ``lm_head`` with it, and used to check the tapped layer ids. Default: the
            verifier a speculators checkpoint names, when that is a local directory (``default_target_dir``).
        placeholders (*optional*): a ``streaming.Placeholders``: tensors it ``wants`` (the large ones)
            are not read but stood in for by placeholders recording where they come from (checkpoint or target
            file, name, dtype), for an export that streams its weights; the rest load as usual.
        num_layers (*optional*): only the first draft layers (validation of an export on a subset at size).

    Returns:
        ``DSparkDrafter`` in eval mode, without gradients; its ``config`` is the normalised ``DSparkConfig``.

    Example:
        >>> drafter = load_drafter("drafter/", target_dir="target/")
        >>> drafter.config.num_draft_tokens
        7
    """
    from .reference.drafter import DSparkDrafter
    from .reference.precision import parameter_dtype

    dtype = resolve_dtype(dtype)
    model_dir = Path(model_dir)
    config = DSparkConfig.from_pretrained(model_dir)
    target_dir = resolve_target_dir(model_dir, target_dir)
    target_cfg = None
    if target_dir is not None:
        target_cfg = read_target_config(target_dir)
        if config.num_target_layers is None and target_cfg.get("num_hidden_layers"):
            config = config.replace(num_target_layers=int(target_cfg["num_hidden_layers"]))
        if target_cfg.get("num_hidden_layers"):
            config.check_target_layers(int(target_cfg["num_hidden_layers"]))

    if num_layers is not None:
        k = int(num_layers)
        config = config.replace(num_hidden_layers=k, layer_types=tuple(config.layer_types[:k]))
    with SafetensorsCheckpoint(model_dir) as ck:
        shapes = ck.shapes()
        if num_layers is not None:  # the layers past the subset are not part of it
            shapes = {n: v for n, v in shapes.items()
                      if not (n.startswith("layers.") and int(n.split(".")[1]) >= config.num_hidden_layers)}
        from_target = check_checkpoint(config, shapes, model_dir=str(model_dir), target_available=target_dir is not None)
        if config.enable_confidence_head and "confidence_head.proj.weight" not in shapes:
            config = config.replace(enable_confidence_head=False)  # docs/dspark.md §3.5: confidence disabled
        spec = expected_tensors(config)
        state = {}
        for name in spec:
            if name in shapes:
                want = torch.int64 if name == "d2t" else parameter_dtype(name, dtype)
                if placeholders is not None and placeholders.wants(shapes[name][0]):
                    state[name] = _placeholder(placeholders, model_dir, name, shapes[name][0], want)
                    continue
                state[name] = ck.get(name).to(want)
    if "d2t" not in state:
        state["d2t"] = torch.zeros(config.draft_vocab_size, dtype=torch.int64)
    if from_target:
        state.update(_shared_from_target(Path(target_dir), from_target, spec, dtype,  # type: ignore[arg-type]
                                         placeholders))

    with torch.device("meta"):
        model = DSparkDrafter(config)
    model.load_state_dict(state, strict=True, assign=True)
    return model.to(device).eval().requires_grad_(False)


def _placeholder(placeholders, source: Path, key: str, shape, dtype: torch.dtype) -> torch.Tensor:
    from .streaming import Recipe

    return placeholders.tensor(Recipe(Path(source), key, tuple(int(s) for s in shape), dtype))


def _shared_from_target(target_dir: Path, names: list[str], spec, dtype: torch.dtype,
                        placeholders=None) -> dict[str, torch.Tensor]:
    out = {}
    with SafetensorsCheckpoint(target_dir) as ck:
        for name in names:
            source = next((s for s in SHARED_WITH_TARGET[name] if s in ck), None)
            if source is None:
                raise DSparkTrtError(
                    f"the drafter needs {name} from the target, but {target_dir} has none of "
                    f"{list(SHARED_WITH_TARGET[name])}; pass the target this drafter was trained for"
                )
            shape = ck.shapes()[source][0]
            if tuple(shape) != spec[name].shape:
                raise DSparkTrtError(
                    f"target tensor {source} has shape {list(shape)} but the drafter expects {name} "
                    f"{list(spec[name].shape)}; the target does not match the drafter (vocab or hidden size)"
                )
            if placeholders is not None and placeholders.wants(shape):
                out[name] = _placeholder(placeholders, target_dir, source, shape, dtype)
            else:
                out[name] = ck.get(source).to(dtype)
    return out

