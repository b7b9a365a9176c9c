"""Running an export's TensorRT engines from PyTorch, inside CUDA graphs.

    graph = TensorRTGraph.from_export(export_dir, "draft", max_batch=8)   # a manifest engine + its I/O
    outputs = graph.run({"anchor": ..., "ctx_k": ..., ...})              # {name: tensor}, like OrtGraph.run

``TensorRTGraph.run`` pads the batch (and the context length) into a bucket's static buffers, and replays
that bucket's CUDA graph (``runtime.cuda_graphs.GraphRunner``): per (batch bucket, context bucket) one
execution context with ``set_input_shape`` for the bucket's shapes and ``set_tensor_address`` pointing at
the static buffers, warmed up by one ``execute_async_v3`` on the engine's non-default stream, then captured.
Shapes the buckets do not cover (a long prefill) run eagerly with exact shapes, through a small cache of
exact-shape contexts (``ContextCache``).

Memory and lifetimes (``NvInferRuntime.h``):

* Every context is created with ``ExecutionContextAllocationStrategy.USER_MANAGED`` and handed the engine's
  **one** scratch buffer of ``device_memory_size_v2`` bytes (``set_device_memory``): with the default
  ``STATIC`` strategy each context would reserve the activation memory of the engine's largest profile
  shape on its own, dozens of times over. Sharing is safe because every context of an engine runs on the
  engine's one stream (``TensorRTEngine.stream``), so no two of them run at once.
* An engine with several optimization profiles (the target: prefill, and a small-Q one for verify rounds)
  runs each context on the profile that holds its shapes and needs the least memory (``choose_profile``,
  ``set_optimization_profile_async``).
* Context memory and bound tensors are in use until enqueued work finishes: nothing is dropped (an evicted
  exact-shape context, ``deactivate``) before the engine's stream is synchronised.
* What TensorRT allocates itself (the weights, per-context state) goes through the runtime's counting allocator
  (``tensorrt_memory``), backed by torch's caching allocator: counted per engine (``allocated_bytes``) and
  inside the caching allocator's reservation. ``DSPARK_TRT_ALLOCATOR=default`` leaves TensorRT's own.
* Tensor addresses are 256-byte aligned (``TENSOR_ALIGNMENT``): a view with a storage offset is copied into
  an aligned buffer first (``aligned``, ``aligned_empty``).
* At load, the engine's own I/O (names, input/output, dtypes, ranks, fixed dimensions) is compared with the
  manifest's (``check_engine_io``): output buffers are sized from the manifest, so a mismatch is refused.

Pure, CPU-tested parts: ``check_engine_version`` (the TensorRT version recorded in the manifest against the
installed one; version-compatible engines need ``engine_host_code_allowed``), ``plan_io`` (static buffer
shapes and dtypes from the manifest's I/O for given symbolic dimensions), ``check_engine_io``,
``choose_profile``, ``ContextCache``, the alignment helpers, ``tensorrt_available`` (the one-line refusal).
The rest is thin and needs TensorRT and a GPU. AOT plugins need no registration at run time: the kernel is
inside the engine.
"""

from __future__ import annotations

import functools
import logging
import math
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Hashable, Mapping, Sequence

import torch

from ..errors import DSparkTrtError, DSparkTrtInternalError
from .cuda_graphs import BucketPolicy, GraphKey, GraphRunner, InputSpec

__all__ = ["TORCH_DTYPES", "TRT_DTYPES", "TENSOR_ALIGNMENT", "IoTensor", "EngineTensor", "Profile",
           "check_engine_version", "plan_io", "io_tensors", "input_specs", "output_batch_dims", "check_engine_io",
           "choose_profile", "select_profile", "ContextCache", "aligned", "aligned_empty", "bind_inputs",
           "trt_enum_name", "tensorrt_available", "require_tensorrt", "TensorRTEngine", "TensorRTGraph", "engine_entry",
           "engine_memory_report"]

log = logging.getLogger("dspark.tensorrt")

#: manifest dtype names → torch
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                "int32": torch.int32, "int64": torch.int64, "bool": torch.bool, "int8": torch.int8,
                "uint8": torch.uint8}
_DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
#: TensorRT ``DataType`` member names → the manifest's dtype names
TRT_DTYPES = {"FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "INT32": "int32", "INT64": "int64",
              "BOOL": "bool", "INT8": "int8", "UINT8": "uint8"}
#: every tensor address bound to a context must be a multiple of this (``setTensorAddress``)
TENSOR_ALIGNMENT = 256


