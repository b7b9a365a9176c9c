"""Checkpoint → ONNX: lazy loaders (Polygraphy style) that a ``dspark-export`` pipeline chains.

    exported = OnnxFromCheckpoint("drafter/", target_dir="target/", topk=512, dtype="bf16")   # nothing ran yet
    out_dir = SaveOnnx(exported, "out/drafter")()    # export (+ validation in onnxruntime), then write atomically
    again = OnnxFromDir("out/drafter")()              # ExportedOnnx, as written

Loaders are callables whose constructor only stores arguments; ``__call__`` does the work and each accepts
another loader (or its result) as input. ``OnnxFromCheckpoint`` validates by default: both graphs run in
onnxruntime on random inputs against the reference drafter (``export/validate.py``); a mismatch raises
``ValidationMismatch`` (CLI exit 3).

The directory written is a drafter-only export directory (``artifact/layout.py``, read by ``ExportDir``)::

    manifest.json                       config, I/O, validation summary, op_contract_version (2 with the
                                        candidate union, 3 with a gated / RNN head, else 1; absent = 1), and the
                                        ``drafter`` section:
                                        ExportSpec, versions, d2t
    onnx/context.onnx, onnx/draft.onnx  the graphs (``*.onnx.data`` beside them when weights exceed 1.5 GiB)
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from ..artifact.external_data import EXTERNAL_DATA_ALIGNMENT, EXTERNAL_DATA_BYTES
from ..artifact.layout import GRAPH_FILES, MANIFEST_FILE
from ..config import DSparkConfig
from ..errors import DSparkTrtError
from ..loader import resolve_dtype
from ..plugins.contract import TENSORRT_TOPK_LIMIT, op_contract_version_for
from ..topk import DEFAULT_TOPK, resolve_topk

__all__ = [
    "DEFAULT_MAX_CONTEXT",
    "ExportSpec",
    "ExportedOnnx",
    "OnnxFromDrafter",
    "OnnxFromCheckpoint",
    "SaveOnnx",
    "OnnxFromDir",
    "cached_onnx_export",
]

log = logging.getLogger("dspark.export")

DEFAULT_MAX_CONTEXT = 8192  # bound of the dynamic context length T (TensorRT optimisation profile)
_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


@dataclass(frozen=True)
class ExportSpec:
    """What to export. ``topk`` None = dense Markov walk (``--topk off``); ``markov_topm`` M > 0 = the candidate
    union (``DSparkTopKMarkovUnion``, op contract version 2)."""

    topk: int | None = None
    dtype: str = "bf16"
    max_context: int = DEFAULT_MAX_CONTEXT
    target: Literal["tensorrt", "onnxruntime"] = "tensorrt"
    markov_topm: int = 0

    @property
    def op_contract_version(self) -> int:
        """The candidate union's share of the contract version: 1 = ``DSparkTopKMarkov`` (or no custom node); 2 = the
        export uses ``DSparkTopKMarkovUnion``. The spec does not know the Markov head: the manifest's
        ``op_contract_version`` is ``contract.op_contract_version_for(head, M)`` (3 for a gated or RNN head)."""
        return op_contract_version_for("vanilla", self.markov_topm)

    @classmethod
    def resolve(cls, config: DSparkConfig, *, topk: int | str | None = DEFAULT_TOPK, dtype: str | torch.dtype | None = None,
                max_context: int | None = None, target: str | None = None,
                block_size: int | None = None, markov_topm: int | str | None = None) -> "ExportSpec":
        """Defaults filled in and every argument checked against the drafter (one-line errors with the fix).

        ``topk``: ``DEFAULT_TOPK`` → the checkpoint's ``draft_topk`` (vLLM ``dspark_draft_topk``), dense when
        absent; None or ``"off"`` → dense; an int K >= 1 → that k (``topk.parse_topk``). ``block_size``, when given, must equal the checkpoint's.
        ``markov_topm``: None → the checkpoint's ``draft_markov_topm`` where it applies (a top-k export; 0 for a
        dense one); an int M in [0, V_d] → that union width (M > 0 needs a top-k).
        """
        dtype_name = _DTYPE_NAMES[resolve_dtype(dtype if dtype is not None else cls.dtype)]
        target = target or cls.target
        if target not in ("tensorrt", "onnxruntime"):
            raise DSparkTrtError(f"unknown export target {target!r}: use 'tensorrt' or 'onnxruntime'")
        if block_size is not None and int(block_size) != config.block_size:
            raise DSparkTrtError(
                f"block size {block_size} does not match the checkpoint's block_size {config.block_size} (the "
                f"drafter was trained for it and N is baked into the graphs); omit --block-size or pass "
                f"{config.block_size}")
        topk = resolve_topk(topk, config.draft_topk)
        vd = config.draft_vocab_size
        if topk is not None:
            if not 1 <= topk <= vd:
                raise DSparkTrtError(f"top-k {topk} is outside [1, draft_vocab_size={vd}]; use --topk <= {vd} "
                                     f"or --topk off for the dense walk")
            if target == "tensorrt" and topk > TENSORRT_TOPK_LIMIT:
                raise DSparkTrtError(f"top-k {topk} exceeds TensorRT's TopK limit of {TENSORRT_TOPK_LIMIT}; use "
                                     f"--topk <= {TENSORRT_TOPK_LIMIT}, --topk off, or the onnxruntime target")
        max_context = DEFAULT_MAX_CONTEXT if max_context is None else int(max_context)
        if max_context < 2:
            raise DSparkTrtError(f"max context {max_context} is too small; use --max-context >= 2 "
                                 f"(the longest sequence the drafter will see)")
        markov_topm = resolve_markov_topm(config, markov_topm, topk)
        return cls(topk=topk, dtype=dtype_name, max_context=max_context, target=target, markov_topm=markov_topm)


def resolve_markov_topm(config: DSparkConfig, markov_topm: int | str | None, topk: int | None) -> int:
    """The export's union width M: None → ``config.draft_markov_topm`` for a top-k export (0 for a dense one);
    else an integer in [0, draft_vocab_size], > 0 only with a top-k. One-line errors naming the fix."""
    if markov_topm is None:
        return config.draft_markov_topm if topk is not None else 0
    text = str(markov_topm).strip()
    try:
        m = int(text)
    except ValueError:
        m = -1
    vd = config.draft_vocab_size
    if isinstance(markov_topm, bool) or not 0 <= m <= vd:
        raise DSparkTrtError(f"--markov-topm {text} must be an integer in [0, draft_vocab_size={vd}] (0 = no "
                             f"candidate union); use a smaller M")
    config.check_markov_topm(m)
    if m and topk is None:
        raise DSparkTrtError(f"--markov-topm {m} needs a top-k export (the dense walk already scores every token); "
                             f"pass --topk K, or --markov-topm 0 with --topk off")
    return m


@dataclass
class ExportedOnnx:
    """Both graphs (``onnx_ir.Model``) and what they were built for."""

    config: DSparkConfig
    spec: ExportSpec
    context: Any  # onnx_ir.Model
    draft: Any  # onnx_ir.Model
    validation: list[str] | None = None  # report lines when validated
    d2t: list[int] | None = None  # [V_d] draft → target id offsets, for a reduced draft vocabulary (the verifier needs them)
    streamed: bool = False  # initializers stream from the checkpoint (export/streaming.py): always external data
    validate_files: Any = None  # streamed: Callable[[Path], list[str]] validating the written graphs (SaveOnnx calls it)

    @property
    def num_draft_tokens(self) -> int:
        return self.config.num_draft_tokens

    def drafter_record(self) -> dict:
        """The manifest's ``drafter`` section: the spec, the versions that traced the graphs, ``d2t``."""
        import onnx
        import onnxruntime
        import onnxscript

        return {
            "spec": dataclasses.asdict(self.spec),
            "versions": {"torch": torch.__version__, "onnx": onnx.__version__, "onnxscript": onnxscript.__version__,
                         "onnxruntime": onnxruntime.__version__},
            **({"d2t": self.d2t} if self.d2t is not None else {}),
        }

    def manifest(self, root: Path, *, model_dir: str | Path | None = None, extra: dict | None = None, **kw) -> dict:
        """The manifest of an export whose graphs were written below ``root`` (``artifact.manifest.new_manifest``
        with this export's ``drafter`` section and validation report)."""
        from ..artifact.manifest import new_manifest

        manifest = new_manifest(self.config, model_dir=model_dir, topk=self.spec.topk, dtype=self.spec.dtype,
                                graphs={g: root / f for g, f in GRAPH_FILES.items()}, export_dir=root,
                                markov_topm=self.spec.markov_topm, drafter=self.drafter_record(),
                                extra={"max_context": self.spec.max_context, **(extra or {})}, **kw)
        manifest["validation"] = self.validation
        return manifest


