"""``ExportDir``: one export directory, for writing and reading, through its one manifest.

    out = ExportDir("out/")                       # nothing read yet
    out.topk, out.dtype, out.max_context          # the drafter graphs' settings (manifest read once, checked)
    out.graph_path("draft")                       # out/onnx/draft.onnx
    out.target                                    # the target section (one line saying how to add it when absent)
    out.write_manifest(manifest)                  # manifest.json, atomically (the writer: export/)

Like TensorRT-LLM's ``Engine.save()`` / ``Engine.from_dir()`` through one config, every reader (the runtime's
targets and drafters, build-engine, serving, bench, tools) asks this class, and the one writer (``export/``)
writes through it. It also reads what older dspark-trt versions wrote (``artifact/layout.py``): a format-1
export (``manifest.json`` + ``onnx/onnx_export.json``) and a format-1 drafter-only ONNX directory (the graphs
beside ``onnx_export.json``); ``OUT/onnx`` of a current export reads as ``OUT``.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

from ..errors import DSparkTrtError
from .layout import FORMAT_VERSION, GRAPH_FILES, LEGACY_ONNX_MANIFEST, MANIFEST_FILE, ONNX_DIR, PLUGIN_GRAPH

__all__ = ["ExportDir", "DEFAULT_MAX_CONTEXT", "not_an_export", "read_manifest", "check_manifest"]

DEFAULT_MAX_CONTEXT = 8192  # what exports recorded no bound for were built with


def not_an_export(path: str | Path) -> str | None:
    """Why ``path`` is not an export directory, in one line naming what it is and the command to run, when it is
    plainly something else: a missing path, a file, or a drafter checkpoint (its ``config.json``; a pair
    directory of ``drafter/`` + ``target/`` whose ``manifest.json`` has no ``format_version``). None otherwise
    (an export, or a directory this cannot tell: reading its manifest says what is wrong)."""
    path = Path(path)
    if not path.exists():
        return f"{path} does not exist: pass an export directory (written by dspark-export -o OUT)"
    if not path.is_dir():
        return f"{path} is a file, not an export directory: pass the directory dspark-export -o OUT wrote"
    manifest = path / MANIFEST_FILE
    if (path / LEGACY_ONNX_MANIFEST).is_file() or (path / ONNX_DIR).is_dir():
        return None
    if (path / "config.json").is_file() and not manifest.is_file():
        return (f"{path} is a drafter checkpoint, not an export directory: export it (dspark-export {path} -o OUT, "
                f"then --export OUT) or run it as it is (--drafter {path} --target TARGET_DIR)")
    if (path / "drafter" / "config.json").is_file() and _format_version(manifest) is None:
        drafter, target = path / "drafter", path / "target"
        return (f"{path} is a drafter checkpoint (drafter/ + target/), not an export directory: export it "
                f"(dspark-export {drafter} --target {target} -o OUT, then --export OUT) or run it as it is "
                f"(--drafter {drafter} --target {target})")
    return None


def _format_version(manifest: Path) -> Any:
    try:
        record = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return None
    return record.get("format_version") if isinstance(record, dict) else None


class ExportDir:
    """An export directory: its layout, its manifest (read once, lazily, in the current form) and its writer.

    Args:
        path: the export's root (``dspark-export -o OUT``), ``OUT/onnx``, or a format-1 drafter-only ONNX
            directory.
    """

    def __init__(self, path: str | Path):
        path = Path(path)
        if (not (path / MANIFEST_FILE).is_file() and not (path / LEGACY_ONNX_MANIFEST).is_file()
                and path.name == ONNX_DIR and (path.parent / MANIFEST_FILE).is_file()):
            path = path.parent  # OUT/onnx of an export: its root
        self.root = path

    def __repr__(self) -> str:
        return f"ExportDir({str(self.root)!r})"

    def __fspath__(self) -> str:
        return str(self.root)

    # -- reading -------------------------------------------------------------------------------------------
    @property
    def manifest_path(self) -> Path:
        return self.root / MANIFEST_FILE

    def exists(self) -> bool:
        """Whether the directory holds an export (a manifest of any format)."""
        return self.manifest_path.is_file() or (self.root / LEGACY_ONNX_MANIFEST).is_file()

    @cached_property
    def manifest(self) -> dict[str, Any]:
        """The manifest in the current form: format and op-contract versions checked, a format-1 export's
        ``onnx_export.json`` folded in as the ``drafter`` section."""
        from ..jsonfile import read_json
        from .manifest import check_format_version, check_op_contract_version, legacy_onnx_manifest, upgrade_manifest

        not_export = not_an_export(self.root)
        if not_export is not None:
            raise DSparkTrtError(not_export)
        legacy = self.root / LEGACY_ONNX_MANIFEST
        if not self.manifest_path.is_file() and legacy.is_file():  # a format-1 drafter-only ONNX directory
            record = read_json(legacy, missing="", fix="export the drafter again")
            check_format_version(record, legacy)
            check_op_contract_version(record, legacy)
            return legacy_onnx_manifest(record)
        manifest = read_json(self.manifest_path, missing=f"{self.root} has no {MANIFEST_FILE}: point at a directory "
                                                         f"written by dspark-export", fix="re-run dspark-export")
        check_format_version(manifest, self.manifest_path)
        check_op_contract_version(manifest, self.manifest_path)
        record_path = self.root / ONNX_DIR / LEGACY_ONNX_MANIFEST
        if manifest.get("drafter") is None and record_path.is_file():
            manifest = upgrade_manifest(manifest, read_json(record_path, missing="", fix="re-run dspark-export"))
        return manifest

    def reload(self) -> "ExportDir":
        """A fresh view (the manifest is read again)."""
        return ExportDir(self.root)

    @property
    def format_version(self) -> int:
        return int(self.manifest["format_version"])

    @property
    def drafter(self) -> dict[str, Any]:
        """The drafter's ONNX record: ``spec`` (topk, dtype, max_context, target, markov_topm), ``versions``,
        ``d2t`` (reduced vocabularies)."""
        section = self.manifest.get("drafter")
        if not section or not section.get("spec"):
            raise DSparkTrtError(f"{self.root} has no drafter record (neither a drafter section in {MANIFEST_FILE} "
                                 f"nor onnx/{LEGACY_ONNX_MANIFEST}); export the drafter again")
        return section

    @property
    def spec(self) -> dict[str, Any]:
        """The drafter export's spec as written (``export.onnx.ExportSpec`` fields)."""
        return dict(self.drafter["spec"])

    @property
    def config(self):
        """The drafter's ``DSparkConfig`` as exported."""
        from ..config import DSparkConfig

        raw = self.manifest["checkpoint"]["config"]
        return DSparkConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})

    @property
    def topk(self) -> int | None:
        return self.manifest.get("topk")

    @property
    def markov_topm(self) -> int:
        """The candidate union width M of the draft graph (0: none)."""
        return int(self.manifest.get("markov_topm") or 0)

    @property
    def op_contract_version(self) -> int:
        from .manifest import op_contract_version

        return op_contract_version(self.manifest)

    @property
    def dtype(self) -> str:
        return self.manifest["dtype"]

    @property
    def max_context(self) -> int:
        """The longest context the graphs accept (the engine profile's bound)."""
        value = self.manifest.get("max_context")
        if value is None:
            value = ((self.manifest.get("drafter") or {}).get("spec") or {}).get("max_context")
        return int(value if value is not None else DEFAULT_MAX_CONTEXT)

    @property
    def num_draft_tokens(self) -> int:
        return int(self.manifest["num_draft_tokens"])

    @property
    def d2t(self) -> list[int] | None:
        """[V_d] draft → target id offsets of a reduced draft vocabulary (None: the full vocabulary)."""
        return (self.manifest.get("drafter") or {}).get("d2t")

    @property
    def validation(self) -> list[str] | None:
        return self.manifest.get("validation")

    def graph_path(self, name: str) -> Path:
        """The drafter graph ``name`` (``context``, ``draft``, or ``plugin``: the graph full TensorRT builds)."""
        if name == "plugin":
            return self.root / (self.manifest.get("plugin_graph") or PLUGIN_GRAPH)
        graph = (self.manifest.get("graphs") or {}).get(name)
        if graph is None:
            raise DSparkTrtError(f"{self.manifest_path} lists no {name} graph: it is not a complete export; re-run "
                                 f"dspark-export")
        return self.root / graph["file"]

    @property
    def graph_paths(self) -> dict[str, Path]:
        """{"context": …, "draft": …}: the drafter's two graphs."""
        return {name: self.graph_path(name) for name in GRAPH_FILES}

    @property
    def has_target(self) -> bool:
        return bool(self.manifest.get("target"))

    @property
    def target(self) -> dict[str, Any]:
        """The ``target`` section, its K/V interface checked; one line saying how to add it when absent."""
        from .target_io import target_section

        return target_section(self.root, self.manifest)

    @property
    def tokenizer_dir(self) -> Path | None:
        """The exported target's tokenizer directory (None: no target, or one without tokenizer files)."""
        section = self.manifest.get("target") or {}
        return self.root / section["tokenizer"] if section.get("tokenizer") else None

    @property
    def engines(self) -> dict[str, dict[str, Any]]:
        """{graph: {"file", "flavor", …}} of the built engines (empty: none built yet)."""
        return dict(self.manifest.get("engines") or {})

    def engine_path(self, name: str) -> Path | None:
        engine = self.engines.get(name)
        return self.root / engine["file"] if engine else None

    @property
    def kernel_dir(self) -> Path | None:
        kernel = self.manifest.get("kernel")
        return self.root / kernel.get("dir", "plugin") if kernel else None

    def check(self, *, digests: bool = False) -> list[str]:
        """Problems with the directory against its manifest (empty: consistent; ``check_manifest``)."""
        return check_manifest(self.root, self.manifest, digests=digests)

    # -- writing (export/) -----------------------------------------------------------------------------------
    def write_manifest(self, manifest: dict[str, Any]) -> None:
        """Write ``manifest.json`` atomically, in the current format (the one writer of it)."""
        from ..atomic import atomic_write_text

        manifest["format_version"] = FORMAT_VERSION
        atomic_write_text(self.manifest_path, json.dumps(manifest, indent=2) + "\n")
        self.__dict__.pop("manifest", None)


