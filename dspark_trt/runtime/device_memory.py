"""The device memory a decoder's runtime holds, as ``dspark generate -v`` and ``dspark gpu-check`` print it.

    report = reserved_device_memory(decoder)   # {"draft engine scratch": 12582912, ..., "CUDA caching allocator
                                               #  (cuda:0)": 1610612736}
    describe_reserved(report)                  # "draft engine scratch 12.0 MiB, ..., CUDA caching allocator ..."

A target or drafter backend that reserves device memory of its own says so with ``reserved_device_memory()``
(the TensorRT ones: one scratch buffer per engine, shared by all its execution contexts, and what TensorRT
allocated itself for the engine — its weights — counted by the runtime's allocator, ``tensorrt_memory``). The CUDA caching
allocator's total for each device the decoder uses comes last: it includes those buffers (they are torch
tensors, and TensorRT's allocator allocates through it), the static graph buffers, the CUDA-graph pools and the
models' weights.
"""

from __future__ import annotations

import torch

__all__ = ["format_bytes", "reserved_device_memory", "describe_reserved"]

_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def format_bytes(n: int) -> str:
    """``1536`` → ``"1.5 KiB"``; below a KiB in bytes."""
    for unit, size in _UNITS:
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def reserved_device_memory(decoder) -> dict[str, int]:
    """Name → bytes: what the target and the drafter backend report (``reserved_device_memory()``), then the
    CUDA caching allocator's reservation on each CUDA device they run on. Empty on a CPU-only decoder."""
    report: dict[str, int] = {}
    devices = []
    for part in (decoder.target, decoder.backend):
        own = getattr(part, "reserved_device_memory", None)
        if own is not None:
            report.update({name: int(n) for name, n in own().items()})
        device = getattr(part, "device", None)
        if device is not None and torch.device(device).type == "cuda":
            device = torch.device(device)
            device = torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
            if device not in devices:
                devices.append(device)
    for device in devices:
        report[f"CUDA caching allocator ({device})"] = int(torch.cuda.memory_reserved(device))
    return report


def describe_reserved(report: dict[str, int]) -> str:
    """One line: every entry of ``reserved_device_memory``'s report, or why there is none."""
    if not report:
        return "none (the models run on the CPU)"
    return ", ".join(f"{name} {format_bytes(n)}" for name, n in report.items())
