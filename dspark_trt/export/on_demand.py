"""The exporter the runtime's onnxruntime drafter calls for a checkpoint (``runtime/exporter.py``): the
content-addressed ONNX export cache (``export/onnx.py: cached_onnx_export``), imported when first called.

    from dspark_trt.export import on_demand
    on_demand.install()          # what dspark generate and serving do before building a decoder

It is also the ``onnx`` entry point of the ``dspark_trt.exporters`` group (``pyproject.toml``).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["export_onnx", "install"]


def export_onnx(drafter_dir: str | Path, cache_dir: str | Path | None = None, **options) -> Path:
    """``cached_onnx_export``: the drafter-only export directory of this checkpoint and these options."""
    from .onnx import cached_onnx_export

    return cached_onnx_export(drafter_dir, cache_dir, **options)


def install() -> None:
    """Make ``export_onnx`` the runtime's exporter for checkpoints (``runtime.exporter.set_onnx_exporter``)."""
    from ..runtime.exporter import set_onnx_exporter

    set_onnx_exporter(export_onnx)
