"""ONNX graphs whose weights live in external data files, handled without loading the weights.

A graph over protobuf's 2 GiB cap cannot be held as one serialized ``ModelProto``: its initializers sit in a
``.data`` file beside it, each ``TensorProto`` naming ``location`` (relative to the graph's directory),
``offset`` and ``length``. Every step after the export (the plugin graph, the manifest, the engine builds) reads
the graph with ``onnx.load(path, load_external_data=False)`` — nodes, I/O and these references only — and
writes edits back the same way, so the weights are never loaded and never copied:

* ``external_refs(model)``: the references, tensor by tensor;
* ``check_external_data(model, base_dir, where)``: every referenced file exists and is long enough (one line
  naming the fix otherwise: a truncated or missing ``.data`` file would otherwise fail deep inside a parser);
* ``share_external_data(model, src_dir, dst_dir)``: make the references valid for a graph written to
  ``dst_dir``: the same directory shares the file as it is (no second copy on disk); another directory needs
  a copy, made only when asked (``copy=True``). onnx (1.23) refuses every cheaper way: a ``location`` that
  leaves the graph's directory (``../draft.onnx.data``: "points outside the directory"), a symbolic link, and a
  file with several hard links ("potential hardlink attack"), in ``onnx.checker`` and ``onnx.load`` alike;
* ``external_data_files(path)``: the data files a graph file references (for digests and disk accounting).
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..errors import DSparkTrtError

__all__ = ["ExternalRef", "external_refs", "check_external_data", "share_external_data", "external_data_files",
           "load_graph_only", "EXTERNAL_DATA_BYTES", "EXTERNAL_DATA_ALIGNMENT"]

log = logging.getLogger("dspark.export")

EXTERNAL_DATA_BYTES = 3 << 29  # 1.5 GiB: above this, weights go to <graph>.onnx.data (protobuf caps at 2 GiB)
EXTERNAL_DATA_ALIGNMENT = 1 << 16  # tensors ≥ 1 MiB start at 64 KiB offsets in .data files (mmap-able)


@dataclass(frozen=True)
class ExternalRef:
    tensor: str  # the initializer's (or constant's) name
    location: str  # relative to the graph's directory
    offset: int
    length: int | None  # None: to the end of the file


def _tensors(model) -> Iterator:
    """Every TensorProto of a model: initializers, sparse initializers' values and indices, tensor attributes,
    recursively through subgraphs and local functions."""

    def from_graph(graph):
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield sparse.values
            yield sparse.indices
        yield from from_nodes(graph.node)

    def from_nodes(nodes):
        for node in nodes:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                yield from attr.tensors
                if attr.HasField("g"):
                    yield from from_graph(attr.g)
                for g in attr.graphs:
                    yield from from_graph(g)

    yield from from_graph(model.graph)
    for function in model.functions:
        yield from from_nodes(function.node)


def _is_external(tensor) -> bool:
    import onnx

    return tensor.HasField("data_location") and tensor.data_location == onnx.TensorProto.EXTERNAL


def _entries(tensor) -> dict[str, str]:
    return {e.key: e.value for e in tensor.external_data}


def external_refs(model) -> list[ExternalRef]:
    """The external-data references of an ``onnx.ModelProto`` (loaded with ``load_external_data=False``)."""
    refs = []
    for tensor in _tensors(model):
        if _is_external(tensor):
            e = _entries(tensor)
            refs.append(ExternalRef(tensor.name, e.get("location", ""), int(e.get("offset", 0) or 0),
                                    int(e["length"]) if e.get("length") else None))
    return refs


def load_graph_only(path: str | Path):
    """``onnx.load`` without the external weights (nodes, I/O, references; inline weights of a small graph stay),
    with a one-line error for a file that is not a readable ONNX model."""
    import onnx

    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError, OSError, ...
        first = (str(e).splitlines() or [type(e).__name__])[0] or type(e).__name__
        raise DSparkTrtError(f"cannot read {path} as an ONNX model ({first}); the file is damaged or incomplete: "
                             f"re-export it") from None


def check_external_data(model, base_dir: str | Path, where: str | Path) -> list[Path]:
    """Raise one line if a referenced data file is missing, lies outside ``base_dir`` or is too short for a
    tensor; → the distinct data files (absolute), in order of first reference."""
    base = Path(base_dir)
    files: dict[Path, int] = {}
    for ref in external_refs(model):
        rel = Path(ref.location)
        if not ref.location or rel.is_absolute() or ".." in rel.parts:
            raise DSparkTrtError(f"{where}: tensor {ref.tensor} names external data {ref.location!r} outside the "
                                 f"graph's directory; re-export the graph")
        path = base / rel
        if path not in files:
            if not path.is_file():
                raise DSparkTrtError(f"{where}: the weights file {ref.location} (tensor {ref.tensor}) is missing next "
                                     f"to it; copy the whole export directory, or re-export")
            files[path] = path.stat().st_size
        end = ref.offset + (ref.length or 0)
        if end > files[path]:
            raise DSparkTrtError(f"{where}: the weights file {ref.location} holds {files[path]} bytes but tensor "
                                 f"{ref.tensor} needs bytes up to {end} (truncated copy?); copy it again, or re-export")
    return list(files)


def share_external_data(model, src_dir: str | Path, dst_dir: str | Path, *, copy: bool = False) -> list[Path]:
    """Make ``model``'s references (valid in ``src_dir``) valid for a graph file written to ``dst_dir``; → the
    data files as seen from ``dst_dir``. Same directory: shared, nothing written. Another one: refused in one
    line unless ``copy`` (each data file copied beside the new graph under its own name)."""
    src_dir, dst_dir = Path(src_dir), Path(dst_dir)
    files = check_external_data(model, src_dir, src_dir)
    if not files or (dst_dir.exists() and os.path.samefile(src_dir, dst_dir)):
        return files
    if not copy:
        raise DSparkTrtError(f"the graph's weights are in {', '.join(f.name for f in files)} beside it in {src_dir}; "
                             f"write the new graph into that directory (it shares the file: onnx accepts no link or "
                             f"path outside the graph's directory), or ask for a copy of the weights")
    copied = []
    dst_dir.mkdir(parents=True, exist_ok=True)
    for src in files:
        dst = dst_dir / src.relative_to(src_dir)
        copied.append(dst)
        if dst.exists():
            raise DSparkTrtError(f"{dst} exists: writing a graph that needs its own {src.name} there would replace "
                                 f"another graph's weights; choose another directory")
        log.warning("copying %.2f GB of weights (%s) beside the new graph in %s", src.stat().st_size / 1e9, src.name,
                    dst_dir)
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
        try:
            shutil.copyfile(src, tmp)
            os.replace(tmp, dst)
        finally:
            tmp.unlink(missing_ok=True)
    return copied


def external_data_files(onnx_path: str | Path) -> list[Path]:
    """The data files ``onnx_path`` references (absolute; empty for a graph with its weights inside), checked."""
    onnx_path = Path(onnx_path)
    return check_external_data(load_graph_only(onnx_path), onnx_path.parent, onnx_path)
