"""The ``dspark-export`` pipeline: checkpoint → ONNX (validated) → plugin PTX → engines → export directory.

    result = export_model("drafter/", "out/", ExportOptions(topk=512), target_dir="target/")

Every step is a lazy loader named after what it makes (``OnnxFromCheckpoint``, ``PtxForExport``,
``EnginesForExport``); ``export_model`` checks every argument first (nothing is written for a bad one) — the
checkpoints' files (``checkpoint_integrity.py``) and the free disk (``disk.py``) included — then runs the steps inside one atomic
directory: the result appears complete or not at all, and an existing non-empty ``out`` is replaced only with
``force`` (only the export's own entries, ``EXPORT_ENTRIES``). A disk that fills up midway is one line.

Export directory::

    manifest.json                  what was built, from what, with which versions (artifact/manifest.py; the
                                   layout: artifact/layout.py; read and written through artifact.ExportDir)
    onnx/context.onnx              taps → per-layer context K/V
    onnx/draft.onnx                one draft round; top-k: TopK + dspark::DSparkTopKMarkov + its local function
                                   (--markov-topm M > 0: dspark::DSparkTopKMarkovUnion + its local function + the table;
                                   a gated / RNN head: dspark::DSparkTopKMarkovGated / RNN + its local function)
    onnx/draft.plugin.onnx         top-k: the graph full TensorRT builds (local function stripped, aot=1; it
                                   shares draft.onnx.data when the weights are external: no second copy)
    onnx/target.onnx               with --target (unless skipped): the target model, prefill + verify (target_onnx.py)
    tokenizer/                     the target's tokenizer files
    plugin/*.ptx, *.json           top-k: the walk kernel's PTX for sm_80 / sm_90 (embedded by TensorRT; the union
                                   kernel's with --markov-topm M)
    engines/<graph>.<flavor>.plan  when an engine flavor is available (else: ``dspark build-engine OUT``)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..atomic import atomic_output_dir, check_output_dir
from ..process_memory import peak_rss_bytes
from ..checkpoint_integrity import check_checkpoint_files
from ..config import DSparkConfig
from ..errors import DSparkTrtError
from ..optional import pip_install
from ..topk import DEFAULT_TOPK
from .engine_build import (FLAVORS, EngineBuildConfig, check_version_compatible, onnx_inputs, profile_shapes, resolve_flavor,
                     union_engine_refusal, write_engine)
from .disk import DiskEstimate, check_free_disk, disk_full_errors, estimate_export_bytes
from ..artifact.external_data import external_data_files
from ..artifact.layout import ENGINE_SUFFIX, EXPORT_ENTRIES, GRAPH_FILES, GRAPHS, PLUGIN_GRAPH
from ..artifact.manifest import file_records, new_manifest

__all__ = ["ExportOptions", "ExportResult", "export_model", "build_engines", "PtxForExport", "EnginesForExport",
           "TargetForExport", "Phases", "target_build_config", "VERIFY_TOKENS"]

log = logging.getLogger("dspark.export")

TRACE_PHASE = "trace ONNX graphs"
#: the Markov heads whose top-k walk has an AOT-compiled plugin kernel (plugins/aot.py) for full TensorRT; a top-k
#: export of another head writes no plugin graph and no PTX: its walk node runs through its standard-op local
#: function (onnxruntime, TensorRT-RTX, and full TensorRT, which parses local functions too)
RTX_COMPUTE_CAPABILITIES = ("SM75", "SM80", "SM86", "SM89", "SM120", "SM121")  # TensorRT-RTX 1.7 build targets


@dataclass(frozen=True)
class ExportOptions:
    """What ``dspark-export`` builds. ``None`` fields take the library defaults named beside them."""

    topk: int | str | None = DEFAULT_TOPK  # the checkpoint's draft_topk, else dense; None or "off": dense
    markov_topm: int | str | None = None  # None: the checkpoint's draft_markov_topm (top-k exports); 0: no union
    dtype: str = "bf16"
    engine: str = "auto"  # auto | tensorrt | tensorrt-rtx | none
    max_batch_size: int = 8
    opt_batch_size: int | None = None  # defaults to max_batch_size
    max_context: int | None = None  # bound of the context length (export.onnx.DEFAULT_MAX_CONTEXT)
    version_compatible: bool = False
    hardware_compatibility: str = "none"
    compute_capability: str = "SM80"  # TensorRT-RTX target (it builds without a GPU)
    validate: bool = True
    ptx_archs: tuple[int, ...] = (80, 90)
    export_target: bool = True  # with target_dir: also export the target graph (--skip-target: False)

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise DSparkTrtError(f"--max-batch-size {self.max_batch_size} must be >= 1")
        opt = self.opt_batch_size or self.max_batch_size
        if not 1 <= opt <= self.max_batch_size:
            raise DSparkTrtError(f"--opt-batch-size {opt} must be in [1, --max-batch-size {self.max_batch_size}]")
        if self.compute_capability not in RTX_COMPUTE_CAPABILITIES:
            raise DSparkTrtError(f"compute capability {self.compute_capability!r} is not a TensorRT-RTX target: use "
                                 f"one of {', '.join(RTX_COMPUTE_CAPABILITIES)}")


@dataclass
class ExportResult:
    out_dir: Path
    manifest: dict
    engine_flavor: str | None
    seconds: float
    notes: list[str] = field(default_factory=list)
    #: the process's peak resident bytes when each phase ended (``ru_maxrss``): the phase where it grew holds the peak
    phase_peak_rss: dict[str, int] = field(default_factory=dict)


class Phases:
    """Progress per phase: a bar on a TTY (log lines routed around it), ``[i/n] name`` log lines otherwise;
    TensorRT's own progress monitor reports inside the engine phase (export/engine_build.py)."""

    def __init__(self, names: list[str]):
        self.names, self.index = names, 0
        self.peak_rss: dict[str, int] = {}  # phase → the process's peak resident bytes when it ended
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=len(names), file=sys.stderr, leave=False, unit="phase")

    def run(self, name: str, fn: Callable[[], object]):
        self.index += 1
        start = time.perf_counter()
        if self.bar is None:
            log.info("[%d/%d] %s ...", self.index, len(self.names), name)
            result = fn()
        else:
            from tqdm.contrib.logging import logging_redirect_tqdm

            self.bar.set_description(name)
            with logging_redirect_tqdm():
                result = fn()
            self.bar.update(1)
        self.peak_rss[name] = peak_rss_bytes()
        log.info("[%d/%d] %s done in %.1fs (peak resident memory so far %.2f GB)", self.index, len(self.names), name,
                 time.perf_counter() - start, self.peak_rss[name] / 1e9)
        return result

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class PtxForExport:
    """Lazy: compile the DSparkTopKMarkov kernel's PTX for this export into ``out_dir`` → kernel description."""

    def __init__(self, out_dir: Path, config: DSparkConfig, *, topk: int, dtype: str, archs: tuple[int, ...],
                 markov_topm: int = 0):
        self.out_dir, self.config, self.topk, self.dtype, self.archs = out_dir, config, topk, dtype, archs
        self.markov_topm = int(markov_topm)  # > 0: the DSparkTopKMarkovUnion kernel
        self.markov_head_type = config.markov_head_type  # gated | rnn: the DSparkTopKMarkovGated / RNN kernel

    def __call__(self) -> dict:
        """Compiled in a child process: Triton's AOT path cannot run where its interpreter is on
        (``TRITON_INTERPRET=1``, e.g. under the CPU test suite), and the exporting process stays lean."""
        import os
        import subprocess
        import sys

        from ..plugins.aot import description_file, find_ptxas

        weights = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16"}[self.dtype]
        c = self.config
        cmd = [sys.executable, "-m", "dspark_trt.plugins.aot", "--out", str(self.out_dir),
               "--n", str(c.num_draft_tokens), "--k", str(self.topk), "--rank", str(c.markov_rank),
               "--logit-scale", repr(float(c.logit_scale)),
               "--dtypes", f"fp32-{weights}",  # the graph's TopK runs on fp32 base logits
               "--archs", ",".join(str(a) for a in self.archs)] + (["--validate"] if find_ptxas() else []) + \
              (["--markov-topm", str(self.markov_topm)] if self.markov_topm else []) + \
              (["--markov-head-type", self.markov_head_type] if self.markov_head_type != "vanilla" else [])
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise DSparkTrtError(f"compiling the DSparkTopKMarkov kernel to PTX failed: {last}")
        return json.loads((self.out_dir / description_file(self.markov_topm, self.markov_head_type)).read_text())


