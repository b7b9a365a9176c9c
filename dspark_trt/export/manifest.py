"""``manifest.json``: what an export directory holds, how it was built, and with which versions.

Every later tool (``dspark build-engine``, the runtime backends, Triton repository generation) reads the
manifest instead of guessing. ``graph_io`` reads an ONNX file's inputs/outputs; ``check_manifest``
verifies a directory against its manifest (files present, I/O equal to the ONNX files) and is what the
tests and ``build-engine`` use.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from pathlib import Path
from typing import Any

from ..config import DSparkConfig
from ..errors import DSparkTrtError

__all__ = ["MANIFEST_FILE", "FORMAT_VERSION", "graph_io", "new_manifest", "read_manifest", "check_manifest",
           "package_versions", "op_contract_version", "check_op_contract_version"]

MANIFEST_FILE = "manifest.json"
FORMAT_VERSION = 1

_ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
                10: "float16", 11: "float64", 16: "bfloat16"}


def graph_io(onnx_path: str | Path) -> dict[str, list[dict[str, Any]]]:
    """{"inputs": [...], "outputs": [...]} with name, dtype and dims (symbolic dims by name)."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}

    def describe(value) -> dict[str, Any]:
        t = value.type.tensor_type
        dims = [d.dim_param if d.dim_param else int(d.dim_value) for d in t.shape.dim]
        return {"name": value.name, "dtype": _ONNX_DTYPES.get(t.elem_type, str(t.elem_type)), "shape": dims}

    return {
        "inputs": [describe(v) for v in model.graph.input if v.name not in inits],
        "outputs": [describe(v) for v in model.graph.output],
    }


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


def check_manifest(export_dir: str | Path, manifest: dict[str, Any] | None = None) -> list[str]:
    """Problems with an export directory (empty list = consistent): missing files, I/O differing from the ONNX."""
    export_dir = Path(export_dir)
    manifest = manifest if manifest is not None else read_manifest(export_dir)
    problems = []
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
