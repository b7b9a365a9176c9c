"""What ``dspark generate -v`` and ``dspark gpu-check`` print about the runtime's device memory."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dspark_trt.runtime.device_memory import describe_reserved, format_bytes, reserved_device_memory


@pytest.mark.parametrize("n, text", [(0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (12 << 20, "12.0 MiB"),
                                     (9 * (1 << 30) + (1 << 29), "9.5 GiB")])
def test_format_bytes(n, text):
    assert format_bytes(n) == text


def test_engines_report_their_scratch_and_cpu_parts_nothing():
    """A part that holds device memory of its own reports it (the TensorRT backends: one scratch per engine);
    parts on the CPU add nothing, and a CPU-only decoder reserves nothing."""
    target = SimpleNamespace(device=torch.device("cpu"),
                             reserved_device_memory=lambda: {"target engine scratch": 3 << 30})
    backend = SimpleNamespace(device=torch.device("cpu"),
                              reserved_device_memory=lambda: {"context engine scratch": 1 << 20,
                                                              "draft engine scratch": 5 << 20})
    report = reserved_device_memory(SimpleNamespace(target=target, backend=backend))
    assert list(report) == ["target engine scratch", "context engine scratch", "draft engine scratch"]
    assert describe_reserved(report) == ("target engine scratch 3.0 GiB, context engine scratch 1.0 MiB, draft engine "
                                         "scratch 5.0 MiB")
    plain = SimpleNamespace(target=SimpleNamespace(device=torch.device("cpu")), backend=SimpleNamespace())
    assert reserved_device_memory(plain) == {}
    assert describe_reserved({}) == "none (the models run on the CPU)"


@pytest.mark.gpu
def test_cuda_parts_add_the_caching_allocators_reservation():
    keep = torch.empty(4 << 20, dtype=torch.uint8, device="cuda")
    part = SimpleNamespace(device=torch.device("cuda"))
    report = reserved_device_memory(SimpleNamespace(target=part, backend=part))
    (name,) = report
    assert name == f"CUDA caching allocator (cuda:{torch.cuda.current_device()})" and report[name] >= keep.numel()
