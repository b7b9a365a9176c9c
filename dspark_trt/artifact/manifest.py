"""``manifest.json``: what an export directory holds, how it was built, and with which versions — as a dict.

Every later tool (``dspark build-engine``, the runtime backends, Triton repository generation) reads the
manifest through ``ExportDir`` (``artifact/export_dir.py``) instead of guessing. ``new_manifest`` builds one;
``upgrade_manifest`` turns what an older export holds (format 1: ``manifest.json`` + ``onnx/onnx_export.json``,
or a drafter-only ONNX directory with ``onnx_export.json`` alone) into the current form; ``graph_io`` reads an
ONNX file's inputs/outputs; ``file_records`` lists files with their sizes and digests (``check_manifest``, in
``export_dir.py``, verifies a directory against its manifest).

The drafter's ONNX record (its export spec, the versions that traced it, the ``d2t`` table of a reduced
vocabulary) is the manifest's ``drafter`` section; format 1 kept it in ``onnx/onnx_export.json``.

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

from ..cache import file_sha256
from ..config import DSparkConfig
from ..errors import DSparkTrtError
from .layout import FORMAT_VERSION, MANIFEST_FILE, READ_FORMAT_VERSIONS

__all__ = ["MANIFEST_FILE", "FORMAT_VERSION", "graph_io", "new_manifest", "package_versions", "op_contract_version",
           "check_op_contract_version", "check_format_version", "file_records", "upgrade_manifest",
           "legacy_onnx_manifest"]

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
    model_dir: str | Path | None,
    topk: int | None,
    dtype: str,
    graphs: dict[str, Path],
    markov_topm: int = 0,
    export_dir: Path,
    plugin: dict | None = None,
    kernel: dict | None = None,
    extra: dict | None = None,
    drafter: dict | None = None,
) -> dict[str, Any]:
    """The manifest for an export: config, shapes, I/O of each ONNX graph, plugin and kernel facts, versions;
    ``drafter``: the ONNX step's record (``{"spec", "versions", "d2t"?}``)."""
    from .. import __version__
    from ..plugins.contract import op_contract_version_for

    return {
        "format_version": FORMAT_VERSION,
        "dspark_trt_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "checkpoint": {
            "path": str(Path(model_dir).resolve()) if model_dir is not None else None,
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
        # readers: absent = 1
        "op_contract_version": op_contract_version_for(config.markov_head_type, markov_topm),
        "dtype": dtype,
        "graphs": {
            name: {"file": str(Path(path).relative_to(export_dir)), **graph_io(path)} for name, path in graphs.items()
        },
        "plugin": plugin,
        "kernel": kernel,
        "engines": {},
        "packages": package_versions(),
        "drafter": drafter,
        **(extra or {}),
    }


def op_contract_version(manifest: dict[str, Any]) -> int:
    """The export's ``dspark`` op contract version (``plugins/contract.py``): 1 when absent (exports made before
    the candidate union), 2 when the draft graph uses ``DSparkTopKMarkovUnion``, 3 for ``DSparkTopKMarkovGated`` or
    ``DSparkTopKMarkovRNN``."""
    return int(manifest.get("op_contract_version") or 1)


def check_op_contract_version(manifest: dict[str, Any], path: str | Path) -> None:
    """Refuse, in one line naming the fix, an export whose op contract is newer than this dspark-trt reads."""
    from ..plugins.contract import OP_CONTRACT_VERSION

    version = op_contract_version(manifest)
    if version > OP_CONTRACT_VERSION:
        raise DSparkTrtError(f"{path} uses dspark op contract version {version}, this dspark-trt reads versions "
                             f"<= {OP_CONTRACT_VERSION}; upgrade dspark-trt, or re-export with this version's "
                             f"dspark-export")


def check_format_version(manifest: dict[str, Any], path: str | Path) -> None:
    """Refuse, in one line naming the fix, a manifest of a format this dspark-trt does not read."""
    if manifest.get("format_version") not in READ_FORMAT_VERSIONS:
        raise DSparkTrtError(f"{path} has format_version {manifest.get('format_version')}, this dspark-trt reads "
                             f"{', '.join(map(str, READ_FORMAT_VERSIONS))}; re-run dspark-export with this version")


def upgrade_manifest(manifest: dict[str, Any], onnx_record: dict[str, Any] | None) -> dict[str, Any]:
    """A format-1 ``manifest.json`` and its ``onnx/onnx_export.json`` as one manifest of the current form (the
    record becomes the ``drafter`` section; the graph files stay where they are). A current one is returned as
    it is."""
    if manifest.get("drafter") is not None or onnx_record is None:
        return manifest
    upgraded = dict(manifest)
    upgraded["drafter"] = _drafter_section(onnx_record)
    if upgraded.get("validation") is None:
        upgraded["validation"] = onnx_record.get("validation")
    return upgraded


def legacy_onnx_manifest(record: dict[str, Any], onnx_dir: str | Path | None = None) -> dict[str, Any]:
    """The manifest of a format-1 drafter-only ONNX directory (graphs and ``onnx_export.json`` side by side)."""
    spec, config = record.get("spec") or {}, record.get("config") or {}
    graphs = {name: {"file": g["file"], "inputs": g.get("inputs", []), "outputs": g.get("outputs", [])}
              for name, g in (record.get("graphs") or {}).items()}
    return {
        "format_version": record.get("format_version"),
        "checkpoint": {"path": None, "format": config.get("source_format"),
                       "config_digest": record.get("config_digest"), "config": config},
        "target_layer_ids": config.get("target_layer_ids"),
        "block_size": config.get("block_size"),
        "num_draft_tokens": record.get("num_draft_tokens"),
        "sample_from_anchor": config.get("sample_from_anchor"),
        "topk": spec.get("topk"),
        "markov_topm": int(record.get("markov_topm") or spec.get("markov_topm") or 0),
        "op_contract_version": record.get("op_contract_version"),
        "dtype": spec.get("dtype"),
        "max_context": spec.get("max_context"),
        "graphs": graphs,
        "engines": {},
        "validation": record.get("validation"),
        "drafter": _drafter_section(record),
    }


def _drafter_section(record: dict[str, Any]) -> dict[str, Any]:
    section = {"spec": record.get("spec"), "versions": record.get("versions")}
    if record.get("d2t") is not None:
        section["d2t"] = record["d2t"]
    return section
