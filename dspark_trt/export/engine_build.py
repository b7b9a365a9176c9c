"""ONNX → serialized engine, with full TensorRT or TensorRT-RTX (one code path; both imported lazily).

What differs between the flavours is data (``FLAVORS``); the build itself is the same: a strongly typed
network from the ONNX parser, one optimization profile over the batch dimension (and any other dynamic
dimension given a range) — plus, where asked (``extra_profiles``: the target's small-Q verify profile), more
profiles that narrow some of those ranges — optional version-compatible / hardware-compatibility flags (full
TensorRT), TF32 cleared for fp32 exports (``EngineBuildConfig.tf32``), an
explicit compute capability (TensorRT-RTX builds on a CPU-only machine), and TensorRT's progress monitor
reported per phase.

Pure functions (``profile_shapes``, ``resolve_flavor``) carry the logic the CPU tests cover; ``build_engine``
is the thin part that needs the library.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

from ..errors import DSparkTrtError

__all__ = ["EngineBuildConfig", "FLAVORS", "resolve_flavor", "profile_shapes", "onnx_inputs", "build_engine",
           "write_engine", "apply_build_flags",
           "EngineFromOnnx", "union_engine_refusal", "check_engine_graph", "check_version_compatible"]

log = logging.getLogger("dspark.engine")

Flavor = Literal["tensorrt", "tensorrt-rtx"]


@dataclass(frozen=True)
class FlavorInfo:
    module: str  # Python module to import
    pip_name: str  # what to install
    engine_file: str  # file name in the export directory


FLAVORS: dict[str, FlavorInfo] = {
    "tensorrt": FlavorInfo("tensorrt", "tensorrt", "model.plan"),
    "tensorrt-rtx": FlavorInfo("tensorrt_rtx", "tensorrt-rtx", "model.rtx.plan"),
}


def _importable(module: str) -> bool:
    if importlib.util.find_spec(module) is None:
        return False
    try:
        importlib.import_module(module)
    except Exception:  # the PyPI tensorrt stub installs but cannot import its libraries
        return False
    return True


def resolve_flavor(requested: str, *, none_allowed: bool = True) -> Flavor | None:
    """``auto`` → full TensorRT if importable, else TensorRT-RTX if importable, else None (no engine).

    An explicit flavor that is not importable is a user error naming what to install (and the other
    ``--engine`` values; ``none`` only where the command has it: ``none_allowed``).
    """
    if requested == "none":
        return None
    if requested == "auto":
        for name in ("tensorrt", "tensorrt-rtx"):
            if _importable(FLAVORS[name].module):
                return name  # type: ignore[return-value]
        return None
    if requested not in FLAVORS:
        raise DSparkTrtError(f"unknown engine {requested!r}: use auto, tensorrt, tensorrt-rtx or none")
    if not _importable(FLAVORS[requested].module):
        if requested == "tensorrt":
            others = "--engine tensorrt-rtx" + (" / --engine none" if none_allowed else "")
            raise DSparkTrtError("--engine tensorrt: full TensorRT is not importable here (the PyPI wheels are stubs "
                                 f"without NVIDIA's index); build on a GPU host with TensorRT installed, or use {others}")
        from ..optional import missing_dependency

        raise missing_dependency(FLAVORS[requested].module, f"--engine {requested}")
    return requested  # type: ignore[return-value]


@dataclass(frozen=True)
class EngineBuildConfig:
    """How to build one engine. Batch sizes define the optimization profile of every batch-dynamic input."""

    flavor: Flavor
    max_batch_size: int = 8
    opt_batch_size: int | None = None  # defaults to max_batch_size
    dynamic_ranges: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # other symbolic dims
    #: more optimization profiles after profile 0, each overriding some of ``dynamic_ranges`` (a profile whose
    #: shapes are smaller needs less activation memory, and TensorRT tunes it for its own opt shapes)
    extra_profiles: tuple[dict[str, tuple[int, int, int]], ...] = ()
    batch_dim: str = "B"  # the symbolic batch dimension of the exported graphs
    version_compatible: bool = False  # full TensorRT: runs on later runtimes of the same major version
    hardware_compatibility: Literal["none", "ampere_plus", "same_compute_capability"] = "none"
    compute_capability: str = "SM80"  # TensorRT-RTX: target GPU architecture (no GPU needed to build)
    builder_optimization_level: int | None = None
    #: TensorRT may run fp32 GEMMs and convolutions as TF32 (10-bit mantissa; ``BuilderFlag.TF32`` is on by
    #: default); False clears it, so an fp32 export's engines compute in fp32 as its references do
    tf32: bool = True
    register_plugins: Callable[[], None] | None = None  # called in the building process before parsing

    def __post_init__(self) -> None:
        if self.flavor == "tensorrt-rtx" and self.version_compatible:
            raise DSparkTrtError("--version-compatible is a full-TensorRT option (a lean-runtime engine); TensorRT-RTX "
                                 "engines cannot be built with it: drop the flag, or build with --engine tensorrt on a "
                                 "GPU host with TensorRT")
        opt = self.opt_batch_size or self.max_batch_size
        if not 1 <= opt <= self.max_batch_size:
            raise DSparkTrtError(f"--opt-batch-size {opt} must be in [1, --max-batch-size {self.max_batch_size}]")

    @property
    def batch_range(self) -> tuple[int, int, int]:
        return 1, self.opt_batch_size or self.max_batch_size, self.max_batch_size

    @property
    def profile_ranges(self) -> list[dict[str, tuple[int, int, int]]]:
        """The dynamic ranges of every optimization profile, profile 0 first."""
        return [dict(self.dynamic_ranges)] + [{**self.dynamic_ranges, **extra} for extra in self.extra_profiles]

    def describe(self) -> dict:
        """JSON-able build flags for the manifest."""
        return {
            "flavor": self.flavor,
            "batch": dict(zip(("min", "opt", "max"), self.batch_range)),
            "dynamic_ranges": {k: list(v) for k, v in self.dynamic_ranges.items()},
            "extra_profiles": [{k: list(v) for k, v in extra.items()} for extra in self.extra_profiles],
            "version_compatible": self.version_compatible,
            "hardware_compatibility": self.hardware_compatibility,
            "compute_capability": self.compute_capability if self.flavor == "tensorrt-rtx" else None,
            "strongly_typed": True,
            "tf32": self.tf32,
        }


def onnx_inputs(onnx_path: str | Path) -> dict[str, list[int | str]]:
    """Graph inputs (not initializers) → dims, symbolic dims as their names (reads the header only)."""
    from ..artifact.external_data import load_graph_only

    model = load_graph_only(onnx_path)
    inits = {i.name for i in model.graph.initializer}
    out = {}
    for value in model.graph.input:
        if value.name in inits:
            continue
        dims = value.type.tensor_type.shape.dim
        out[value.name] = [d.dim_param if d.dim_param else (d.dim_value if d.HasField("dim_value") else "?") for d in dims]
    return out


def profile_shapes(
    inputs: dict[str, list[int | str]],
    batch: tuple[int, int, int],
    dynamic_ranges: dict[str, tuple[int, int, int]] | None = None,
    batch_dim: str = "B",
) -> dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    """(min, opt, max) shapes per input: the symbolic ``batch_dim`` takes ``batch``, others their range.

    An unnamed dynamic dimension or a symbolic one without a range is a user error (the engine could not be
    built without guessing).
    """
    ranges = {batch_dim: batch, **(dynamic_ranges or {})}
    shapes = {}
    for name, dims in inputs.items():
        lo, mid, hi = [], [], []
        for d in dims:
            if isinstance(d, int):
                lo.append(d), mid.append(d), hi.append(d)
            elif d in ranges:
                a, b, c = ranges[d]
                lo.append(a), mid.append(b), hi.append(c)
            else:
                raise DSparkTrtError(
                    f"input {name} has a dynamic dimension {d!r} without a range; give one "
                    f"(EngineBuildConfig.dynamic_ranges) or export with static shapes"
                )
        shapes[name] = (tuple(lo), tuple(mid), tuple(hi))
    return shapes


def _build_interruptibly(build_call: Callable[[], object], build, trt):
    """``build_call()`` (TensorRT's ``build_serialized_network…``) that Ctrl-C stops → what it returned.

    A ``KeyboardInterrupt`` raised inside one of TensorRT's Python callbacks (logger, progress monitor) is
    caught and printed by the bindings and the build goes on. So the build runs in a worker thread while this
    (main) thread waits, where Ctrl-C raises at once: the flag it sets makes the progress monitor cancel the
    build at TensorRT's next step (``step_complete`` → False), and the interrupt propagates immediately, so
    the caller's cleanup runs. The worker is not a daemon: the process exits once TensorRT has stopped.
    """
    interrupted = threading.Event()
    build.progress_monitor = _Progress(trt, interrupted).monitor
    result: dict = {}
    done = threading.Event()

    def work():
        try:
            result["plan"] = build_call()
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            result["error"] = e
        finally:
            done.set()

    threading.Thread(target=work, name="tensorrt-build").start()
    try:
        while not done.wait(0.1):  # not Thread.join: an interrupted join marks the thread finished (3.11)
            pass
    except KeyboardInterrupt:
        interrupted.set()
        log.warning("interrupted: the engine build stops at TensorRT's next step")
        raise
    if "error" in result:
        raise result["error"]
    return result.get("plan")


def _file_writer(trt, f):
    """TensorRT's ``IStreamWriter`` onto the open file ``f``: the serializer hands the plan over in pieces (64 MiB
    each with TensorRT-RTX 1.7), so no whole plan is ever held in memory. A write error (a full disk) is kept in
    ``.error`` and answered with 0 bytes written, which ends the build; the caller raises it."""

    class FileWriter(trt.IStreamWriter):
        def __init__(self):
            trt.IStreamWriter.__init__(self)
            self.error: BaseException | None = None
            self.written = 0

        def write(self, data) -> int:
            if self.error is not None:
                return 0
            try:
                f.write(data)
            except BaseException as e:  # noqa: BLE001 - re-raised by the caller after TensorRT returns
                self.error = e
                return 0
            self.written += len(data)
            return len(data)

    return FileWriter()


class _Progress:
    """TensorRT build progress: a bar per phase on a TTY, one log line per phase otherwise; a set
    ``interrupted`` flag cancels the build at its next step."""

    def __init__(self, trt, interrupted: threading.Event | None = None):
        base = trt.IProgressMonitor
        stop = interrupted or threading.Event()

        class Monitor(base):  # type: ignore[misc, valid-type]
            def __init__(self):
                base.__init__(self)
                self.bars, self.starts = {}, {}
                self.tty = sys.stderr.isatty()

            def phase_start(self, phase_name, parent_phase, num_steps):
                self.starts[phase_name] = time.perf_counter()
                if self.tty:
                    from tqdm import tqdm

                    self.bars[phase_name] = tqdm(total=num_steps, desc=phase_name, leave=False, file=sys.stderr)
                elif parent_phase is None:
                    log.info("engine build: %s (%d steps)", phase_name, num_steps)

            def step_complete(self, phase_name, step):
                if phase_name in self.bars:
                    self.bars[phase_name].update(1)
                return not stop.is_set()  # False: TensorRT cancels the build

            def phase_finish(self, phase_name):
                bar = self.bars.pop(phase_name, None)
                if bar is not None:
                    bar.close()
                log.debug("engine build: %s done in %.1fs", phase_name, time.perf_counter() - self.starts.pop(phase_name, 0))

        self.monitor = Monitor()


class _Logger:
    """Route TensorRT's logger to ours (warnings and errors; everything with -vv)."""

    @staticmethod
    def create(trt):
        class Logger(trt.ILogger):  # type: ignore[misc, valid-type]
            def __init__(self):
                trt.ILogger.__init__(self)
                self.errors: list[str] = []

            def log(self, severity, msg):
                if severity in (trt.ILogger.Severity.INTERNAL_ERROR, trt.ILogger.Severity.ERROR):
                    self.errors.append(msg)
                    log.debug("TensorRT: %s", msg)
                elif severity == trt.ILogger.Severity.WARNING:
                    log.debug("TensorRT warning: %s", msg)
                else:
                    log.debug("TensorRT: %s", msg)

        return Logger()