class EnginesForExport:
    """Lazy: build the context and draft engines of an export directory → manifest ``engines`` entries."""

    def __init__(self, export_dir: Path, manifest: dict, config: EngineBuildConfig, *, force: bool = False,
                 graphs: tuple[str, ...] | None = None):
        self.export_dir, self.manifest, self.config, self.force = export_dir, manifest, config, force
        self.graphs = graphs  # None: every graph of the export (context, draft, and the target when exported)

    def __call__(self) -> dict:
        flavor = self.config.flavor
        trt_version = _module_version(FLAVORS[flavor].module)
        engines_dir = self.export_dir / "engines"
        engines_dir.mkdir(exist_ok=True)
        entries = {}
        target = self.manifest.get("target")
        if target:
            from ..artifact.target_io import check_kv_interface

            check_kv_interface(target, str(self.export_dir))  # an older target graph: re-export, not rebuild
        for graph in GRAPHS + (("target",) if target else ()):
            if self.graphs is not None and graph not in self.graphs:
                continue
            config = self.config
            if graph == "target":
                onnx_file = target["onnx"]
                ring = (target.get("gemma4") or {}).get("ring")  # a Gemma-4 graph: W is the runtime's ring
                config = target_build_config(config, int(target["max_context"]), ring=ring)
            else:
                onnx_file = self.manifest["graphs"][graph]["file"]
            if graph == "draft" and flavor == "tensorrt" and self.manifest.get("plugin_graph"):
                onnx_file = self.manifest["plugin_graph"]  # the plugin picks up the walk; PTX inside the engine
            name = f"{graph}.{ENGINE_SUFFIX[flavor]}"
            path = engines_dir / name
            if path.exists() and not self.force:
                raise DSparkTrtError(f"{path} exists; pass --force to rebuild it")
            log.info("building the %s %s engine from %s", flavor, graph, onnx_file)
            before = _embedded_count(flavor)
            size = write_engine(self.export_dir / onnx_file, config, path)  # parsed from the path: external data
            embedded = _embedded_since(flavor, before)
            symbolic = onnx_inputs(self.export_dir / onnx_file)
            profiles = [profile_shapes(symbolic, config.batch_range, ranges, config.batch_dim)
                        for ranges in config.profile_ranges]
            if graph == "target":
                target["engines"] = sorted({*target.get("engines", []), f"engines/{name}"})
            entries[f"{graph}.{flavor}"] = {
                "graph": graph,
                "file": f"engines/{name}",
                "onnx": onnx_file,
                "flavor": flavor,
                "version": trt_version,
                "bytes": size,
                "profile": _profile_record(profiles[0]),
                "profiles": [_profile_record(shapes) for shapes in profiles],  # [0] = "profile"; the target: verify
                "build": config.describe(),
                **({"plugin_kernels": embedded} if embedded else {}),  # the PTX inside: file, sha256, ISA, arch
            }
        return entries


