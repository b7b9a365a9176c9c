"""Running an export's TensorRT engines from PyTorch, inside CUDA graphs.

    graph = TensorRTGraph.from_export(export_dir, "draft", max_batch=8)   # a manifest engine + its I/O
    outputs = graph.run({"anchor": ..., "ctx_k": ..., ...})              # {name: tensor}, like OrtGraph.run

``TensorRTGraph.run`` pads the batch (and the context length) into a bucket's static buffers, and replays
that bucket's CUDA graph (``runtime.cuda_graphs.GraphRunner``): per (batch bucket, context bucket) one
execution context with ``set_input_shape`` for the bucket's shapes and ``set_tensor_address`` pointing at
the static buffers, warmed up by one ``execute_async_v3`` on the runner's non-default stream, then captured.
Shapes the buckets do not cover (a long prefill) run eagerly with exact shapes.

Pure, CPU-tested parts: ``check_engine_version`` (the TensorRT version recorded in the manifest against the
installed one; version-compatible engines need ``engine_host_code_allowed``), ``plan_io`` (static buffer
shapes and dtypes from the manifest's I/O for given symbolic dimensions), ``tensorrt_available`` (the
one-line refusal). The rest is thin and needs TensorRT and a GPU. AOT plugins need no registration at run
time: the kernel is inside the engine.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from ..errors import DSparkTrtError
from .cuda_graphs import BucketPolicy, GraphKey, GraphRunner, InputSpec, PadPlan, unpad_tree

__all__ = ["TORCH_DTYPES", "IoTensor", "check_engine_version", "plan_io", "io_tensors", "input_specs",
           "output_batch_dims", "tensorrt_available",
           "require_tensorrt", "TensorRTEngine", "TensorRTGraph", "engine_entry"]

log = logging.getLogger("dspark.tensorrt")

#: manifest dtype names → torch
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                "int32": torch.int32, "int64": torch.int64, "bool": torch.bool, "int8": torch.int8,
                "uint8": torch.uint8}


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
    """A deserialized engine (``Runtime.deserialize_cuda_engine``), checked against the manifest's version."""

    def __init__(self, plan: Path, entry: Mapping[str, Any]):
        require_tensorrt()
        import tensorrt as trt

        host_code = check_engine_version(entry, trt.__version__)
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self.logger)
        if host_code:
            self.runtime.engine_host_code_allowed = True  # version-compatible: the lean runtime inside the plan
        self.engine = self.runtime.deserialize_cuda_engine(Path(plan).read_bytes())
        if self.engine is None:
            raise DSparkTrtError(f"TensorRT could not deserialize {plan}; rebuild it with dspark build-engine OUT "
                                 f"--force")
        self.trt = trt

    def context(self):
        ctx = self.engine.create_execution_context()
        if ctx is None:
            raise DSparkTrtError("TensorRT could not create an execution context (out of GPU memory?)")
        return ctx