def union_engine_refusal(flavor: str, markov_topm: int | None = None) -> str:
    """Why TensorRT-RTX builds no engine for a candidate-union draft graph, and what to do instead (one line).

    Measured with TensorRT-RTX 1.7 (CPU build for SM80): the union's standard-op local function parses in
    0.1 s, but one chained step with a dynamic batch takes the builder 15 s (the plain op's: 0.5 s), two steps
    more than 4 min, and the tiny drafter's N = 7 graph did not finish in 15 min. TensorRT-RTX has no plugins,
    so it refuses the graph rather than hang; full TensorRT builds the plugin graph (DSparkTopKMarkovUnion)."""
    m = f" {markov_topm}" if markov_topm else ""
    return (f"--markov-topm{m}: no {flavor} engine for a candidate-union draft graph (the {flavor} builder does not "
            f"finish on its standard-op local function); build with --engine tensorrt on a GPU host (the union "
            f"plugin), run it with the onnxruntime backend (--engine none), or use --markov-topm 0")


def check_version_compatible(version_compatible: bool, plugin_op: str | None) -> None:
    """Refuse, in one line, a version-compatible engine around an AOT plugin (``plugin_op``: the draft graph's
    plugin op, None without one). A version-compatible plan runs on the lean runtime it embeds, and TensorRT
    documents no support there for quickly-deployable AOT plugin layers; until that has been shown to work on a
    GPU host, the combination is refused before anything runs."""
    if not version_compatible or plugin_op is None:
        return
    raise DSparkTrtError(f"--version-compatible with the {plugin_op} AOT plugin is not supported: TensorRT does "
                         f"not document AOT plugin layers in version-compatible (lean-runtime) engines and it has not "
                         f"been shown to work; drop --version-compatible (rebuild with dspark build-engine OUT --force "
                         f"after a TensorRT upgrade), or export with --topk off (no plugin)")