# ------------------------------------------------------------------------------------------------ pure
def _version_tuple(version: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in str(version).split(".") if x.isdigit())
    except ValueError:
        raise DSparkTrtError(f"cannot read TensorRT version {version!r}") from None


def check_engine_version(entry: Mapping[str, Any], installed: str) -> bool:
    """Whether an engine of the manifest (``engines[...]`` entry) may be deserialized by TensorRT ``installed``;
    returns True when it needs ``engine_host_code_allowed`` (a version-compatible engine, which embeds a lean
    runtime). One-line errors name the fix."""
    built = entry.get("version")
    name = entry.get("file", "the engine")
    vc = bool((entry.get("build") or {}).get("version_compatible"))
    if entry.get("flavor", "tensorrt") != "tensorrt":
        raise DSparkTrtError(f"{name} is a {entry.get('flavor')} engine; the tensorrt backend runs full-TensorRT "
                             f"engines (dspark build-engine OUT --engine tensorrt on the GPU host)")
    if not built:
        raise DSparkTrtError(f"the manifest records no TensorRT version for {name}; rebuild it with "
                             f"dspark build-engine OUT --force")
    have, want = _version_tuple(installed), _version_tuple(built)
    if vc:
        if have[:1] != want[:1] or have < want:
            raise DSparkTrtError(f"{name} is version-compatible with TensorRT {want[0]}.x >= {built}, but TensorRT "
                                 f"{installed} is installed; rebuild it here with dspark build-engine OUT --force")
        return True
    if have != want:
        raise DSparkTrtError(f"{name} was built with TensorRT {built} and TensorRT {installed} is installed: a plan "
                             f"runs only on the exact version it was built with; rebuild it here (dspark "
                             f"build-engine OUT --force) or export with --version-compatible")
    return False


@dataclass(frozen=True)
class IoTensor:
    """One engine input/output from the manifest: name, torch dtype, shape (symbolic dims as names)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int | str, ...]
    is_input: bool

    def dim_index(self, symbol: str) -> int | None:
        return self.shape.index(symbol) if symbol in self.shape else None


def io_tensors(io: Mapping[str, Sequence[Mapping[str, Any]]]) -> tuple[IoTensor, ...]:
    """The manifest's ``{"inputs": [...], "outputs": [...]}`` (``export.manifest.graph_io``) as ``IoTensor``s."""
    out = []
    for side, is_input in (("inputs", True), ("outputs", False)):
        for t in io.get(side, []):
            if t["dtype"] not in TORCH_DTYPES:
                raise DSparkTrtError(f"tensor {t['name']} has dtype {t['dtype']}, which the TensorRT backend "
                                     f"cannot bind; re-export")
            out.append(IoTensor(t["name"], TORCH_DTYPES[t["dtype"]], tuple(t["shape"]), is_input))
    if not any(t.is_input for t in out) or all(t.is_input for t in out):
        raise DSparkTrtError("the manifest's I/O lists no inputs or no outputs; re-run dspark-export")
    return tuple(out)