def _resolve(source):
    """A loader's result, or the object itself (modules are callable but are not loaders)."""
    return source() if callable(source) and not isinstance(source, torch.nn.Module) else source


class OnnxFromDrafter:
    """Export an already loaded reference ``DSparkDrafter`` (its dtype is the export dtype).

    Args:
        drafter: a ``DSparkDrafter`` (or a loader returning one).
        topk / max_context / target / block_size: see ``ExportSpec.resolve``.
        validate (*optional*, defaults to True): run both graphs in onnxruntime against the drafter.
    """

    def __init__(self, drafter, *, topk: int | str | None = DEFAULT_TOPK, max_context: int | None = None,
                 target: str | None = None, block_size: int | None = None, validate: bool = True,
                 context_graph=None, markov_topm: int | str | None = None):
        self._drafter = drafter
        self._options = dict(topk=topk, max_context=max_context, target=target, block_size=block_size,
                             markov_topm=markov_topm)
        self.validate = validate
        self._context_graph = context_graph  # an already exported context graph of this drafter and dtype

    def __call__(self) -> ExportedOnnx:
        drafter = _resolve(self._drafter)
        exported = self._export(drafter)
        if self.validate:
            from ..runtime.ort_session import OrtGraph
            from .validate import validate_onnx

            s = exported.spec
            report = validate_onnx(OrtGraph(exported.context), OrtGraph(exported.draft), drafter, topk=s.topk,
                                   dtype=s.dtype, markov_topm=s.markov_topm)
            exported.validation = report.lines()
        return exported

    def _export(self, drafter) -> ExportedOnnx:
        from ..reference.precision import model_dtype
        from .graphs import GraphInfo, export_context, export_draft

        c = drafter.config
        spec = ExportSpec.resolve(c, dtype=model_dtype(drafter), **self._options)  # fc may be fp32 (fp16)
        info = dict(dtype=spec.dtype, num_draft_tokens=c.num_draft_tokens, max_context=spec.max_context,
                    config_digest=c.digest())
        union = f", candidate union M {spec.markov_topm}" if spec.markov_topm else ""
        log.info(f"exporting ONNX graphs ({spec.dtype}, top-k {spec.topk or 'off'}{union}, N {c.num_draft_tokens}, "
                 f"context ≤ {spec.max_context})")
        return ExportedOnnx(
            config=c, spec=spec,
            context=(_resolve(self._context_graph) if self._context_graph is not None
                     else export_context(drafter, GraphInfo("context", topk=None, **info))),
            draft=export_draft(drafter, GraphInfo("draft", topk=spec.topk, markov_topm=spec.markov_topm, **info)),
            d2t=drafter.d2t.tolist() if c.has_reduced_vocab else None,
        )