def _profile_record(shapes: dict) -> dict:
    return {k: {"min": list(v[0]), "opt": list(v[1]), "max": list(v[2])} for k, v in shapes.items()}


#: verify rounds score at most this many new tokens in the target engine's small-Q profile (profile 1); the
#: TensorRT target replays CUDA graphs for rounds up to the same size (``TensorRTTarget(max_graph_tokens=)``)
VERIFY_TOKENS = 16


def target_build_config(config: EngineBuildConfig, max_context: int, verify_tokens: int = VERIFY_TOKENS, *,
                        ring: int | None = None) -> EngineBuildConfig:
    """The target engine's build: profile 0 for prefill (Q up to a prefill chunk) and profile 1 for verify rounds
    (Q and K ≤ ``verify_tokens``), whose activation memory is sized for a few new tokens instead of a whole chunk
    (the runtime picks it for every verify round: ``runtime.tensorrt_engine.choose_profile``). No plugin.
    ``ring``: a Gemma-4 graph's sliding-layer caches are that many slots per request, whatever the context
    (the manifest's ``target.gemma4.ring``): ``W`` is profiled up to it, optimized for it (1 … ring: a profile
    with W fixed, min = max, fails TensorRT-RTX 1.x's build in Myelin, ``CHECK(is_const())``)."""
    from .target_onnx import target_dynamic_ranges

    ranges = target_dynamic_ranges(int(max_context))
    if ring is not None:
        ranges["W"] = (1, int(ring), int(ring))
    lo, opt, hi = ranges["Q"]
    small = min(hi, verify_tokens)
    extra = ({"Q": (lo, min(opt, small), small), "K": (lo, min(opt, small), small)},) if small < hi else ()
    return dataclasses.replace(config, register_plugins=None, dynamic_ranges=ranges, extra_profiles=extra)