def check_engine_graph(onnx_path: str | Path, flavor: str) -> None:
    """Refuse, in one line, an ONNX graph this flavor cannot build: TensorRT-RTX and the candidate-union node."""
    from ..plugins.contract import OP_DOMAIN, UNION_OP_NAME
    from ..artifact.external_data import load_graph_only

    if flavor != "tensorrt-rtx":
        return
    try:
        model = load_graph_only(onnx_path)
    except DSparkTrtError:  # not readable as ONNX: the parser reports it (one line) in build_engine
        return
    node = next((n for n in model.graph.node if n.domain == OP_DOMAIN and n.op_type == UNION_OP_NAME), None)
    if node is not None:
        m = next((a.i for a in node.attribute if a.name == "markov_topm"), None)
        raise DSparkTrtError(f"{onnx_path}: " + union_engine_refusal(flavor, m))


def build_engine(onnx_path: str | Path, config: EngineBuildConfig) -> bytes:
    """Parse ``onnx_path`` and build a serialized engine with ``config.flavor``. Needs the library."""
    return bytes(_build_plan(onnx_path, config))


def write_engine(onnx_path: str | Path, config: EngineBuildConfig, path: str | Path) -> int:
    """Build like ``build_engine`` and write the plan to ``path`` atomically → its size in bytes.

    Where the library can (``build_serialized_network_to_stream``: TensorRT-RTX 1.7, recent TensorRT) the
    serializer writes the plan straight into the file piece by piece, so the whole plan is never in memory: on
    the 2.72 GB draft graph of ``dspark_qwen3_4b_block7`` the build's peak falls from 8.65 to 6.55 GB (3.2× →
    2.4× the weights; docs/export.md). Otherwise the plan is written from TensorRT's own buffer (never copied
    into a ``bytes`` first)."""
    from ..atomic import atomic_output_file

    with atomic_output_file(path) as tmp:
        with open(tmp, "wb") as f:
            plan = _build_plan(onnx_path, config, out=f)
            if isinstance(plan, int):  # streamed into f
                return plan
            view = memoryview(plan).cast("B")  # the library has no stream writer: its buffer
            for start in range(0, view.nbytes, 1 << 26):  # 64 MiB per write
                f.write(view[start:start + (1 << 26)])
            return view.nbytes