def plan_io(tensors: Sequence[IoTensor], dims: Mapping[str, int],
            extra: Mapping[str, int] | None = None) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Static buffer (shape, dtype) per tensor for the symbolic dimensions ``dims`` (e.g. {"B": 4, "T": 256}).

    ``extra`` resolves a dimension that is a *sum* in the graph (the ONNX exporter names it freely), by tensor
    name: e.g. ``{"attention_mask": P + Q}``. An unresolved symbolic dimension is a one-line error."""
    plan = {}
    for t in tensors:
        shape = []
        for i, d in enumerate(t.shape):
            if isinstance(d, int):
                shape.append(d)
            elif d in dims:
                shape.append(int(dims[d]))
            elif extra and t.name in extra:
                shape.append(int(extra[t.name]))
            else:
                raise DSparkTrtError(f"{'input' if t.is_input else 'output'} {t.name} has dimension {d!r} (axis {i}) "
                                     f"that is not one of {sorted(dims)}; the engine's I/O does not match the "
                                     f"exported graph contract")
        plan[t.name] = (tuple(shape), t.dtype)
    return plan


def input_specs(tensors: Sequence[IoTensor], batch_dim: str = "B", context_dim: str | None = None,
                fills: Mapping[str, tuple[float, float]] | None = None,
                context_plus: Mapping[str, tuple[str, int]] | None = None,
                fixed: Mapping[str, int] | None = None, bound: Sequence[str] = ()) -> tuple[InputSpec, ...]:
    """The graph runner's static inputs for an engine's I/O: where the batch and context dimensions are, and
    the padding fills ({input: (padded-request fill, padded-context fill)}, default 0).

    ``context_plus`` {input: (symbol, n)}: the input's dimension ``symbol`` is the context plus ``n`` fixed
    slots after it (the target's ``attention_mask`` [B, S = P + Q]: the Q new tokens stay last). ``fixed``
    gives other symbolic dimensions their value for this runner (the target's Q). ``bound``: inputs whose
    static buffer is the caller's own tensor, bound by address and never copied (the target's K/V cache)."""
    fills, context_plus, fixed = fills or {}, context_plus or {}, fixed or {}
    specs = []
    for t in tensors:
        if not t.is_input:
            continue
        ctx, extra = (t.dim_index(context_dim) if context_dim else None), 0
        if t.name in context_plus:
            symbol, extra = context_plus[t.name]
            ctx = t.dim_index(symbol)
        specs.append(InputSpec(t.name, tuple(d if isinstance(d, int) else fixed.get(d, 0) for d in t.shape), t.dtype,
                               t.dim_index(batch_dim), ctx, *fills.get(t.name, (0, 0)), context_extra=extra,
                               bound=t.name in bound))
    return tuple(specs)


def output_batch_dims(tensors: Sequence[IoTensor], batch_dim: str = "B") -> dict[str, int]:
    """Output name → the axis that holds the batch (unpadding slices it)."""
    return {t.name: t.dim_index(batch_dim) or 0 for t in tensors if not t.is_input}


# ------------------------------------------------------------------------------------ engine I/O (pure)
@dataclass(frozen=True)
class EngineTensor:
    """One I/O tensor as the deserialized engine reports it: shape with -1 for dynamic dimensions, dtype as the
    manifest names it (``TRT_DTYPES``; TensorRT's own name when it has none there)."""

    name: str
    is_input: bool
    dtype: str
    shape: tuple[int, ...]


def trt_enum_name(value: Any) -> str:
    """The member name of a TensorRT enum value (``DataType.BF16`` → ``"BF16"``)."""
    name = getattr(value, "name", None)
    return str(name) if name is not None else str(value).rsplit(".", 1)[-1]


def check_engine_io(engine_io: Sequence[EngineTensor], tensors: Sequence[IoTensor], what: str = "the engine") -> None:
    """Refuse (one line) an engine whose I/O is not the manifest's: the same names on the same side (input or
    output), dtypes, ranks, and every dimension the manifest fixes. The runtime binds buffers sized and typed
    from the manifest, so a plan built from another graph would read or write past them."""
    have, want = {t.name: t for t in engine_io}, {t.name: t for t in tensors}
    problems = [f"the manifest's {'input' if want[n].is_input else 'output'} {n} is missing"
                for n in want if n not in have]
    problems += [f"{'input' if have[n].is_input else 'output'} {n} is not in the manifest"
                 for n in have if n not in want]
    for name in (n for n in want if n in have):
        e, m = have[name], want[name]
        if e.is_input != m.is_input:
            problems.append(f"{name} is an {'input' if e.is_input else 'output'}, the manifest has an "
                            f"{'input' if m.is_input else 'output'}")
        if e.dtype != _DTYPE_NAMES[m.dtype]:
            problems.append(f"{name} is {e.dtype}, the manifest says {_DTYPE_NAMES[m.dtype]}")
        if len(e.shape) != len(m.shape):
            problems.append(f"{name} has rank {len(e.shape)}, the manifest's shape {list(m.shape)} rank {len(m.shape)}")
        else:
            fixed = [(i, d, int(e.shape[i])) for i, d in enumerate(m.shape)
                     if isinstance(d, int) and e.shape[i] != -1 and int(e.shape[i]) != d]
            problems += [f"{name} dimension {i} is {got}, the manifest says {d}" for i, d, got in fixed]
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        raise DSparkTrtError(f"{what} does not match the export's manifest: {'; '.join(problems[:3])}{more}; rebuild "
                             f"it from this export (dspark build-engine OUT --force)")


@dataclass(frozen=True)
class Profile:
    """One optimization profile: (min, max) shape per input, and the activation memory it needs."""

    index: int
    shapes: Mapping[str, tuple[tuple[int, ...], tuple[int, ...]]]
    memory: int = 0  # bytes (get_device_memory_size_for_profile_v2)

    def holds(self, shapes: Mapping[str, Sequence[int]]) -> bool:
        for name, shape in shapes.items():
            if name not in self.shapes:
                continue  # not a dynamic input of the engine: its shape is fixed, set_input_shape checks it
            lo, hi = self.shapes[name]
            if len(shape) != len(lo) or any(not a <= int(x) <= b for x, a, b in zip(shape, lo, hi)):
                return False
        return True


def choose_profile(profiles: Sequence[Profile], shapes: Mapping[str, Sequence[int]]) -> int:
    """The index of the profile that holds every input shape and needs the least activation memory (the small-Q
    verify profile for a verify round, the prefill profile for a prefill), the lowest index on a tie; a
    one-line error naming the fix when none holds them. No profiles listed: 0."""
    if not profiles:
        return 0
    fits = [p for p in profiles if p.holds(shapes)]
    if not fits:
        wide = max(profiles, key=lambda p: p.memory)
        bad = next((n for n in shapes if n in wide.shapes and not Profile(0, {n: wide.shapes[n]}).holds(
            {n: shapes[n]})), next(iter(shapes), "?"))
        lo, hi = wide.shapes.get(bad, ((), ()))
        raise DSparkTrtError(f"input {bad} shape {tuple(int(x) for x in shapes.get(bad, ()))} is outside every "
                             f"profile of the engine (at most {tuple(hi)}, at least {tuple(lo)}); rebuild with a "
                             f"larger --max-batch-size / --max-context")
    return min(fits, key=lambda p: (p.memory, p.index)).index


def select_profile(ctx, profile: int, stream: int, engine: str = "the") -> None:
    """``ctx.set_optimization_profile_async(profile, stream)``, a refusal as one line. TensorRT's Python binding
    raises ``RuntimeError`` (``PY_ASSERT_RUNTIME_ERROR``) when the C++ call returns false and otherwise returns
    True; a False is treated the same (older bindings)."""
    try:
        ok = ctx.set_optimization_profile_async(profile, stream)
    except RuntimeError as e:
        why = str(e).splitlines()[0] if str(e) else "RuntimeError"
        ok, detail = False, f": {why}"
    else:
        detail = ""
    if not ok:
        raise DSparkTrtError(f"TensorRT could not select optimization profile {profile} of the {engine} engine"
                             f"{detail} (see the TensorRT log above); rebuild the engines with this TensorRT: "
                             f"dspark build-engine OUT --engine tensorrt --force")


class ContextCache:
    """Execution contexts by key, at most ``capacity`` (None: no bound), the least recently used dropped
    first. ``synchronize`` runs before any context is dropped: work enqueued through it may still be running,
    and its memory and bound tensors are in use until that work finishes."""

    def __init__(self, synchronize: Callable[[], None], capacity: int | None = None):
        if capacity is not None and capacity < 1:
            raise DSparkTrtError(f"context cache capacity {capacity} must be >= 1")
        self.synchronize, self.capacity = synchronize, capacity
        self._items: OrderedDict[Hashable, Any] = OrderedDict()

    def get(self, key: Hashable, create: Callable[[], Any]) -> Any:
        if key in self._items:
            self._items.move_to_end(key)
            return self._items[key]
        if self.capacity is not None and len(self._items) >= self.capacity:
            self.synchronize()
            while len(self._items) >= self.capacity:
                self._items.popitem(last=False)
        value = self._items[key] = create()
        return value

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        if self._items:
            self.synchronize()
        self._items.clear()


# ------------------------------------------------------------------------------------- alignment (pure)
def aligned_empty(shape: Sequence[int], dtype: torch.dtype, device: str | torch.device = "cpu",
                  alignment: int = TENSOR_ALIGNMENT) -> torch.Tensor:
    """An uninitialised contiguous tensor whose address is a multiple of ``alignment`` bytes: a byte buffer
    at most ``alignment`` bytes larger, viewed from its first aligned byte (the view keeps it alive)."""
    shape = tuple(int(d) for d in shape)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    raw = torch.empty(nbytes + alignment, dtype=torch.uint8, device=device)
    offset = -raw.data_ptr() % alignment
    return raw[offset: offset + nbytes].view(dtype).view(shape)


def aligned(t: torch.Tensor, alignment: int = TENSOR_ALIGNMENT) -> torch.Tensor:
    """``t`` itself when it is contiguous at an aligned address, else an aligned contiguous copy (a view with
    a storage offset is contiguous but may start anywhere)."""
    if t.is_contiguous() and t.data_ptr() % alignment == 0:
        return t
    out = aligned_empty(t.shape, t.dtype, t.device, alignment)
    out.copy_(t)
    return out


def bind_inputs(specs: Sequence[InputSpec], feeds: Mapping[str, torch.Tensor],
                device: str | torch.device) -> dict[str, torch.Tensor]:
    """The feeds as the exact-shape path binds them: on ``device``, in the engine's dtype, contiguous and
    256-byte aligned."""
    return {s.name: aligned(feeds[s.name].to(device, s.dtype)) for s in specs}


@functools.cache
def tensorrt_available() -> str | None:
    """None when full TensorRT is importable and a CUDA device is visible, else why not (one line)."""
    try:
        import tensorrt  # noqa: F401
    except Exception as e:  # the PyPI stub fails in many ways
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        return f"full TensorRT is not importable ({reason[:100]})"
    if not torch.cuda.is_available():
        return "no CUDA device is visible"
    return None


def require_tensorrt(what: str = "the tensorrt backend") -> None:
    why = tensorrt_available()
    if why is not None:
        raise DSparkTrtError(f"{what} needs full TensorRT and a GPU: {why}; use --backend onnxruntime or torch "
                             f"here, or run on a GPU host with TensorRT installed")


#: the counting allocators of every engine of the process: TensorRT requires an allocator to outlive every object
#: that uses it, and an engine's memory is handed back through it when the engine goes (``tensorrt_memory``)
_ALLOCATORS: list = []


def _install_counting_allocator(trt, runtime, device):
    """``runtime.gpu_allocator`` = a counting allocator backed by torch's caching allocator (``tensorrt_memory``),
    before anything is deserialized → (ledger, allocator); (None, None) with ``DSPARK_TRT_ALLOCATOR=default``
    (TensorRT's own cudaMalloc, uncounted)."""
    import os

    if os.environ.get("DSPARK_TRT_ALLOCATOR", "counting") == "default":
        return None, None
    from .tensorrt_memory import AllocationLedger, counting_allocator, torch_backing

    ledger = AllocationLedger()
    allocator = counting_allocator(trt, ledger, *torch_backing(device))
    runtime.gpu_allocator = allocator
    _ALLOCATORS.append(allocator)
    return ledger, allocator


def engine_memory_report(name: str, scratch: int, allocated: int | None) -> dict[str, int]:
    """``{"<name> engine scratch": …, "<name> engine (TensorRT allocator)": …}``: the context scratch (a torch
    tensor) and what TensorRT allocated itself through the runtime's counting allocator (the weights); that
    entry is left out when the allocator is off. Both are part of the CUDA caching allocator's reservation."""
    report = {f"{name} engine scratch": int(scratch)}
    if allocated is not None:
        report[f"{name} engine (TensorRT allocator)"] = int(allocated)
    return report


def engine_entry(manifest: Mapping[str, Any], graph: str) -> dict:
    """The manifest's TensorRT engine entry of ``graph`` ("context", "draft" or "target"):
    ``engines["<graph>.tensorrt"]``."""
    engines = manifest.get("engines") or {}
    found = engines.get(f"{graph}.tensorrt") if isinstance(engines, dict) else None
    if found is None:
        raise DSparkTrtError(f"the export has no TensorRT {graph} engine; build it on the GPU host with "
                             f"dspark build-engine OUT --engine tensorrt")
    return dict(found)


# ------------------------------------------------------------------------------------------------ thin
class TensorRTEngine:
    """A deserialized engine (``Runtime.deserialize_cuda_engine``), checked against the manifest's version, with
    its I/O and profiles read back, one scratch buffer shared by all its contexts and one stream they run on.

    Args:
        plan: the serialized engine file.
        entry: its manifest entry (``engines["<graph>.tensorrt"]``).
        device: the CUDA device.
        name: how errors and reports name it (default: the entry's graph).
    """

    def __init__(self, plan: Path, entry: Mapping[str, Any], *, device: str | torch.device = "cuda",
                 name: str | None = None):
        require_tensorrt()
        import tensorrt as trt

        host_code = check_engine_version(entry, trt.__version__)
        self.trt = trt
        self.name = name or str(entry.get("graph") or Path(plan).stem)
        self.device = torch.device(device)
        # TensorRT deserializes onto, and creates contexts and enqueues on, the *current* device: every call that
        # touches the engine runs with this one current (``--device cuda:1``, a Triton instance on its GPU)
        with torch.cuda.device(self.device):
            self.logger = trt.Logger(trt.Logger.WARNING)
            self.runtime = trt.Runtime(self.logger)
            self.ledger, self.allocator = _install_counting_allocator(trt, self.runtime, self.device)
            if host_code:
                self.runtime.engine_host_code_allowed = True  # version-compatible: the lean runtime inside the plan
            self.engine = self.runtime.deserialize_cuda_engine(Path(plan).read_bytes())
            if self.engine is None:
                why = f" ({self.ledger.failure})" if self.ledger is not None and self.ledger.failure else ""
                raise DSparkTrtError(f"TensorRT could not deserialize {plan}{why}; rebuild it with dspark "
                                     f"build-engine OUT --force")
            self.plan_bytes = Path(plan).stat().st_size
            self.io = self._read_io()
            self.profiles = self._read_profiles()
            self.profile_uses: dict[int, int] = {}  # profile → contexts created on it (gpu-check's long-prompt row)
            self.scratch_bytes = int(self.engine.device_memory_size_v2)  # the largest profile's activations
            self.stream = torch.cuda.Stream(self.device)  # every context of this engine runs here, in order
            self.scratch = aligned_empty((max(self.scratch_bytes, 1),), torch.uint8, self.device)
        log.debug("%s engine: %d profile(s), scratch %d bytes shared by all its contexts (per profile: %s)",
                  self.name, len(self.profiles), self.scratch_bytes, [p.memory for p in self.profiles])

    def _read_io(self) -> tuple[EngineTensor, ...]:
        e, trt = self.engine, self.trt
        out = []
        for i in range(e.num_io_tensors):
            name = e.get_tensor_name(i)
            dtype = trt_enum_name(e.get_tensor_dtype(name))
            is_input = e.get_tensor_mode(name) == trt.TensorIOMode.INPUT
            out.append(EngineTensor(name, is_input, TRT_DTYPES.get(dtype, dtype),
                                    tuple(int(d) for d in e.get_tensor_shape(name))))
        return tuple(out)

    def _read_profiles(self) -> tuple[Profile, ...]:
        e = self.engine
        inputs = [t.name for t in self.io if t.is_input and -1 in t.shape]
        profiles = []
        for i in range(e.num_optimization_profiles):
            shapes = {}
            for name in inputs:
                lo, _, hi = e.get_tensor_profile_shape(name, i)
                shapes[name] = (tuple(int(d) for d in lo), tuple(int(d) for d in hi))
            profiles.append(Profile(i, shapes, int(e.get_device_memory_size_for_profile_v2(i))))
        return tuple(profiles)

    def check_io(self, tensors: Sequence[IoTensor]) -> None:
        check_engine_io(self.io, tensors, f"the {self.name} engine")

    def context(self, shapes: Mapping[str, Sequence[int]]):
        """A context on the engine's scratch (``USER_MANAGED``), on the profile that holds ``shapes``, with
        those input shapes set (``set_input_shape`` before any ``get_tensor_shape``)."""
        trt = self.trt
        with torch.cuda.device(self.device):
            ctx = self.engine.create_execution_context(trt.ExecutionContextAllocationStrategy.USER_MANAGED)
            if ctx is None:
                raise DSparkTrtError(f"TensorRT could not create an execution context for the {self.name} engine")
            ctx.set_device_memory(self.scratch.data_ptr(), self.scratch_bytes)
            profile = choose_profile(self.profiles, shapes)
            self.profile_uses[profile] = self.profile_uses.get(profile, 0) + 1
            if len(self.profiles) > 1:
                select_profile(ctx, profile, self.stream.cuda_stream, self.name)  # the stream every enqueue uses
            for name, shape in shapes.items():
                if not ctx.set_input_shape(name, tuple(int(d) for d in shape)):
                    raise DSparkTrtError(f"input {name} shape {tuple(shape)} is outside the {self.name} engine's "
                                         f"profile {profile}; rebuild with a larger --max-batch-size / --max-context")
        return ctx

    def execute(self, ctx) -> None:
        """``execute_async_v3`` on the engine's stream — where its contexts' profiles were set and where no two of
        them overlap on the shared scratch. Called from another stream (an eager round, an exact-shape run), the
        engine's stream first waits for it (the inputs were written there) and it then waits for the engine's
        (the outputs are read there, and buffers freed there are reused only after the work)."""
        current = torch.cuda.current_stream(self.device)
        outside = current != self.stream
        if outside:
            self.stream.wait_stream(current)
        with torch.cuda.device(self.device):  # the engine's device current (no-op when it already is)
            if not ctx.execute_async_v3(self.stream.cuda_stream):
                raise DSparkTrtError(f"TensorRT execute_async_v3 failed for the {self.name} engine (see the TensorRT "
                                     f"log above)")
        if outside:
            current.wait_stream(self.stream)

    def synchronize(self) -> None:
        """Wait for everything enqueued on the engine's stream (before dropping a context or a bound buffer)."""
        self.stream.synchronize()

    def reserved_bytes(self) -> int:
        """Device memory this engine's contexts reserve: the one shared scratch buffer."""
        return self.scratch_bytes

    def allocated_bytes(self) -> int | None:
        """Device memory TensorRT itself holds for this engine now (its weights, per-context state), as counted by
        the runtime's allocator; None when the counting allocator is off (``DSPARK_TRT_ALLOCATOR=default``)."""
        return None if self.ledger is None else self.ledger.live

    def memory_report(self) -> dict[str, int]:
        """Name → bytes: the shared scratch and what TensorRT allocated (``engine_memory_report``)."""
        return engine_memory_report(self.name, self.scratch_bytes, self.allocated_bytes())


class TensorRTGraph:
    """One engine as ``run({name: tensor}) -> {name: tensor}``, bucketed and graph-captured (module docstring).

    Args:
        engine: the deserialized ``TensorRTEngine``.
        tensors: its I/O (``io_tensors(manifest io)``), checked against the engine's own.
        batch_dim / context_dim: symbolic names of the batch and (optional) context dimensions.
        fills: {input: (padded-request fill, padded-context fill)}; default 0.
        role: "draft" or "target" (each role has its own graph memory pool).
        graphs: "graph" (capture), "eager" (the same padded path without capture).
        bucketed: False runs every call with exact shapes, eagerly (the context graph, whose outputs are as
            long as its inputs).
        context_plus: inputs whose context dimension has fixed extra slots (``input_specs``).
        fixed: values of the other symbolic dimensions for this graph (e.g. {"Q": 8}).
        exact_contexts: how many exact-shape contexts stay cached (least recently used dropped first).
    """

    def __init__(self, engine: TensorRTEngine, tensors: Sequence[IoTensor], *, batch_dim: str = "B",
                 context_dim: str | None = None, max_batch: int = 8, max_context: int = 0,
                 fills: Mapping[str, tuple[float, float]] | None = None, role: str = "draft",
                 graphs: str = "graph", device: str | torch.device = "cuda", bucketed: bool = True,
                 context_plus: Mapping[str, tuple[str, int]] | None = None, smallest_context: int = 128,
                 fixed: Mapping[str, int] | None = None, exact_contexts: int = 4, bound: Sequence[str] = ()):
        self.engine, self.tensors = engine, tuple(tensors)
        engine.check_io(self.tensors)
        self.bucketed = bucketed  # False: always exact shapes, no padding, no graph (outputs as long as inputs)
        self.batch_dim, self.context_dim = batch_dim, context_dim
        self.inputs = [t for t in self.tensors if t.is_input]
        self.outputs = [t for t in self.tensors if not t.is_input]
        self.output_names = [t.name for t in self.outputs]
        self.policy = BucketPolicy(max_batch, max_context if context_dim else 0, smallest_context)
        specs = input_specs(self.tensors, batch_dim, context_dim, fills, context_plus, fixed, bound)
        self._contexts = ContextCache(engine.synchronize)  # one per bucket: the buckets bound their number
        self._exact = ContextCache(engine.synchronize, exact_contexts)  # exact shapes (prefill): bounded
        self._outputs: dict[GraphKey, dict[str, torch.Tensor]] = {}
        self.runner = GraphRunner(self._enqueue, specs, role=role, device=device, mode=graphs,  # type: ignore[arg-type]
                                  output_batch_dims=self._output_batch_dims(), stream=engine.stream)

    @classmethod
    def from_export(cls, export_dir: str | Path, graph: str, **options) -> "TensorRTGraph":
        from ..artifact.export_dir import ExportDir

        export = ExportDir(export_dir)
        export_dir, manifest = export.root, export.manifest
        entry = engine_entry(manifest, graph)
        io = manifest["graphs"][graph] if graph in manifest.get("graphs", {}) else manifest["target"]["io"]
        engine = TensorRTEngine(export_dir / entry["file"], entry, device=options.get("device", "cuda"), name=graph)
        return cls(engine, io_tensors(io), **options)

    def _dims(self, feeds: Mapping[str, torch.Tensor]) -> tuple[int, int]:
        """(batch, context) of a feed, read from the first input that has each dimension."""
        batch = context = None
        for t in self.inputs:
            b, c = t.dim_index(self.batch_dim), t.dim_index(self.context_dim) if self.context_dim else None
            if batch is None and b is not None:
                batch = int(feeds[t.name].shape[b])
            if context is None and c is not None:
                context = int(feeds[t.name].shape[c])
        return batch or 0, context or 0

    def run(self, feeds: Mapping[str, torch.Tensor], plan: PadPlan | None = None,
            replay: bool = True) -> dict[str, torch.Tensor]:
        """``plan`` (optional): the caller's bucket (the target: its cache's rows and capacity), replayed from a
        CUDA graph when ``replay`` (and this graph is bucketed), else run eagerly with exactly its shapes."""
        missing = sorted({t.name for t in self.inputs} - set(feeds))
        if missing:
            raise DSparkTrtError(f"missing engine inputs {missing}")
        if plan is not None:
            return self.runner(plan, feeds) if replay and self.bucketed else self._run_exact(feeds)
        batch, context = self._dims(feeds)
        if not self.bucketed or batch > self.policy.max_batch or context > (self.policy.max_context or 0):
            return self._run_exact(feeds)  # beyond the buckets: exact shapes, no graph
        plan = self.policy.plan(batch, context)
        return self.runner(plan, feeds)

    def _output_batch_dims(self) -> dict[str, int]:
        return output_batch_dims(self.tensors, self.batch_dim)

    def _run_exact(self, feeds: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One eager call with the feeds' own shapes, on the engine's stream (``TensorRTEngine.execute``). Inputs
        and outputs are allocated on the caller's stream, which waits for the engine's afterwards: freeing them
        is ordered after the work. The context is cached per shape (bounded); an evicted one is dropped after a
        synchronize."""
        device = self.runner.device
        static = bind_inputs(self.runner.specs, feeds, device)
        shapes = {name: tuple(t.shape) for name, t in static.items()}
        ctx = self._exact.get(tuple(sorted(shapes.items())), lambda: self.engine.context(shapes))
        outputs = {t.name: aligned_empty(tuple(ctx.get_tensor_shape(t.name)), t.dtype, device) for t in self.outputs}
        for name, t in {**static, **outputs}.items():
            ctx.set_tensor_address(name, t.data_ptr())
        self.engine.execute(ctx)
        return outputs

    def _enqueue(self, static: dict[str, torch.Tensor], key: GraphKey) -> dict[str, torch.Tensor]:
        """set_input_shape / set_tensor_address into ``static`` and this key's outputs; execute_async_v3 on the
        current stream (the graph runner's: the engine's stream). Creates the context and allocates only on the
        first (warm-up) call of a key, never inside a capture."""
        ctx = self._contexts.get(key, lambda: self.engine.context({n: tuple(t.shape) for n, t in static.items()}))
        if key not in self._outputs:
            device = self.runner.device
            self._outputs[key] = {t.name: aligned_empty(tuple(ctx.get_tensor_shape(t.name)), t.dtype, device)
                                  for t in self.outputs}
        outputs = self._outputs[key]
        for name, t in {**static, **outputs}.items():
            if t.data_ptr() % TENSOR_ALIGNMENT:  # the runner's static buffers come from the caching allocator
                raise DSparkTrtInternalError(f"static buffer {name} is not {TENSOR_ALIGNMENT}-byte aligned")
            ctx.set_tensor_address(name, t.data_ptr())
        self.engine.execute(ctx)  # inside a capture the current stream is the engine's: enqueued as is
        return outputs

    def forget(self, which) -> int:
        """Drop the captured graphs whose ``GraphKey`` ``which`` selects, after the engine's stream has finished
        what it was given: the buffers bound to them moved (the target's K/V cache grew or changed its rows).
        Their contexts and output buffers stay: addresses are set again on every enqueue."""
        self.engine.synchronize()
        return self.runner.drop(which)

    # lifetime
    def activate(self) -> "TensorRTGraph":
        self.runner.activate()
        return self

    def deactivate(self) -> None:
        """Drop graphs, contexts and buffers, after the engine's stream has finished what it was given."""
        self.engine.synchronize()
        self.runner.deactivate()
        self._contexts.clear()
        self._exact.clear()
        self._outputs.clear()