def read_manifest(export_dir: str | Path) -> dict[str, Any]:
    """The manifest of an export directory, in the current form (``ExportDir(export_dir).manifest``)."""
    return ExportDir(export_dir).manifest


def check_manifest(export_dir: str | Path, manifest: dict[str, Any] | None = None, *,
                   digests: bool = False) -> list[str]:
    """Problems with an export directory (empty list = consistent): missing files, I/O differing from the ONNX,
    a graph's external data missing or short, a listed file of another size (``digests``: or another sha256,
    streamed)."""
    from ..cache import file_sha256
    from .external_data import external_data_files
    from .manifest import graph_io

    export_dir = Path(export_dir)
    manifest = manifest if manifest is not None else read_manifest(export_dir)
    problems = []
    for rel, record in (manifest.get("files") or {}).items():
        path = export_dir / rel
        if not path.is_file():
            problems.append(f"file {rel} is missing")
        elif path.stat().st_size != record["bytes"]:
            problems.append(f"file {rel} has {path.stat().st_size} bytes, the manifest says {record['bytes']}")
        elif digests and file_sha256(path) != record["sha256"]:
            problems.append(f"file {rel} differs from the manifest's sha256")
    graph_files = [g["file"] for g in manifest.get("graphs", {}).values()] + \
        [f for f in (manifest.get("plugin_graph"), (manifest.get("target") or {}).get("onnx")) if f]
    for rel in graph_files:
        if (export_dir / rel).is_file():
            try:
                external_data_files(export_dir / rel)
            except DSparkTrtError as e:
                problems.append(str(e))
    for name, graph in manifest.get("graphs", {}).items():
        path = export_dir / graph["file"]
        if not path.is_file():
            problems.append(f"graph {name}: {graph['file']} is missing")
            continue
        actual = graph_io(path)
        for side in ("inputs", "outputs"):
            if actual[side] != graph[side]:
                problems.append(f"graph {name}: manifest {side} differ from {graph['file']}")
    target = manifest.get("target")
    if target:
        path = export_dir / target["onnx"]
        if not path.is_file():
            problems.append(f"target graph {target['onnx']} is missing")
        elif any(graph_io(path)[k] != target["io"][k] for k in ("inputs", "outputs")):
            problems.append(f"target: manifest io differs from {target['onnx']}")
        for name in target.get("tokenizer_files") or []:
            if not (export_dir / target["tokenizer"] / name).is_file():
                problems.append(f"target tokenizer file {target['tokenizer']}/{name} is missing")
    for name, engine in manifest.get("engines", {}).items():
        if not (export_dir / engine["file"]).is_file():
            problems.append(f"engine {name}: {engine['file']} is missing")
    kernel = manifest.get("kernel") or {}
    for entry in kernel.get("kernels", []):
        path = export_dir / kernel.get("dir", "") / entry["file"]
        if not path.is_file():
            problems.append(f"kernel file {path.relative_to(export_dir)} is missing")
    return problems
