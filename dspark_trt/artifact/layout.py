"""The names of an export directory's entries: where each file of an export lives, relative to its root.

    manifest.json                  what was built, from what, with which versions (``artifact/manifest.py``)
    onnx/context.onnx              taps → per-layer context K/V (``artifact/drafter_io.py``)
    onnx/draft.onnx                one draft round
    onnx/draft.plugin.onnx         top-k: the graph full TensorRT builds
    onnx/target.onnx               the target model, prefill + verify (``artifact/target_io.py``)
    tokenizer/                     the target's tokenizer files
    plugin/*.ptx, *.json           top-k: the walk kernel's PTX
    engines/<graph>.<suffix>       TensorRT (``plan``) or TensorRT-RTX (``rtx.plan``) engines

Exports written before format version 2 also hold ``onnx/onnx_export.json`` (``LEGACY_ONNX_MANIFEST``: the
drafter's spec, versions and ``d2t``, now the manifest's ``drafter`` section); a drafter-only ONNX directory of
that time held the graphs and that file side by side, without ``manifest.json``.
"""

from __future__ import annotations

__all__ = ["MANIFEST_FILE", "LEGACY_ONNX_MANIFEST", "FORMAT_VERSION", "READ_FORMAT_VERSIONS", "ONNX_DIR",
           "ENGINES_DIR", "PLUGIN_DIR", "TOKENIZER_DIR", "GRAPHS", "GRAPH_FILES", "PLUGIN_GRAPH", "TARGET_ONNX",
           "EXPORT_ENTRIES", "ENGINE_SUFFIX", "engine_file"]

MANIFEST_FILE = "manifest.json"
LEGACY_ONNX_MANIFEST = "onnx_export.json"  # format 1: the drafter's record beside its graphs
FORMAT_VERSION = 2  # 1: manifest.json + onnx/onnx_export.json; 2: one manifest (its ``drafter`` section)
READ_FORMAT_VERSIONS = (1, 2)

ONNX_DIR = "onnx"
ENGINES_DIR = "engines"
PLUGIN_DIR = "plugin"
TOKENIZER_DIR = "tokenizer"

GRAPHS = ("context", "draft")
#: the drafter's graphs, relative to the export root
GRAPH_FILES = {"context": f"{ONNX_DIR}/context.onnx", "draft": f"{ONNX_DIR}/draft.onnx"}
PLUGIN_GRAPH = f"{ONNX_DIR}/draft.plugin.onnx"
TARGET_ONNX = f"{ONNX_DIR}/target.onnx"

#: the top-level entries of an export directory: ``--force`` replaces these and leaves anything else in OUT
EXPORT_ENTRIES = (MANIFEST_FILE, ONNX_DIR, PLUGIN_DIR, ENGINES_DIR, TOKENIZER_DIR)
ENGINE_SUFFIX = {"tensorrt": "plan", "tensorrt-rtx": "rtx.plan"}


def engine_file(graph: str, flavor: str) -> str:
    """``engines/<graph>.plan`` (TensorRT) or ``engines/<graph>.rtx.plan`` (TensorRT-RTX), relative to the root."""
    return f"{ENGINES_DIR}/{graph}.{ENGINE_SUFFIX[flavor]}"
