"""``--device``: a torch device that exists here, or a one-line error saying why not and what to do."""

from __future__ import annotations

import torch

from .errors import DSparkTrtError

__all__ = ["resolve_device"]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``None`` → ``cuda`` when a CUDA device is visible, else ``cpu``; ``cpu`` / ``cuda[:i]`` checked."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise DSparkTrtError(f"unknown device {device!r}: use cpu or cuda[:i]") from None
    if resolved.type == "cuda":
        if torch.version.cuda is None:
            raise DSparkTrtError(f"--device {device}: this torch ({torch.__version__}) is a CPU-only build; install a "
                                 f"CUDA build of torch (pytorch.org/get-started) or use --device cpu")
        if not torch.cuda.is_available():
            raise DSparkTrtError(f"--device {device}: no CUDA device is visible (driver, CUDA_VISIBLE_DEVICES?); "
                                 f"use --device cpu")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise DSparkTrtError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    elif resolved.type != "cpu":
        raise DSparkTrtError(f"--device {device}: dspark-trt runs on cpu or cuda[:i]")
    return resolved
