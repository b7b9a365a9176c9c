"""CUDA graphs for a decoding round, whatever runs inside it (PyTorch + Triton, or TensorRT's ``enqueueV3``).

A round is captured once per **bucket** — (batch bucket 1, 2, 4, 8, … up to the max batch; context-length
bucket) — and replayed for every batch that rounds up to it::

    plan   = BucketPolicy(max_batch=8, max_context=4096).plan(batch=3, context=700)   # → bucket (4, 1024)
    runner = GraphRunner(round_fn, specs, role="draft", device="cuda")    # round_fn(static_inputs, key)
    outputs = runner(plan, inputs)            # pad into the bucket's static buffers, replay, unpad (clone)

The pieces, pure ones first (the CPU tests cover them):

* ``batch_buckets`` / ``context_buckets`` / ``BucketPolicy.plan`` choose the bucket (``PadPlan``);
* ``InputSpec`` says which dimension of an input is the batch and which the context, and what the padding
  holds (values that keep padded rows finite and masked: ``ctx_len`` 0, ``attention_mask`` 0, …), or that
  the caller's tensor is the static buffer itself (``bound``: the target's K/V cache, never copied;
  ``rebind`` re-captures a graph when such a buffer moved);
* ``PadPlan.load`` writes a batch into a bucket's static buffers (padding filled), ``PadPlan.unpad`` slices
  the results back (``unpad_tree`` over a dataclass/tuple/dict of tensors);
* ``GraphKey`` is the frozen cache key (vLLM's ``BatchDescriptor``: role, bucket, variant).

``GraphRunner`` is the thin CUDA part (vLLM's ``CUDAGraphWrapper``, Polygraphy-style ``activate`` /
``deactivate``): per key it allocates the static input buffers, warms the round up on a **non-default
stream** (Triton compiles, cuBLAS and TensorRT allocate on first use — never inside a capture), captures
it with ``torch.cuda.graph(g, pool=…, stream=…)`` into the role's own **memory pool** (draft and target
graphs never share one), and replays it. Seeds and positions are ordinary inputs copied into the static
buffers, so every replay draws the noise of *this* round. When a capture fails the runner ends it, clears
CUDA's sticky last error (``cudaGetLastError``), warns once and runs that key eagerly from then on; the
runner remembers it (``fallbacks``, ``captured``), and with ``strict=True`` it raises instead (what a check
that claims a graph mode uses). A ``DSparkTrtError`` raised by the round (a bad shape, a TensorRT profile
that cannot be selected) is never a capture failure: it propagates, as it would eagerly.
``mode="eager"`` runs the very same padded path without graphs — on the CPU that is how the tests prove
that padding changes no result.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

import torch

from ..errors import DSparkTrtError

__all__ = [
    "batch_buckets",
    "context_buckets",
    "choose_bucket",
    "cache_rows",
    "bound_context_plan",
    "BucketPolicy",
    "PadPlan",
    "InputSpec",
    "GraphKey",
    "GraphEntry",
    "GraphRunner",
    "unpad_tree",
    "clear_cuda_error",
    "loaded_library_path",
    "check_bound",
    "same_device",
    "BoundAddresses",
    "rebind",
]

log = logging.getLogger("dspark.graphs")

Mode = Literal["graph", "eager"]


# ------------------------------------------------------------------------------------------- buckets (pure)
def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """1, 2, 4, 8, … up to ``max_batch`` (included even when it is not a power of two)."""
    if max_batch < 1:
        raise DSparkTrtError(f"max batch {max_batch} must be >= 1")
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    return tuple(sizes + [max_batch])


def context_buckets(max_context: int, *, smallest: int = 128) -> tuple[int, ...]:
    """Context-length buckets: ``smallest``, 2·smallest, … up to ``max_context`` (included)."""
    if max_context < 1:
        raise DSparkTrtError(f"max context {max_context} must be >= 1")
    sizes, t = [], max(1, min(smallest, max_context))
    while t < max_context:
        sizes.append(t)
        t *= 2
    return tuple(sizes + [max_context])


def choose_bucket(n: int, buckets: tuple[int, ...], what: str = "batch") -> int:
    """The smallest bucket >= n; one-line error naming the fix when n exceeds the largest."""
    if n < 0:
        raise DSparkTrtError(f"{what} size {n} must be >= 0")
    for b in buckets:
        if b >= n:
            return b
    raise DSparkTrtError(f"{what} size {n} exceeds the largest captured {what} bucket {buckets[-1]}; raise the "
                         f"maximum (max_{what}=...) or split the batch")


def cache_rows(batch: int, max_batch: int) -> int:
    """Rows a cache keeps for ``batch`` requests: their batch bucket (the captured graphs' batch), or exactly
    ``batch`` past the largest bucket (those batches run eagerly)."""
    return choose_bucket(batch, batch_buckets(max_batch)) if batch <= max_batch else batch


def bound_context_plan(batch: int, ctx_k: torch.Tensor, ctx_v: torch.Tensor, *, batch_dim: int, context_dim: int,
                       max_batch: int, max_context: int, alignment: int = 0) -> "PadPlan | None":
    """The bucket in which a padded drafter backend binds the context K/V by address: the tensors' own
    (rows, capacity), when they are a ``DrafterState``'s buffers kept for this batch (``cache_rows`` rows,
    contiguous, a capacity within ``max_context``; with ``alignment``, every layer's block — dimension 0 —
    starting at a multiple of it: TensorRT's tensor addresses); None when they are not (copied into a bucket
    instead)."""
    rows, cap = ctx_k.shape[batch_dim], ctx_k.shape[context_dim]
    if (batch > max_batch or not 0 < cap <= max_context or rows != cache_rows(batch, max_batch)
            or ctx_v.shape != ctx_k.shape or not (ctx_k.is_contiguous() and ctx_v.is_contiguous())):
        return None
    if alignment and any(t.data_ptr() % alignment or (t.stride(0) * t.element_size()) % alignment
                         for t in (ctx_k, ctx_v)):
        return None
    return PadPlan(batch, rows, cap, cap)


@dataclass(frozen=True)
class PadPlan:
    """A batch of ``batch`` requests with ``context`` context slots, run in bucket (``bucket``, ``context_bucket``)."""

    batch: int
    bucket: int
    context: int = 0
    context_bucket: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.batch <= self.bucket or not 0 <= self.context <= self.context_bucket:
            raise DSparkTrtError(f"padding plan {self} does not fit its bucket")

    @property
    def padded(self) -> bool:
        return self.batch != self.bucket or self.context != self.context_bucket

    def shape(self, spec: "InputSpec") -> tuple[int, ...]:
        """The bucket's static shape of one input."""
        shape = list(spec.shape)
        if spec.batch_dim is not None:
            shape[spec.batch_dim] = self.bucket
        if spec.context_dim is not None:
            shape[spec.context_dim] = self.context_bucket + spec.context_extra
        return tuple(shape)

    def load(self, spec: "InputSpec", static: torch.Tensor, value: torch.Tensor) -> None:
        """Copy ``value`` (the unpadded batch) into ``static`` (the bucket's buffer) and fill the padding."""
        want = list(self.shape(spec))
        if spec.batch_dim is not None:
            want[spec.batch_dim] = self.batch
        if spec.context_dim is not None:
            want[spec.context_dim] = self.context + spec.context_extra
        if tuple(value.shape) != tuple(want):
            raise DSparkTrtError(f"input {spec.name} has shape {tuple(value.shape)}, expected {tuple(want)} for "
                                 f"{self.batch} requests and {self.context} context slots")
        real = static
        if spec.batch_dim is not None:
            real = real.narrow(spec.batch_dim, 0, self.batch)
        if spec.context_dim is not None and spec.context_extra == 0:
            real_ctx = real.narrow(spec.context_dim, 0, self.context)
            real_ctx.copy_(value)
            if self.context_bucket > self.context:
                real.narrow(spec.context_dim, self.context, self.context_bucket - self.context).fill_(spec.context_fill)
        elif spec.context_dim is not None:  # [past | new]: the new slots stay last, the padding goes in between
            e = spec.context_extra
            real.narrow(spec.context_dim, 0, self.context).copy_(value.narrow(spec.context_dim, 0, self.context))
            if self.context_bucket > self.context:
                real.narrow(spec.context_dim, self.context, self.context_bucket - self.context).fill_(spec.context_fill)
            real.narrow(spec.context_dim, self.context_bucket, e).copy_(value.narrow(spec.context_dim, self.context, e))
        else:
            real.copy_(value)
        if spec.batch_dim is not None and self.bucket > self.batch:
            static.narrow(spec.batch_dim, self.batch, self.bucket - self.batch).fill_(spec.batch_fill)

    def unpad(self, t: torch.Tensor, batch_dim: int = 0) -> torch.Tensor:
        """The real requests' rows of an output (a copy: the static buffer is overwritten by the next replay)."""
        return t.narrow(batch_dim, 0, self.batch).clone()