def _embedded_count(flavor: str) -> int:
    if flavor != "tensorrt":
        return 0
    from ..plugins.tensorrt_plugin import embedded_kernels

    return len(embedded_kernels())


def _embedded_since(flavor: str, before: int) -> list[dict]:
    if flavor != "tensorrt":
        return []
    from ..plugins.tensorrt_plugin import embedded_kernels

    unique: list[dict] = []
    for record in embedded_kernels()[before:]:
        if record not in unique:
            unique.append(record)
    return unique


class TargetForExport:
    """Lazy: export the target model into ``<export>/onnx/target.onnx``, validate it against transformers, copy
    its tokenizer → the manifest's ``target`` section. ``check`` runs the pairing checks first (one-line errors)."""

    def __init__(self, config: DSparkConfig, target_dir: Path, target_config: dict, *, dtype: str, max_context: int,
                 validate: bool):
        self.config, self.target_dir, self.target_config = config, Path(target_dir), target_config
        self.dtype, self.max_context, self.validate = dtype, max_context, validate

    @classmethod
    def check(cls, config: DSparkConfig, target_dir, **kwargs) -> "TargetForExport":
        from ..loader import read_target_config
        from .target_graph import check_architecture
        from .target_onnx import check_target_pairing

        target_config = read_target_config(target_dir)
        check_target_pairing(config, target_config)
        check_architecture(target_config)
        return cls(config, Path(target_dir), target_config, **kwargs)

    def __call__(self, export_dir: Path) -> dict:
        from ..loader import resolve_dtype
        from ..artifact.manifest import graph_io
        from .streaming import Placeholders
        from ..artifact.layout import TARGET_ONNX, TOKENIZER_DIR
        from .target_onnx import (build_target_model, copy_tokenizer, export_target_onnx, load_target_model,
                                  new_target_section)

        from .gemma4_target_graph import is_gemma4

        if is_gemma4(self.target_config):
            return self._gemma4(export_dir)
        fp16_range = None
        if self.dtype == "fp16":  # massive activations: refuse a target that overflows (target_precision.py)
            from .target_precision import check_target_fp16

            fp16_range = check_target_fp16(load_target_model(self.target_dir, resolve_dtype(self.dtype)))
        placeholders = Placeholders()  # traced on placeholders, the weights streamed from the checkpoint
        model = build_target_model(self.target_dir, resolve_dtype(self.dtype), placeholders=placeholders)
        path = export_target_onnx(model, self.config.target_layer_ids, export_dir / TARGET_ONNX,
                                  placeholders=placeholders)
        del model, placeholders
        report = None
        if self.validate:
            from .validate_target import validate_target_files

            report = validate_target_files(path, self.target_dir, self.config.target_layer_ids, dtype=self.dtype,
                                           work_dir=export_dir / ".target-validation").lines()
        tokenizer = copy_tokenizer(self.target_dir, export_dir / TOKENIZER_DIR)
        section = new_target_section(target_dir=self.target_dir, target_config=self.target_config, config=self.config,
                                     dtype=self.dtype, io=graph_io(path), tokenizer=tokenizer,
                                     max_context=self.max_context, validation=report)
        if fp16_range is not None:
            section["fp16_range"] = fp16_range
        return section

    def _gemma4(self, export_dir: Path) -> dict:
        """A Gemma-4 text target: its own graph (per-type K/V, sliding layers by position), built in memory in the
        export dtype; fp16 first passes the activation range check (as every target). Its validation holds one copy
        of the weights at a time (``validate_gemma4_target_onnx`` with a builder); in fp16/bf16 it also measures the
        model's own rounding against the same weights in fp32 (a third build, where that fits in memory)."""
        import gc

        import torch

        from ..artifact.layout import TARGET_ONNX, TOKENIZER_DIR
        from ..artifact.manifest import graph_io
        from ..loader import resolve_dtype
        from .gemma4_target_onnx import export_gemma4_target_onnx, gemma4_section, validate_gemma4_target_onnx
        from .target_onnx import copy_tokenizer, load_target_model, new_target_section

        model = load_target_model(self.target_dir, resolve_dtype(self.dtype))
        fp16_range = None
        if self.dtype == "fp16":  # massive activations: refuse a target that overflows (target_precision.py)
            from .target_precision import check_target_fp16

            fp16_range = check_target_fp16(model)
        path = export_gemma4_target_onnx(model, self.config.target_layer_ids, export_dir / TARGET_ONNX)
        gemma4 = gemma4_section(model, self.config.target_layer_ids)
        del model  # the validation loads its reference again and drops it before onnxruntime maps the graph
        gc.collect()
        report = validate_gemma4_target_onnx(
            path, lambda: load_target_model(self.target_dir, resolve_dtype(self.dtype)), self.config.target_layer_ids,
            dtype=self.dtype, reference_fp32=lambda: load_target_model(self.target_dir, torch.float32),
        ).lines() if self.validate else None
        tokenizer = copy_tokenizer(self.target_dir, export_dir / TOKENIZER_DIR)
        section = new_target_section(target_dir=self.target_dir, target_config=self.target_config, config=self.config,
                                     dtype=self.dtype, io=graph_io(path), tokenizer=tokenizer,
                                     max_context=self.max_context, validation=report)
        section.update(gemma4)
        if fp16_range is not None:
            section["fp16_range"] = fp16_range
        return section