class OnnxFromCheckpoint(OnnxFromDrafter):
    """Load a drafter checkpoint in ``dtype`` (fp32 | fp16 | bf16, default bf16) and export it.

    ``stream`` (default): the graphs are traced on placeholders of the large weights and their initializers
    stream from the checkpoint into ``<graph>.onnx.data`` when ``SaveOnnx`` writes them (export/streaming.py:
    memory follows one tensor, not the model); validation then runs on the written files, against the reference
    drafter loaded afterwards. ``stream=False``: the whole drafter is loaded and exported in memory.

    Example:
        >>> exported = OnnxFromCheckpoint("drafter/", target_dir="target/", topk=16, dtype="fp32")()
        >>> [n.op_type for n in exported.draft.graph if n.domain == "dspark"]
        ['DSparkTopKMarkov']
    """

    def __init__(self, model_dir: str | Path, *, target_dir: str | Path | None = None,
                 dtype: str | torch.dtype | None = None, stream: bool = True, **options):
        dtype = resolve_dtype(dtype if dtype is not None else ExportSpec.dtype)  # bad dtype: fail before loading
        self.model_dir, self.target_dir, self.dtype, self.stream = Path(model_dir), target_dir, dtype, stream
        self.num_layers: int | None = None  # a subset of the draft layers (validation at size)
        super().__init__(self._load, **options)

    def _load(self, placeholders=None):
        from ..loader import load_drafter

        return load_drafter(self.model_dir, dtype=self.dtype, target_dir=self.target_dir, placeholders=placeholders,
                            num_layers=self.num_layers)

    def __call__(self) -> ExportedOnnx:
        if not self.stream:
            return super().__call__()
        from .streaming import Placeholders, name_placeholders, stream_initializers

        placeholders = Placeholders()
        drafter = self._load(placeholders)
        topm = ExportSpec.resolve(drafter.config, dtype=self.dtype, **self._options).markov_topm
        if topm:  # the union table is computed from the Markov weights: from the real ones
            drafter.__dict__.setdefault("_union_tables", {})[topm] = _union_table(self.model_dir, self.dtype, topm,
                                                                                  drafter.config)
        exported = self._export(drafter)
        name_placeholders(drafter, placeholders, prefix="drafter.")
        for name in GRAPH_FILES:
            counts = stream_initializers(getattr(exported, name), placeholders, what=f"{name} graph")
            log.info(f"{name} graph: {counts['streamed']} initializers ({counts['streamed_bytes'] / 2**20:.1f} MiB) "
                     f"stream from the checkpoint, {counts['in_memory']} computed at export")
        exported.streamed = True
        if self.validate:
            exported.validate_files = self._validate_files
        return exported

    def _validate_files(self, out: Path, available: int | None = None) -> list[str]:
        """Validate the written graphs in ``out`` against the reference drafter (loaded now, real weights): the
        full graphs when graphs + reference fit in 90 % of the available memory, else the same export of the
        first k draft layers (written beside them, removed afterwards); the report's title says which."""
        import shutil

        from ..process_memory import memory_available
        from .validate_target import validation_need

        graph_bytes = sum((out / f"{f}.data").stat().st_size for f in GRAPH_FILES.values() if (out / f"{f}.data").is_file())
        layers, largest, layer_bytes = _drafter_sizes(self.model_dir, self.target_dir, self.dtype)
        scale = 4 // torch.empty((), dtype=self.dtype).element_size()
        need = validation_need(graph_bytes, largest * scale, copies=2)  # reference ≈ the graphs' bytes
        budget = int(0.9 * (memory_available() if available is None else available))
        k = layers
        if need > budget:
            k = int(max(1, min(layers - 1, layers - (need - budget) // max(1, 2 * layer_bytes) - 1)))
            sub = OnnxFromCheckpoint(self.model_dir, target_dir=self.target_dir, dtype=self.dtype, validate=False,
                                     **self._options)
            sub.num_layers = k
            work = out / ".validation"
            work.mkdir(exist_ok=True)
            try:
                write_graphs(sub(), work)
                lines = sub._check(work)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            lines[0] += (f" — a subset: the same export of draft layers 0..{k - 1} of {layers} (the checkpoint's "
                         f"weights; embeddings, fc, lm_head, Markov and confidence heads included), since the full "
                         f"graphs need ~{need / 1e9:.1f} GB next to their reference and {budget / 1e9:.1f} GB are "
                         f"usable; the full graphs' initializers were written from the same tensors")
            log.info(lines[0])
            return lines
        lines = self._check(out)
        lines[0] += f" — the full graphs ({layers} draft layers; need ~{need / 1e9:.1f} GB, {budget / 1e9:.1f} GB usable)"
        return lines

    def _check(self, out: Path) -> list[str]:
        from ..runtime.ort_session import OrtGraph
        from .validate import validate_onnx

        drafter = self._load()
        spec = ExportSpec.resolve(drafter.config, dtype=self.dtype, **self._options)
        graphs = [OrtGraph(out / GRAPH_FILES[g], low_memory=True) for g in ("context", "draft")]
        report = validate_onnx(*graphs, drafter, topk=spec.topk, dtype=spec.dtype, markov_topm=spec.markov_topm)
        return report.lines()


def _drafter_sizes(model_dir: Path, target_dir, dtype: torch.dtype) -> tuple[int, int, int]:
    """(draft layers, the largest tensor's elements × the export dtype's bytes, one layer's bytes) from the headers."""
    from ..checkpoint import expected_tensors

    config = DSparkConfig.from_pretrained(model_dir)
    item = torch.empty((), dtype=dtype).element_size()
    spec = expected_tensors(config)
    sizes = {n: item * int(torch.Size(t.shape).numel()) for n, t in spec.items()}
    layer = sum(v for n, v in sizes.items() if n.startswith("layers.0."))
    return config.num_hidden_layers, max(sizes.values()), layer


def _union_table(model_dir: Path, dtype: torch.dtype, topm: int, config: DSparkConfig) -> torch.Tensor:
    """[V, M] int32: the candidate union's table from the checkpoint's Markov weights as the loader casts them."""
    from ..checkpoint import SafetensorsCheckpoint
    from ..reference.markov import markov_union_table

    with SafetensorsCheckpoint(model_dir) as ck:
        w1 = ck.get("markov_head.markov_w1.weight").to(dtype)
        w2 = ck.get("markov_head.markov_w2.weight").to(dtype)
    with torch.no_grad():
        return markov_union_table(w1, w2, topm, logit_scale=config.logit_scale)


class SaveOnnx:
    """Write an ``ExportedOnnx`` (or a loader of one) to ``out_dir`` atomically; ``force`` replaces."""

    def __init__(self, exported, out_dir: str | Path, *, force: bool = False, model_dir: str | Path | None = None):
        self._exported, self.out_dir, self.force, self.model_dir = exported, Path(out_dir), force, model_dir

    def __call__(self) -> Path:
        from ..atomic import atomic_output_dir, check_output_dir

        check_output_dir(self.out_dir, force=self.force, marker=MANIFEST_FILE)  # refuse before the (slow) export
        exported = _resolve(self._exported)
        model_dir = self.model_dir or getattr(self._exported, "model_dir", None)
        with atomic_output_dir(self.out_dir, force=self.force, marker=MANIFEST_FILE) as tmp:
            write_graphs(exported, tmp)
            validate_written(exported, tmp)
            write_manifest(exported, tmp, model_dir=model_dir)
        log.info(f"wrote {self.out_dir}")
        return self.out_dir


def write_graphs(exported: ExportedOnnx, root: Path) -> None:
    """Write both graphs below the export root (``onnx/context.onnx``, ``onnx/draft.onnx``); a streamed export's
    weights go to ``<graph>.onnx.data``, tensor by tensor."""
    import onnx_ir as ir

    for name, file in GRAPH_FILES.items():
        model, path = getattr(exported, name), root / file
        path.parent.mkdir(parents=True, exist_ok=True)
        data = f"{path.name}.data"
        if exported.streamed:
            ir.save(model, path, external_data=data, alignment=EXTERNAL_DATA_ALIGNMENT)
            continue
        size = sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None)
        ir.save(model, path, external_data=data if size > EXTERNAL_DATA_BYTES else None)


def validate_written(exported: ExportedOnnx, out: Path) -> None:
    """A streamed export validates its written graphs (``validate_files``); others were validated in memory."""
    if exported.validate_files is not None:
        exported.validation = exported.validate_files(out)


def write_manifest(exported: ExportedOnnx, root: Path, *, model_dir: str | Path | None = None) -> None:
    """``manifest.json`` of a drafter-only export (``ExportDir.write_manifest``), every file recorded."""
    from ..artifact.export_dir import ExportDir
    from ..artifact.manifest import file_records

    manifest = exported.manifest(root, model_dir=model_dir)
    manifest["files"] = file_records(root)
    ExportDir(root).write_manifest(manifest)


class OnnxFromDir:
    """Read an export directory back (``ExportDir``: a current one, or one an older dspark-trt wrote):
    ``ExportedOnnx`` (graphs as ``onnx_ir.Model``, weights lazily)."""

    def __init__(self, path: str | Path):
        from ..artifact.export_dir import ExportDir

        self.path = Path(path)
        self.export = ExportDir(path)

    def manifest(self) -> dict:
        if not self.export.exists():
            raise DSparkTrtError(f"{self.path} is not an ONNX export directory (no {MANIFEST_FILE}); export the "
                                 f"drafter first (OnnxFromCheckpoint + SaveOnnx, or dspark export)")
        return self.export.manifest

    def config(self) -> DSparkConfig:
        self.manifest()
        return self.export.config

    def spec(self) -> ExportSpec:
        self.manifest()
        return ExportSpec(**self.export.spec)

    def __call__(self) -> ExportedOnnx:
        import onnx_ir as ir

        m = self.manifest()
        return ExportedOnnx(config=self.config(), spec=self.spec(), validation=m.get("validation"), d2t=self.export.d2t,
                            **{name: ir.load(path) for name, path in self.export.graph_paths.items()})


# -- a content-addressed cache (runtime backend, tests) ----------------------------------------------------
def cached_onnx_export(model_dir: str | Path, cache_dir: str | Path | None = None, *,
                       target_dir: str | Path | None = None, dtype: str | torch.dtype | None = None,
                       validate: bool = True, **options) -> Path:
    """Export directory (drafter-only, ``ExportDir``) for this checkpoint and these options under ``cache_dir``
    (default ``cache.cache_dir("onnx")``), exporting on a miss.

    The key hashes the checkpoint files' contents, the options and the package's sources
    (``cache.sources_digest``), so an edited checkpoint or a new dspark-trt never reuses a stale export.
    Concurrent callers (processes, pytest-xdist workers) take a file lock per entry, so each entry is exported
    once.
    """
    from ..cache import cache_dir as default_cache_dir
    from ..loader import load_drafter, resolve_target_dir

    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir("onnx")
    dtype_name = _DTYPE_NAMES[resolve_dtype(dtype if dtype is not None else ExportSpec.dtype)]
    config = DSparkConfig.from_pretrained(model_dir)
    spec = ExportSpec.resolve(config, dtype=dtype_name, **options)  # bad options fail before hashing
    target_dir = resolve_target_dir(model_dir, target_dir)  # a speculators verifier dir counts in the key
    inputs = _inputs_digest(model_dir, target_dir)
    key = _digest(inputs, dataclasses.asdict(spec), validate)
    context_key = _digest(inputs, spec.dtype, spec.max_context)
    stem = f"{config.digest()[:12]}-{spec.dtype}-{context_key[:8]}"  # entries with equal stems share a context
    union = f"-m{spec.markov_topm}" if spec.markov_topm else ""
    out = cache_dir / f"{stem}-topk{spec.topk or 'off'}{union}-{key[:16]}"
    if (out / MANIFEST_FILE).is_file():
        return out
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _file_lock(cache_dir / f".{out.name}.lock"):  # one exporter per entry; the others wait
        if (out / MANIFEST_FILE).is_file():
            return out
        drafter = load_drafter(model_dir, dtype=dtype_name, target_dir=target_dir)
        sibling = next((d for d in sorted(cache_dir.glob(f"{stem}-topk*")) if (d / MANIFEST_FILE).is_file()), None)
        context = None if sibling is None else (lambda: _load_ir(sibling / GRAPH_FILES["context"]))
        exported = OnnxFromDrafter(drafter, validate=validate, context_graph=context, **options)()
        from ..atomic import atomic_output_dir

        with atomic_output_dir(out, marker=MANIFEST_FILE) as tmp:
            write_graphs(exported, tmp)
            write_manifest(exported, tmp, model_dir=model_dir)
    return out


def _load_ir(path: Path):
    import onnx_ir as ir

    return ir.load(path)


@contextlib.contextmanager
def _file_lock(path: Path):
    """An exclusive advisory lock (POSIX ``flock``; no lock where unavailable)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _digest(*parts) -> str:
    from ..cache import json_digest

    return json_digest(*parts)


def _inputs_digest(model_dir, target_dir) -> str:
    """sha256 over the package's sources (``cache.sources_digest``) and the checkpoint files' contents."""
    from ..cache import file_sha256, sources_digest

    h = hashlib.sha256(sources_digest().encode())
    for directory in (model_dir, target_dir):
        if directory is None:
            continue
        for file in sorted(Path(directory).iterdir()):
            if file.suffix in (".json", ".safetensors") and file.is_file():
                h.update(file.name.encode())
                h.update(file_sha256(file).encode())
    return h.hexdigest()