@dataclass(frozen=True)
class InputSpec:
    """One input of a captured round: its shape with the batch/context dimensions free, and its padding."""

    name: str
    shape: tuple[int, ...]  # the batch/context entries are placeholders (overwritten by the bucket)
    dtype: torch.dtype
    batch_dim: int | None = 0
    context_dim: int | None = None
    batch_fill: float | int = 0  # padded requests
    context_fill: float | int = 0  # padded context slots of real requests
    context_extra: int = 0  # fixed slots after the context along context_dim (attention_mask's new tokens)
    bound: bool = False  # the caller's tensor *is* the static buffer (a K/V cache): bound by address, never copied


def same_device(a, b, current: int | None = None) -> bool:
    """Whether ``a`` and ``b`` are one device: an unindexed one (``"cuda"``, how the backends are configured)
    stands for the current device (``current``; default ``torch.cuda.current_device()``), while a tensor's
    device always has its index — ``torch.device("cuda") != torch.device("cuda:0")``."""
    a, b = torch.device(a), torch.device(b)
    if a.type != b.type:
        return False
    if a.index == b.index:
        return True
    if current is None:
        current = torch.cuda.current_device() if a.type == "cuda" else 0
    return (current if a.index is None else a.index) == (current if b.index is None else b.index)


def check_bound(spec: "InputSpec", plan: PadPlan, value: torch.Tensor, device) -> None:
    """A bound input must already be the bucket's static buffer: its shape, dtype, device, contiguous."""
    want = plan.shape(spec)
    if (tuple(value.shape) != want or value.dtype != spec.dtype or not value.is_contiguous()
            or not same_device(value.device, device)):
        raise DSparkTrtError(f"bound input {spec.name} is {tuple(value.shape)} {value.dtype} on {value.device}"
                             f"{'' if value.is_contiguous() else ', not contiguous'}; the bucket binds {want} "
                             f"{spec.dtype} on {device}, contiguous")