def _module_version(module: str) -> str | None:
    import importlib

    try:
        return str(importlib.import_module(module).__version__)
    except Exception:
        return None


def engine_config(flavor: str, options: ExportOptions, *, max_context: int, topk: int | None,
                  kernel: dict | None = None, kernel_dir: Path | None = None, markov_topm: int = 0,
                  markov_head_type: str = "vanilla") -> EngineBuildConfig:
    """The build config of an export: batch 1..max, context 1..max_context; for TensorRT with top-k the plugin
    registered and pointed at the export's PTX (``kernel``: the manifest's kernel section, files in ``kernel_dir``).
    (``register_plugin`` registers both ops, so a candidate-union export's plugin graph finds
    ``DSparkTopKMarkovUnion``; its PTX is the union kernel's.)"""
    check_version_compatible(options.version_compatible, _plugin_op(topk, markov_topm, markov_head_type))
    register = None
    if flavor == "tensorrt" and _plugin_op(topk, markov_topm, markov_head_type) is not None:
        def register() -> None:
            from ..plugins.tensorrt_plugin import register_plugin, use_export_ptx

            register_plugin()  # refuses TensorRT < 10.9 before anything is registered
            use_export_ptx(kernel, kernel_dir, hardware_compatibility=options.hardware_compatibility)
    return EngineBuildConfig(
        flavor,  # type: ignore[arg-type]
        max_batch_size=options.max_batch_size,
        opt_batch_size=options.opt_batch_size,
        dynamic_ranges={"T": (1, min(1024, max_context), max_context)},
        version_compatible=options.version_compatible,
        hardware_compatibility=options.hardware_compatibility,  # type: ignore[arg-type]
        compute_capability=options.compute_capability,
        tf32=options.dtype != "fp32",  # an fp32 export's engines compute in fp32, as its references do
        register_plugins=register,
    )


