"""``manifest.json``: what an export directory holds, how it was built, and with which versions.

Every later tool (``dspark build-engine``, the runtime backends, Triton repository generation) reads the
manifest instead of guessing. ``graph_io`` reads an ONNX file's inputs/outputs; ``check_manifest``
verifies a directory against its manifest (files present, I/O equal to the ONNX files) and is what the
tests and ``build-engine`` use.

``files`` lists every file of the export (the graphs' external ``.data`` files included) with its size and
sha256, hashed in chunks (``file_sha256``: memory stays at one chunk whatever the file's size, so a multi-GB
graph or engine costs its read time, never its size in memory). Graphs are read with
``load_external_data=False``: nothing here loads weights.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from pathlib import Path
from typing import Any

from ..config import DSparkConfig
from ..errors import DSparkTrtError

__all__ = ["MANIFEST_FILE", "FORMAT_VERSION", "graph_io", "new_manifest", "read_manifest", "check_manifest",
           "package_versions", "op_contract_version", "check_op_contract_version", "file_sha256", "file_records"]

MANIFEST_FILE = "manifest.json"
FORMAT_VERSION = 1

HASH_CHUNK = 1 << 24  # 16 MiB per read: the most a digest holds in memory

_ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
                10: "float16", 11: "float64", 16: "bfloat16"}


def graph_io(onnx_path: str | Path) -> dict[str, list[dict[str, Any]]]:
    """{"inputs": [...], "outputs": [...]} with name, dtype and dims (symbolic dims by name)."""
    from .external_data import load_graph_only

    model = load_graph_only(onnx_path)
    inits = {i.name for i in model.graph.initializer}

    def describe(value) -> dict[str, Any]:
        t = value.type.tensor_type
        dims = [d.dim_param if d.dim_param else int(d.dim_value) for d in t.shape.dim]
        return {"name": value.name, "dtype": _ONNX_DTYPES.get(t.elem_type, str(t.elem_type)), "shape": dims}

    return {
        "inputs": [describe(v) for v in model.graph.input if v.name not in inits],
        "outputs": [describe(v) for v in model.graph.output],
    }


def file_sha256(path: str | Path, chunk: int = HASH_CHUNK) -> str:
    """sha256 of a file, read ``chunk`` bytes at a time into one reused buffer."""
    import hashlib

    h = hashlib.sha256()
    buf = bytearray(chunk)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def file_records(export_dir: str | Path, files=None) -> dict[str, dict[str, Any]]:
    """{relative path: {"bytes", "sha256"}} for ``files`` (default: every file below ``export_dir`` except the
    manifest and hidden entries such as temporary directories), sorted by path; streamed digests."""
    export_dir = Path(export_dir)
    if files is None:
        files = [p for p in export_dir.rglob("*") if p.is_file() and p.name != MANIFEST_FILE
                 and not any(part.startswith(".") for part in p.relative_to(export_dir).parts)]
    records = {}
    for path in sorted(Path(f) for f in files):
        path = path if path.is_absolute() else export_dir / path
        records[path.relative_to(export_dir).as_posix()] = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
    return records


def package_versions() -> dict[str, str | None]:
    from ..env import PACKAGES, _version, tensorrt_status

    versions = {name: _version(name) for name in PACKAGES}
    versions["tensorrt (import)"] = tensorrt_status("tensorrt")
    return versions


def new_manifest(
    config: DSparkConfig,
    *,
    model_dir: str | Path,
    topk: int | None,
    dtype: str,
    graphs: dict[str, Path],
    markov_topm: int = 0,
    export_dir: Path,
    plugin: dict | None = None,
    kernel: dict | None = None,
    extra: dict | None = None,
) -> dict[str, Any]:
    """The manifest for an export: config, shapes, I/O of each ONNX graph, plugin and kernel facts, versions."""
    from .. import __version__
    from ..plugins.contract import OP_CONTRACT_VERSION

    return {
        "format_version": FORMAT_VERSION,
        "dspark_trt_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "checkpoint": {
            "path": str(Path(model_dir).resolve()),
            "format": config.source_format,
            "config_digest": config.digest(),
            "config": dataclasses.asdict(config),
        },
        "layer_id_convention": "deepseek (id i = output of target decoder layer i)",
        "target_layer_ids": list(config.target_layer_ids),
        "hf_hidden_state_indices": config.hf_hidden_state_indices,
        "block_size": config.block_size,
        "num_draft_tokens": config.num_draft_tokens,
        "sample_from_anchor": config.sample_from_anchor,
        "topk": topk,
        "markov_topm": int(markov_topm),  # candidate union width M (0 = none)
        "op_contract_version": OP_CONTRACT_VERSION if markov_topm else 1,  # readers: absent = 1
        "dtype": dtype,
        "graphs": {
            name: {"file": str(Path(path).relative_to(export_dir)), **graph_io(path)} for name, path in graphs.items()
        },
        "plugin": plugin,
        "kernel": kernel,
        "engines": {},
        "packages": package_versions(),
        **(extra or {}),
    }


def op_contract_version(manifest: dict[str, Any]) -> int:
    """The export's ``dspark`` op contract version (``plugins/contract.py``): 1 when absent (exports made before
    the candidate union), 2 when the draft graph uses ``DSparkTopKMarkovUnion``."""
    return int(manifest.get("op_contract_version") or 1)


def check_op_contract_version(manifest: dict[str, Any], path: str | Path) -> None:
    """Refuse, in one line naming the fix, an export whose op contract is newer than this dspark-trt reads."""
    from ..plugins.contract import OP_CONTRACT_VERSION

    version = op_contract_version(manifest)
    if version > OP_CONTRACT_VERSION:
        raise DSparkTrtError(f"{path} uses dspark op contract version {version}, this dspark-trt reads versions "
                             f"<= {OP_CONTRACT_VERSION}; upgrade dspark-trt, or re-export with this version's "
                             f"dspark-export")


def read_manifest(export_dir: str | Path) -> dict[str, Any]:
    from ..jsonfile import read_json

    path = Path(export_dir) / MANIFEST_FILE
    manifest = read_json(path, missing=f"{export_dir} has no {MANIFEST_FILE}: point at a directory written by "
                                      f"dspark-export", fix="re-run dspark-export")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise DSparkTrtError(f"{path} has format_version {manifest.get('format_version')}, this dspark-trt reads "
                             f"{FORMAT_VERSION}; re-run dspark-export with this version")
    check_op_contract_version(manifest, path)
    return manifest


def check_manifest(export_dir: str | Path, manifest: dict[str, Any] | None = None, *,
                   digests: bool = False) -> list[str]:
    """Problems with an export directory (empty list = consistent): missing files, I/O differing from the ONNX,
    a graph's external data missing or short, a listed file of another size (``digests``: or another sha256,
    streamed)."""
    from .external_data import external_data_files

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