@dataclass
class BoundAddresses:
    """Where the buffers some graphs are bound to (``InputSpec.bound``: a K/V cache) live. ``moved(*buffers)``
    says whether ``buffers`` are other ones than last time (the cache grew, changed its rows, or is another
    cache) and remembers them: graphs bound to the old ones read stale addresses and keep them alive, so their
    owner drops them."""

    at: tuple[int, ...] | None = None

    def moved(self, *buffers: torch.Tensor) -> bool:
        where = tuple(t.data_ptr() for t in buffers)
        if where == self.at:
            return False
        self.at = where
        return True


def rebind(entry: "GraphEntry", bound: Mapping[str, torch.Tensor]) -> bool:
    """Point ``entry``'s bound inputs at ``bound``'s tensors; True when one of them moved since the entry's
    graph was captured (the graph then reads stale addresses and must be captured again)."""
    moved = any(name in entry.inputs and entry.inputs[name].data_ptr() != t.data_ptr() for name, t in bound.items())
    moved = moved or any(name not in entry.inputs for name in bound)
    entry.inputs.update(bound)
    return moved and entry.graph is not None


@dataclass(frozen=True)
class BucketPolicy:
    """Which buckets exist: batch 1, 2, 4, … ``max_batch``; context ``smallest_context`` … ``max_context``
    (``max_context=0``: the round has no context dimension)."""

    max_batch: int
    max_context: int = 0
    smallest_context: int = 128

    @property
    def batch_buckets(self) -> tuple[int, ...]:
        return batch_buckets(self.max_batch)

    @property
    def context_buckets(self) -> tuple[int, ...]:
        return context_buckets(self.max_context, smallest=self.smallest_context) if self.max_context else (0,)

    def plan(self, batch: int, context: int = 0) -> PadPlan:
        if not self.max_context and context:
            raise DSparkTrtError("this round has no context dimension")
        return PadPlan(batch, choose_bucket(batch, self.batch_buckets),
                       context, choose_bucket(context, self.context_buckets, "context") if self.max_context else 0)