def export_model(model_dir: str | Path, out_dir: str | Path, options: ExportOptions = ExportOptions(), *,
                 target_dir: str | Path | None = None, force: bool = False) -> ExportResult:
    """Run the whole export (see the module docstring). Raises ``DSparkTrtError`` on bad input (nothing written),
    ``ValidationMismatch`` when the ONNX graphs disagree with the reference."""
    from ..loader import resolve_target_dir
    from .onnx import ExportSpec

    start = time.perf_counter()
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    # -- every argument checked before anything runs or is written ----------------------------------------
    config = DSparkConfig.from_pretrained(model_dir)
    target_dir = resolve_target_dir(model_dir, target_dir)  # default: a speculators checkpoint's local verifier
    # the files before the weights: a missing shard or a truncated download is one line now, not a crash later
    check_checkpoint_files(model_dir)
    target_files = check_checkpoint_files(target_dir) if target_dir is not None else None
    spec = ExportSpec.resolve(config, topk=options.topk, dtype=options.dtype, max_context=options.max_context,
                              target="tensorrt", markov_topm=options.markov_topm)
    check_version_compatible(options.version_compatible,
                             _plugin_op(spec.topk, spec.markov_topm, config.markov_head_type))
    flavor = resolve_flavor(options.engine)
    if flavor == "tensorrt-rtx" and spec.markov_topm:  # no plugin there: it does not build the union (engine.py)
        if options.engine != "auto":
            raise DSparkTrtError(union_engine_refusal(flavor, spec.markov_topm))
        flavor = None
    if flavor is not None:
        engine_config(flavor, options, max_context=spec.max_context, topk=None)  # refuses bad combinations now
    notes: list[str] = []
    plugin = bool(spec.topk)  # every head has its fused kernel (plugins/kernel.py, plugins/head_kernels.py)
    if plugin:
        from ..optional import require

        require("triton", "compiling the top-k Markov kernel to PTX (--topk)")
    target = None
    if target_dir is not None and options.export_target:
        target = TargetForExport.check(config, target_dir, dtype=spec.dtype, max_context=spec.max_context,
                                       validate=options.validate)
    check_output_dir(out_dir, force=force)
    disk = estimate_export_bytes(config, spec.dtype, target_files=target_files if target else None,
                                 target_config=target.target_config if target else None, engines=flavor is not None,
                                 markov_topm=spec.markov_topm)
    check_free_disk(out_dir, disk)  # the whole new export must fit (an earlier one stays until it is complete)

    names = [TRACE_PHASE if options.validate else f"{TRACE_PHASE} (not validated)", "write ONNX weights"] + \
            (["validate ONNX"] if options.validate else []) + \
            (["target ONNX + validation"] if target else []) + \
            (["plugin graph + PTX"] if plugin else []) + ([f"{flavor} engines"] if flavor else []) + ["manifest"]
    phases = Phases(names)
    if spec.markov_topm and flavor is None:
        notes.append(f"candidate union M={spec.markov_topm}: the draft graph runs with the onnxruntime backend "
                     f"(dspark generate --export OUT); for engines run `dspark build-engine {out_dir} --engine "
                     f"tensorrt` on a GPU host with TensorRT (the DSparkTopKMarkovUnion plugin)"
                     + ("; " + union_engine_refusal("TensorRT-RTX", spec.markov_topm) if options.engine == "auto" else ""))
    if target_dir is not None and target is None:
        notes.append("the target was not exported (--skip-target): `dspark generate --export` needs it")
    try:
        with disk_full_errors(out_dir, disk):  # ENOSPC: the temporary directory is gone, one line says why
            manifest = _run_export(phases, notes, config, spec, flavor, options, model_dir, out_dir, target_dir, force,
                                   target)
    finally:
        phases.close()
    return ExportResult(out_dir, manifest, flavor, time.perf_counter() - start, notes, dict(phases.peak_rss))


