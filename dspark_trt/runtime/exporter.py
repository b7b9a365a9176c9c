"""Where the onnxruntime drafter gets graphs for a drafter *checkpoint*: an exporter provided from above.

The runtime runs exports; it never makes them (``runtime`` does not import ``export``). A drafter built from a
checkpoint (``OnnxRuntimeDrafterBackend.from_pretrained``, ``SpeculativeDecoder.from_pretrained(...,
backend="onnxruntime")``, ``dspark generate --backend onnxruntime``) therefore calls an *exporter*:

    exporter(drafter_dir, cache_dir, *, target_dir=, dtype=, topk=, markov_topm=, max_context=, validate=, target=)
        -> the export directory (read with ``artifact.ExportDir``)

It is, in this order: the ``exporter=`` argument; the one a composition module above runtime and export
installed (``set_onnx_exporter``: ``export/on_demand.py``, which the CLI and serving install); the entry point
``onnx`` of the group ``dspark_trt.exporters`` that an installed dspark-trt declares (``pyproject.toml``), for
library users who call ``from_pretrained`` directly.
"""

from __future__ import annotations

from typing import Any, Callable

from ..errors import DSparkTrtError

__all__ = ["ENTRY_POINT_GROUP", "OnnxExporter", "set_onnx_exporter", "onnx_exporter"]

ENTRY_POINT_GROUP = "dspark_trt.exporters"
OnnxExporter = Callable[..., Any]  # (drafter_dir, cache_dir, **options) -> export directory

_installed: OnnxExporter | None = None


def set_onnx_exporter(exporter: OnnxExporter | None) -> OnnxExporter | None:
    """Install the exporter checkpoints are exported with (None: none); returns the one it replaces."""
    global _installed
    before, _installed = _installed, exporter
    return before


def onnx_exporter(exporter: OnnxExporter | None = None) -> OnnxExporter:
    """``exporter``, else the installed one, else the installed package's entry point; one line naming the fix."""
    if exporter is not None:
        return exporter
    if _installed is not None:
        return _installed
    from importlib.metadata import entry_points

    for point in entry_points(group=ENTRY_POINT_GROUP, name="onnx"):
        return point.load()
    raise DSparkTrtError("the onnxruntime drafter was asked to run a checkpoint, and no ONNX exporter is installed; "
                         "export it first (dspark-export DRAFTER --target TARGET -o OUT) and run the export, or "
                         "call dspark_trt.export.on_demand.install() (or reinstall dspark-trt: pip install -e .)")