@dataclass(frozen=True)
class GraphKey:
    """The cache key of one captured graph (vLLM ``BatchDescriptor``)."""

    role: str  # "draft" | "target" | …: each role has its own memory pool
    batch: int  # batch bucket
    context: int = 0  # context-length bucket
    variant: tuple = ()  # anything else the round was specialised for (top-k, …)


def unpad_tree(tree: Any, plan: PadPlan, batch_dims: Mapping[str, int] | None = None) -> Any:
    """``plan.unpad`` over every tensor of a dataclass / tuple / list / dict (None and scalars kept); the batch
    is dimension 0 unless ``batch_dims`` names another for a dict key or dataclass field."""
    if isinstance(tree, torch.Tensor):
        return plan.unpad(tree)
    if batch_dims:
        named = (tree.items() if isinstance(tree, dict) else
                 ((f.name, getattr(tree, f.name)) for f in dataclasses.fields(tree))
                 if dataclasses.is_dataclass(tree) and not isinstance(tree, type) else None)
        if named is not None:
            values = {k: plan.unpad(v, batch_dims.get(k, 0)) if isinstance(v, torch.Tensor) else v for k, v in named}
            return values if isinstance(tree, dict) else dataclasses.replace(tree, **values)
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        return dataclasses.replace(tree, **{f.name: unpad_tree(getattr(tree, f.name), plan)
                                            for f in dataclasses.fields(tree)})
    if isinstance(tree, tuple):
        return type(tree)(*(unpad_tree(x, plan) for x in tree)) if hasattr(tree, "_fields") else tuple(
            unpad_tree(x, plan) for x in tree)
    if isinstance(tree, list):
        return [unpad_tree(x, plan) for x in tree]
    if isinstance(tree, dict):
        return {k: unpad_tree(v, plan) for k, v in tree.items()}
    return tree


# ----------------------------------------------------------------------------------- sticky CUDA errors
def loaded_library_path(maps: str, name: str) -> str | None:
    """The path of shared library ``lib<name>.so*`` in a ``/proc/<pid>/maps`` text, or None (pure)."""
    pattern = re.compile(rf"(/\S*lib{re.escape(name)}\.so[.\d]*)\s*$")
    for line in maps.splitlines():
        m = pattern.search(line)
        if m:
            return m.group(1)
    return None


def clear_cuda_error() -> int | None:
    """``cudaGetLastError()`` in the CUDA runtime this process loaded (torch's): clears the last error a failed
    capture leaves behind, returns its code (None when no runtime library could be found)."""
    import ctypes

    try:
        with open("/proc/self/maps") as f:
            path = loaded_library_path(f.read(), "cudart")
    except OSError:
        path = None
    if path is None:
        return None
    return int(ctypes.CDLL(path).cudaGetLastError())


# ------------------------------------------------------------------------------------------- the runner
@dataclass
class GraphEntry:
    """One bucket: its static inputs, and (after a successful capture) the graph and its static outputs."""

    key: GraphKey
    inputs: dict[str, torch.Tensor]
    graph: Any = None  # torch.cuda.CUDAGraph, or None when running eagerly
    outputs: Any = None
    input_ptrs: tuple[int, ...] = ()  # data_ptr()s at capture, re-checked at replay in debug mode
    eager_reason: str | None = None