def _run_export(phases, notes, config, spec, flavor, options, model_dir, out_dir, target_dir, force,
                target: "TargetForExport | None" = None) -> dict:
    from ..artifact.export_dir import ExportDir
    from .onnx import OnnxFromCheckpoint, validate_written, write_graphs
    from .plugin_graph import plugin_graph

    with atomic_output_dir(out_dir, force=force, owned=EXPORT_ENTRIES) as tmp:  # --force: only what we write
        exported = phases.run(phases.names[0], OnnxFromCheckpoint(
            model_dir, target_dir=target_dir, dtype=spec.dtype, topk=spec.topk, max_context=spec.max_context,
            target="tensorrt", validate=options.validate, markov_topm=spec.markov_topm))
        phases.run("write ONNX weights", lambda: write_graphs(exported, tmp))
        if options.validate:
            phases.run("validate ONNX", lambda: validate_written(exported, tmp))
        drafter_record, validation = exported.drafter_record(), exported.validation
        del exported
        target_record = phases.run("target ONNX + validation", lambda: target(tmp)) if target else None
        kernel = plugin = None
        extra: dict = {"max_context": spec.max_context}
        if spec.topk:
            def plugin_step():
                plugin_graph(tmp / GRAPH_FILES["draft"], tmp / PLUGIN_GRAPH)
                return PtxForExport(tmp / "plugin", config, topk=spec.topk, dtype=spec.dtype,
                                    archs=options.ptx_archs, markov_topm=spec.markov_topm)()

            kernel = phases.run("plugin graph + PTX", plugin_step)
            kernel = {**kernel, "dir": "plugin"}
            plugin = _plugin_record(spec.topk, config.logit_scale, spec.markov_topm, config.markov_head_type)
            extra["plugin_graph"] = PLUGIN_GRAPH
        manifest = new_manifest(config, model_dir=model_dir, topk=spec.topk, dtype=spec.dtype,
                                graphs={g: tmp / GRAPH_FILES[g] for g in GRAPHS}, export_dir=tmp,
                                plugin=plugin, kernel=kernel, extra=extra, markov_topm=spec.markov_topm,
                                drafter=drafter_record)
        manifest["validation"] = validation
        if target_record is not None:
            manifest["target"] = target_record
        if flavor is not None:
            build = engine_config(flavor, options, max_context=spec.max_context, topk=spec.topk, kernel=kernel,
                                  kernel_dir=tmp / "plugin", markov_topm=spec.markov_topm,
                                  markov_head_type=config.markov_head_type)
            manifest["engines"] = phases.run(f"{flavor} engines", EnginesForExport(tmp, manifest, build))
        elif not spec.markov_topm:  # a union export says why in its own note
            notes.append(_no_engine_note(out_dir, requested=options.engine))
        def write_manifest():
            manifest["files"] = file_records(tmp)  # every file, .data included: size + sha256, streamed
            ExportDir(tmp).write_manifest(manifest)

        phases.run("manifest", write_manifest)
    return manifest


def build_engines(export_dir: str | Path, *, engine: str = "auto", options: ExportOptions | None = None,
                  force: bool = False, graphs: tuple[str, ...] | None = None) -> dict:
    """``dspark build-engine``: build the engines of an existing export directory; update its manifest.

    ``graphs``: only these of ``context``, ``draft``, ``target`` (default: all that the export has), e.g. each in a
    process of its own so that one build's memory is not held while the next runs."""
    from ..artifact.export_dir import ExportDir

    export = ExportDir(export_dir)
    export_dir, manifest = export.root, export.manifest
    known = GRAPHS + (("target",) if manifest.get("target") else ())
    unknown = sorted(set(graphs or ()) - set(known))
    if unknown:
        raise DSparkTrtError(f"{export_dir} has no {unknown[0]} graph to build: choose from {', '.join(known)}")
    options = options or ExportOptions()
    check_version_compatible(options.version_compatible,
                             _plugin_op(manifest.get("topk"), int(manifest.get("markov_topm") or 0),
                                        _markov_head_type(manifest)))
    flavor = resolve_flavor(engine, none_allowed=False)
    if flavor == "tensorrt-rtx" and manifest.get("markov_topm"):
        raise DSparkTrtError(f"{export_dir}: " + union_engine_refusal(flavor, int(manifest["markov_topm"])))
    if flavor is None:
        raise DSparkTrtError(f"no TensorRT flavor is importable here: install TensorRT on the GPU host (or "
                             f"{pip_install('rtx')} for TensorRT-RTX), then re-run dspark build-engine")
    kernel = manifest.get("kernel")
    build = engine_config(flavor, options, max_context=int(manifest.get("max_context", 8192)),
                          topk=manifest.get("topk"), kernel=kernel,
                          kernel_dir=export_dir / kernel.get("dir", "plugin") if kernel else None,
                          markov_topm=int(manifest.get("markov_topm") or 0),
                          markov_head_type=_markov_head_type(manifest))
    files = {export_dir / g["file"] for name, g in manifest.get("graphs", {}).items() if not graphs or name in graphs} | \
        ({export_dir / manifest["target"]["onnx"]} if manifest.get("target") and (not graphs or "target" in graphs)
         else set())
    data = {f for g in files if g.is_file() for f in external_data_files(g)}  # each .data file once
    weights = sum(p.stat().st_size for p in files | data if p.is_file())
    disk = DiskEstimate(0, 0, engines=weights)  # an engine holds about its graph's weights
    check_free_disk(export_dir, disk, what="the engines")
    with disk_full_errors(export_dir, disk, what="the engine build"):
        built = EnginesForExport(export_dir, manifest, build, force=force, graphs=graphs)()
    manifest["engines"] = {**manifest.get("engines", {}), **built}
    if "files" in manifest:  # only the new engines are hashed; the rest of the export did not change
        manifest["files"] = dict(sorted({**manifest["files"],
                                         **file_records(export_dir, [e["file"] for e in built.values()])}.items()))
    export.write_manifest(manifest)
    return manifest