def apply_build_flags(build, trt, config: EngineBuildConfig) -> None:
    """The builder config's flags from ``config``: version compatibility, hardware compatibility (full TensorRT),
    the compute capability (TensorRT-RTX), the optimization level, and TF32 cleared unless allowed
    (``EngineBuildConfig.tf32``; ``get_flag(BuilderFlag.TF32)`` is then False)."""
    if config.version_compatible:
        build.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
    if not config.tf32:
        build.clear_flag(trt.BuilderFlag.TF32)
    if config.hardware_compatibility != "none" and config.flavor == "tensorrt":
        build.hardware_compatibility_level = getattr(trt.HardwareCompatibilityLevel, config.hardware_compatibility.upper())
    if config.flavor == "tensorrt-rtx":
        build.num_compute_capabilities = 1
        build.set_compute_capability(getattr(trt.ComputeCapability, config.compute_capability), 0)
    if config.builder_optimization_level is not None:
        build.builder_optimization_level = config.builder_optimization_level


def _build_plan(onnx_path: str | Path, config: EngineBuildConfig, out=None):
    """The serialized engine as TensorRT's ``IHostMemory`` (buffer protocol); with ``out`` (a file open for
    writing) and a library that can stream, the plan written into ``out`` instead → its size in bytes. The parser
    reads the graph *from its path* (``parse_from_file``), so external data (``<graph>.onnx.data``, graphs over
    2 GiB) resolves beside it."""
    check_engine_graph(onnx_path, config.flavor)  # before importing TensorRT: a one-line refusal anywhere
    from ..artifact.external_data import external_data_files

    external_data_files(onnx_path)  # a missing or short .data file: one line now, not a parser error later
    trt = importlib.import_module(FLAVORS[config.flavor].module)
    if config.register_plugins is not None:
        config.register_plugins()
    logger = _Logger.create(trt)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(parser.get_error(i).desc() for i in range(parser.num_errors))
        raise DSparkTrtError(f"{config.flavor} could not parse {onnx_path}: {errors}")
    build = builder.create_builder_config()
    inputs = {network.get_input(i).name: list(network.get_input(i).shape) for i in range(network.num_inputs)}
    symbolic = onnx_inputs(onnx_path)
    for ranges in config.profile_ranges:  # profile 0, then the narrower ones (the target's verify profile)
        profile = builder.create_optimization_profile()
        for name, (lo, opt, hi) in profile_shapes(symbolic, config.batch_range, ranges, config.batch_dim).items():
            if name in inputs:
                profile.set_shape(name, lo, opt, hi)
        build.add_optimization_profile(profile)
    apply_build_flags(build, trt, config)
    if out is not None and hasattr(builder, "build_serialized_network_to_stream"):
        writer = _file_writer(trt, out)
        ok = _build_interruptibly(lambda: builder.build_serialized_network_to_stream(network, build, writer),
                                  build, trt)
        if writer.error is not None:
            raise writer.error
        plan = writer.written if ok else None
    else:
        plan = _build_interruptibly(lambda: builder.build_serialized_network(network, build), build, trt)
    if plan is None:
        raise DSparkTrtError(f"{config.flavor} engine build failed for {onnx_path}: " + "; ".join(logger.errors[-3:]))
    return plan


class EngineFromOnnx:
    """Lazy loader: ``EngineFromOnnx(onnx_path, config)()`` → serialized engine bytes."""

    def __init__(self, onnx, config: EngineBuildConfig):
        self._onnx, self.config = onnx, config

    def __call__(self) -> bytes:
        path = self._onnx() if callable(self._onnx) else self._onnx
        return build_engine(path, self.config)