@dataclass
class GraphRunner:
    """Capture-or-replay of ``fn(static_inputs, key) -> outputs`` per ``GraphKey`` (see the module docstring).

    ``fn`` must read only its static inputs (and weights), allocate nothing that outlives the call except
    its outputs, and never synchronise with the host (no ``.item()``, no data-dependent shapes).
    """

    fn: Callable[[dict[str, torch.Tensor], GraphKey], Any]
    specs: tuple[InputSpec, ...]
    role: str
    device: torch.device | str
    mode: Mode = "graph"
    output_batch_dims: Mapping[str, int] | None = None  # outputs whose batch is not dimension 0
    warmup: int = 2
    debug: bool = False
    stream: Any = None  # a non-default stream to run on, shared by runners whose work must stay in order (all the
    # contexts of one TensorRT engine share its scratch memory); None: the runner's own
    strict: bool = False  # a failed capture raises (DSparkTrtError) instead of running the key eagerly
    entries: dict[GraphKey, GraphEntry] = field(default_factory=dict)
    captures: int = 0  # graphs captured so far (recaptures included; kept when entries are dropped)
    fallbacks: list[tuple[GraphKey, str]] = field(default_factory=list)  # (key, reason) of every failed capture
    captured_keys: list[GraphKey] = field(default_factory=list)  # the key of every capture, in order (recaptures too)
    _pool: Any = None
    _stream: Any = None
    _warned: bool = False

    def __post_init__(self) -> None:
        self.device = torch.device(self.device)
        if self.mode not in ("graph", "eager"):
            raise DSparkTrtError(f"graph mode {self.mode!r} must be 'graph' or 'eager'")
        if self.mode == "graph" and self.device.type != "cuda":
            self.mode = "eager"  # CUDA graphs need CUDA; the padded path is the same

    @property
    def captured(self) -> bool:
        """Whether this runner really ran graphs: graph mode (not downgraded off CUDA), at least one capture,
        and no capture that fell back to eager (``fallbacks``)."""
        return self.mode == "graph" and self.captures > 0 and not self.fallbacks

    def why_not_captured(self) -> str | None:
        """None when ``captured``; else one line saying why (for a check's FAIL row)."""
        if self.mode != "graph":
            return f"the {self.role} runner runs eagerly (mode {self.mode!r} on {self.device})"
        if self.fallbacks:
            key, reason = self.fallbacks[0]
            more = f" (and {len(self.fallbacks) - 1} more)" if len(self.fallbacks) > 1 else ""
            return (f"the {self.role} round fell back to eager at bucket (batch {key.batch}, context {key.context})"
                    f"{more}: {reason}")
        if not self.captures:
            return f"no {self.role} graph was captured (no round ran through the runner)"
        return None

    # -- lifetime (Polygraphy-style) -----------------------------------------------------------------
    def activate(self) -> "GraphRunner":
        if self.mode == "graph" and self._stream is None:
            # never the default stream: a shared one (``stream``) or the runner's own
            self._stream = self.stream if self.stream is not None else torch.cuda.Stream(self.device)
            self._pool = torch.cuda.graph_pool_handle()  # this role's own pool
        return self

    def deactivate(self) -> None:
        """Drop the graphs and their buffers, after the work already replayed on the runner's stream."""
        if self._stream is not None:
            self._stream.synchronize()
        self.entries.clear()
        self._stream = self._pool = None

    def __enter__(self) -> "GraphRunner":
        return self.activate()

    def __exit__(self, *exc) -> None:
        self.deactivate()

    # -- the call ------------------------------------------------------------------------------------
    def key(self, plan: PadPlan, variant: tuple = ()) -> GraphKey:
        return GraphKey(self.role, plan.bucket, plan.context_bucket, variant)

    def __call__(self, plan: PadPlan, inputs: Mapping[str, torch.Tensor], variant: tuple = ()) -> Any:
        """Pad ``inputs`` into the bucket's static buffers, replay (or capture, or run eagerly), unpad."""
        entry = self.entries.get(self.key(plan, variant))
        if entry is None:
            entry = self.entries[self.key(plan, variant)] = self._new_entry(plan, variant)
        if self.mode == "eager" or entry.eager_reason is not None:
            self._load(entry, plan, inputs)
            return unpad_tree(self.fn(entry.inputs, entry.key), plan, self.output_batch_dims)
        self.activate()
        current = torch.cuda.current_stream(self.device)
        self._stream.wait_stream(current)  # the inputs were produced on the caller's stream
        with torch.cuda.stream(self._stream):
            self._load(entry, plan, inputs)
            if entry.graph is None:
                self._capture(entry)
            if entry.graph is not None:
                if self.debug:
                    ptrs = tuple(t.data_ptr() for t in entry.inputs.values())
                    assert ptrs == entry.input_ptrs, "static input buffers moved since capture"
                entry.graph.replay()
                out = entry.outputs
            else:
                out = self.fn(entry.inputs, entry.key)
        current.wait_stream(self._stream)
        # copies on the caller's stream: their memory belongs to it; the next replay waits for them (above)
        return unpad_tree(out, plan, self.output_batch_dims)

    def _new_entry(self, plan: PadPlan, variant: tuple) -> GraphEntry:
        inputs = {s.name: torch.zeros(plan.shape(s), dtype=s.dtype, device=self.device) for s in self.specs
                  if not s.bound}  # bound inputs: the caller's buffers, set by _load
        return GraphEntry(self.key(plan, variant), inputs)

    def _load(self, entry: GraphEntry, plan: PadPlan, inputs: Mapping[str, torch.Tensor]) -> None:
        missing = [s.name for s in self.specs if s.name not in inputs]
        if missing:
            raise DSparkTrtError(f"graph round {self.role}: missing inputs {missing}")
        for s in self.specs:
            if s.bound:
                check_bound(s, plan, inputs[s.name], self.device)
                continue
            plan.load(s, entry.inputs[s.name], inputs[s.name].to(self.device, s.dtype))
        if rebind(entry, {s.name: inputs[s.name] for s in self.specs if s.bound}):
            entry.graph = entry.outputs = None  # captured with other buffers: capture again with these

    def drop(self, which: Callable[[GraphKey], bool]) -> int:
        """Forget the entries whose key ``which`` selects — their graphs, static buffers and bound tensors —
        after the work already queued on the runner's stream; returns how many (e.g. when the buffers bound to
        them were replaced: the graphs read stale addresses, and holding them would keep the old buffers)."""
        keys = [k for k in self.entries if which(k)]
        if keys and self._stream is not None:
            self._stream.synchronize()
        for k in keys:
            del self.entries[k]
        return len(keys)

    def fall_back(self, entry: GraphEntry, error: BaseException) -> None:
        """After a failed capture: clear CUDA's sticky last error, run this key eagerly from now on, warn once
        per runner (the reason is kept on the entry and in ``fallbacks``, and logged at debug level). A
        ``strict`` runner raises a one-line ``DSparkTrtError`` instead."""
        clear_cuda_error()
        reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        if self.strict:
            raise DSparkTrtError(f"CUDA graph capture of the {self.role} round at bucket (batch {entry.key.batch}, "
                                 f"context {entry.key.context}) failed ({reason}); run with graphs='eager' to "
                                 f"run it without graphs") from error
        self.fallbacks.append((entry.key, reason))
        entry.graph, entry.outputs, entry.eager_reason = None, None, reason
        if not self._warned:
            self._warned = True
            warnings.warn(f"CUDA graph capture of the {self.role} round failed ({reason}); running it eagerly",
                          RuntimeWarning, stacklevel=4)
        log.debug("capture of %s failed: %s", entry.key, reason)

    def _capture(self, entry: GraphEntry) -> None:
        """Warm up on the runner's stream, then capture into the role's pool; on failure fall back (warn once;
        ``strict``: raise)."""
        try:
            for _ in range(self.warmup):
                self.fn(entry.inputs, entry.key)
            self._stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool, stream=self._stream, capture_error_mode="thread_local"):
                outputs = self.fn(entry.inputs, entry.key)
        except DSparkTrtError:  # the round's own one-line error (a bad shape, a profile TensorRT refused): eagerly
            clear_cuda_error()  # it would raise the same, so it is no capture failure
            raise
        except Exception as e:  # capture invalidated, an op that syncs, an allocation TensorRT refused, ...
            self.fall_back(entry, e)
            return
        entry.graph, entry.outputs = graph, outputs
        self.captures += 1
        self.captured_keys.append(entry.key)
        entry.input_ptrs = tuple(t.data_ptr() for t in entry.inputs.values())
        log.debug("captured %s", entry.key)