def _markov_head_type(manifest: dict) -> str:
    """The exported drafter's Markov head type (vanilla for a manifest written before the other heads)."""
    return ((manifest.get("checkpoint") or {}).get("config") or {}).get("markov_head_type") or "vanilla"


def _plugin_op(topk: int | None, markov_topm: int = 0, markov_head_type: str = "vanilla") -> str | None:
    """The draft graph's plugin op: the union's with M > 0, the head's (plain, gated, RNN) with a top-k, none for a
    dense graph."""
    from ..plugins.contract import HEAD_OPS, UNION_OP_NAME

    if not topk:
        return None
    return UNION_OP_NAME if markov_topm else HEAD_OPS[markov_head_type][0]


def _plugin_record(topk: int, logit_scale: float, markov_topm: int = 0, markov_head_type: str = "vanilla") -> dict:
    """The manifest's ``plugin`` entry: the walk op the engine embeds (plain, union, gated or RNN), its contract."""
    from ..plugins.contract import (ATTRIBUTES, HEAD_OPS, OP_DOMAIN, OUTPUTS, PLUGIN_NAMESPACE, PLUGIN_VERSION,
                                    UNION_ATTRIBUTES, UNION_INPUTS, UNION_OP_NAME, UNION_OUTPUTS)

    if markov_topm:
        op, inputs, outputs, docs = UNION_OP_NAME, UNION_INPUTS, UNION_OUTPUTS, UNION_ATTRIBUTES
        attributes = {"k": topk, "logit_scale": logit_scale, "markov_topm": int(markov_topm), "aot": 1}
    else:
        (op, inputs), outputs, docs = HEAD_OPS[markov_head_type], OUTPUTS, ATTRIBUTES
        attributes = {"k": topk, "logit_scale": logit_scale, "aot": 1}
    return {
        "op": op,
        "domain": OP_DOMAIN,
        "name": op,
        "namespace": PLUGIN_NAMESPACE,
        "version": PLUGIN_VERSION,
        "attributes": attributes,
        "attribute_docs": docs,
        "inputs": [{"name": t.name, "shape": t.shape, "dtype": t.dtype} for t in inputs],
        "outputs": [{"name": t.name, "shape": t.shape, "dtype": t.dtype} for t in outputs],
    }


def _no_engine_note(out_dir: Path, *, requested: str = "auto") -> str:
    later = (f"on a GPU host with TensorRT >= 10.9 run `dspark build-engine {out_dir}` (it registers the DSparkTopKMarkov "
             f"plugin and builds engines/context.plan and engines/draft.plan)")
    if requested == "none":
        return f"no engine was built (--engine none): {later}, or `dspark build-engine {out_dir} --engine tensorrt-rtx`"
    return (f"no engine was built: neither TensorRT nor TensorRT-RTX is importable here. {later[0].upper()}{later[1:]}, "
            f"or `{pip_install('rtx')}` and `dspark build-engine {out_dir} --engine tensorrt-rtx` here")