class TensorRTGraph:
    """One engine as ``run({name: tensor}) -> {name: tensor}``, bucketed and graph-captured (module docstring).

    Args:
        engine: the deserialized ``TensorRTEngine``.
        tensors: its I/O (``io_tensors(manifest io)``).
        batch_dim / context_dim: symbolic names of the batch and (optional) context dimensions.
        fills: {input: (padded-request fill, padded-context fill)}; default 0.
        role: "draft" or "target" (each role has its own graph memory pool).
        graphs: "graph" (capture), "eager" (the same padded path without capture).
        bucketed: False runs every call with exact shapes, eagerly (the context graph, whose outputs are as
            long as its inputs).
        context_plus: inputs whose context dimension has fixed extra slots (``input_specs``).
        fixed: values of the other symbolic dimensions for this graph (e.g. {"Q": 8}).
    """

    def __init__(self, engine: TensorRTEngine, tensors: Sequence[IoTensor], *, batch_dim: str = "B",
                 context_dim: str | None = None, max_batch: int = 8, max_context: int = 0,
                 fills: Mapping[str, tuple[float, float]] | None = None, role: str = "draft",
                 graphs: str = "graph", device: str | torch.device = "cuda", bucketed: bool = True,
                 context_plus: Mapping[str, tuple[str, int]] | None = None, smallest_context: int = 128,
                 fixed: Mapping[str, int] | None = None, bound: Sequence[str] = ()):
        self.engine, self.tensors = engine, tuple(tensors)
        self.bucketed = bucketed  # False: always exact shapes, no padding, no graph (outputs as long as inputs)
        self.batch_dim, self.context_dim = batch_dim, context_dim
        self.inputs = [t for t in self.tensors if t.is_input]
        self.outputs = [t for t in self.tensors if not t.is_input]
        self.output_names = [t.name for t in self.outputs]
        self.policy = BucketPolicy(max_batch, max_context if context_dim else 0, smallest_context)
        specs = input_specs(self.tensors, batch_dim, context_dim, fills, context_plus, fixed, bound)
        self._contexts: dict[GraphKey, Any] = {}
        self._outputs: dict[GraphKey, dict[str, torch.Tensor]] = {}
        self.runner = GraphRunner(self._enqueue, specs, role=role, device=device, mode=graphs,  # type: ignore[arg-type]
                                  output_batch_dims=self._output_batch_dims())

    @classmethod
    def from_export(cls, export_dir: str | Path, graph: str, **options) -> "TensorRTGraph":
        from ..export.manifest import read_manifest

        export_dir = Path(export_dir)
        manifest = read_manifest(export_dir)
        entry = engine_entry(manifest, graph)
        io = manifest["graphs"][graph] if graph in manifest.get("graphs", {}) else manifest["target"]["io"]
        return cls(TensorRTEngine(export_dir / entry["file"], entry), io_tensors(io), **options)

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
            return self.runner(plan, feeds) if replay and self.bucketed else self._run_exact(plan, feeds)
        batch, context = self._dims(feeds)
        if not self.bucketed or batch > self.policy.max_batch or context > (self.policy.max_context or 0):
            exact = PadPlan(batch, batch, context, context)  # beyond the buckets: exact shapes, no graph
            return self._run_exact(exact, feeds)
        plan = self.policy.plan(batch, context)
        return self.runner(plan, feeds)

    def _output_batch_dims(self) -> dict[str, int]:
        return output_batch_dims(self.tensors, self.batch_dim)

    def _run_exact(self, plan: PadPlan, feeds: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        key = GraphKey(self.runner.role + "-exact", plan.bucket, plan.context_bucket)
        static = {s.name: feeds[s.name].to(self.runner.device, s.dtype).contiguous() for s in self.runner.specs}
        out = self._enqueue(static, key)
        self._contexts.pop(key, None)
        return unpad_tree(self._outputs.pop(key, out), plan, batch_dims=self._output_batch_dims())

    def _enqueue(self, static: dict[str, torch.Tensor], key: GraphKey) -> dict[str, torch.Tensor]:
        """set_input_shape / set_tensor_address into ``static`` and this key's outputs; execute_async_v3 on the
        current stream (the graph runner's capture stream). Allocates only on the first (warm-up) call."""
        ctx = self._contexts.get(key)
        if ctx is None:
            ctx = self._contexts[key] = self.engine.context()
            for name, t in static.items():
                if not ctx.set_input_shape(name, tuple(t.shape)):
                    raise DSparkTrtError(f"input {name} shape {tuple(t.shape)} is outside the engine's profile; "
                                         f"rebuild with a larger --max-batch-size / --max-context")
            outputs = {}
            for t in self.outputs:
                shape = tuple(ctx.get_tensor_shape(t.name))
                outputs[t.name] = torch.empty(shape, dtype=t.dtype, device=self.runner.device)
            self._outputs[key] = outputs
        outputs = self._outputs[key]
        for name, t in {**static, **outputs}.items():
            ctx.set_tensor_address(name, t.data_ptr())
        stream = torch.cuda.current_stream(self.runner.device)
        if not ctx.execute_async_v3(stream.cuda_stream):
            raise DSparkTrtError("TensorRT execute_async_v3 failed (see the TensorRT log above)")
        return outputs

    def forget(self, which) -> int:
        """Drop the captured graphs (and their execution contexts) whose ``GraphKey`` ``which`` selects: after the
        buffers bound to them moved (the target's K/V cache grew or changed its rows)."""
        dropped = self.runner.drop(which)
        for key in [k for k in self._contexts if which(k)]:
            self._contexts.pop(key, None)
            self._outputs.pop(key, None)
        return dropped

    # lifetime
    def activate(self) -> "TensorRTGraph":
        self.runner.activate()
        return self

    def deactivate(self) -> None:
        self.runner.deactivate()
        self._contexts.clear()
        self._outputs.clear()
