"""``TensorRTTarget``: the exported target graph's TensorRT engine (``engines/target.plan``) as a ``Target``.

Same slot bookkeeping and K/V cache as ``OnnxRuntimeTarget`` (both are ``ExportedTarget``s), on the GPU, with the graph
run by ``TensorRTGraph``. The cache's buffers **are** the engine's past inputs: each layer's
``[rows, H, capacity, D]`` block of the ``[L, rows, H, capacity, D]`` buffers (``runtime/kv_cache.py``) is bound
to ``past_key_<l>`` / ``past_value_<l>`` by address (``InputSpec.bound``), never copied; a step writes only its
new slots into them. A verify round (Q ≤ ``max_graph_tokens`` new tokens) is replayed from a CUDA graph, one
per (batch bucket, capacity bucket, Q): the cache keeps a batch bucket of rows (``cache_rows``) and grows by
capacity buckets, so the bucket *is* the cache's shape (``step_plan``); a graph is captured again only when the
buffers move (growth, a smaller batch bucket). Padded rows attend to their own new tokens and the stale,
finite contents of their rows (mask 1); unused capacity is masked (mask 0), so every real row computes what
it would alone. A prefill runs eagerly, in chunks of at most the engine profile's Q, reading the cache's
real rows (``[:B]``, contiguous) in place. Tensor names and dtypes come from the manifest's ``target.io``
(CONTRACT: ``input_ids``, ``position_ids``, ``attention_mask`` [B, P + Q], ``past_key_<l>``/``past_value_<l>``
[B, H, P, D] → ``logits``, ``taps``, ``new_key``/``new_value`` [L, B, H, Q, D]). All contexts share the
engine's one scratch buffer and stream (``TensorRTEngine``); an engine built with a small-Q verify profile runs
verify rounds on it. The engine's I/O is checked against the manifest's ``target.io`` at load.

``Gemma4TensorRTTarget`` binds a Gemma-4 target graph the same way over its two caches (``targets/gemma4.py``):
the global layers' ``KVCache`` (capacity ``P``) and the sliding layers' ``RingCache`` (``W`` = the manifest's
``gemma4.ring`` slots per request, whatever the context: the engine profile reaches it), both bound by address, with
``window_positions`` [B, W] fed per call (padded requests: −1, an empty ring); ``TensorRTTarget.from_export``
picks it for a Gemma-4 export.

Pure, CPU-tested: ``cache_rows``, ``step_plan``, ``mask_symbol``, ``profile_new_tokens``, ``gemma4_binding``,
``check_ring_profile`` (the Gemma-4 binding is run through onnxruntime in ``tests/runtime/targets``). Without
full TensorRT or a GPU, constructing either is a one-line refusal (CLI exit 1).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import torch

from ...errors import DSparkTrtError
from ..cuda_graphs import BoundAddresses, PadPlan, cache_rows
from .base import TargetOutput
from .exported import ExportedTarget, capacity_mask
from .gemma4 import FILLS, Gemma4Storage, cache_names, check_verify_length, graph_feeds, new_caches, ring_size, \
    write_new
from ..tensorrt_engine import engine_entry, require_tensorrt

__all__ = ["TensorRTTarget", "Gemma4TensorRTTarget", "target_fills", "mask_symbol", "cache_rows", "step_plan",
           "profile_new_tokens", "gemma4_binding", "gemma4_specs", "check_ring_profile", "TORCH_DTYPES"]

#: padding of the target graph's inputs: (padded requests, padded past slots)
TARGET_FILLS = {"attention_mask": (1, 0)}
TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def target_fills() -> dict[str, tuple[int, int]]:
    return dict(TARGET_FILLS)


def mask_symbol(io_tensors) -> str:
    """The symbolic length of ``attention_mask`` [B, S] (S = P + Q) in the manifest's I/O."""
    mask = next((t for t in io_tensors if t.name == "attention_mask"), None)
    if mask is None or len(mask.shape) != 2 or isinstance(mask.shape[1], int):
        raise DSparkTrtError("the target graph's attention_mask is not [B, P + Q] with a dynamic length; re-export "
                             "the target with this dspark-trt")
    return mask.shape[1]


def step_plan(batch: int, used: int, new: int, capacity: int, rows: int, *, max_batch: int,
              max_graph_tokens: int, logits: int | None = None) -> tuple[PadPlan, bool]:
    """How one target call binds the cache: the bucket (``rows`` cache rows, ``capacity`` slots — the cache's own
    shape, so its buffers are the graph's inputs) and whether it replays a CUDA graph (a verify round: at most
    ``max_graph_tokens`` tokens, all with logits — ``logits`` None or ``new`` — within the batch buckets) or runs
    eagerly with exact shapes (a prefill chunk, or a batch past the buckets: then only the ``batch`` real rows are
    read, and the mask is given for the whole capacity). The graph reads the ``used`` slots cached so far; the
    new ones are written after it, once the cache has room."""
    if used > capacity or capacity < 1 or batch > rows:
        raise DSparkTrtError(f"a step after {used} slots for {batch} requests does not fit the cache ({rows} rows, "
                             f"{capacity} slots); reserve first")
    replay = (new <= max_graph_tokens and logits in (None, new) and batch <= max_batch
              and rows == cache_rows(batch, max_batch))
    if replay:
        return PadPlan(batch, rows, used, capacity), True
    return PadPlan(batch, batch, capacity, capacity), False


def profile_new_tokens(entry: Mapping, default: int) -> int:
    """The most new tokens the engine's profile takes per call (its build's Q range), else ``default``."""
    q = ((entry.get("build") or {}).get("dynamic_ranges") or {}).get("Q")
    return int(q[2]) if q else int(default)


class TensorRTTarget(ExportedTarget):
    """The exported target's TensorRT engine as a DSpark ``Target`` (CUDA tensors).

    Args:
        export_dir: a ``dspark-export`` directory with a target section and a ``target.tensorrt`` engine.
        max_batch (*optional*): largest batch bucket (default: the engine profile's maximum).
        max_graph_tokens (*optional*, defaults to 16): verify rounds with at most this many new tokens replay
            CUDA graphs; longer ones (prefill) run eagerly.
        graphs (*optional*, defaults to ``"graph"``): ``"eager"`` runs the padded path without capture.
        device (*optional*): the CUDA device.
    """

    def __init__(self, export_dir: str | Path, *, max_batch: int | None = None, max_graph_tokens: int = 16,
                 graphs: str = "graph", device=None, compact_ratio: float = 2.0):
        require_tensorrt("the tensorrt target backend")
        from ...artifact.export_dir import ExportDir
        from ..tensorrt_engine import TensorRTEngine, io_tensors

        export = ExportDir(export_dir)
        export_dir, manifest = export.root, export.manifest
        t = export.target  # refuses an older (stacked past_key) target in one line
        if t.get("kv_interface") != self.KV_INTERFACE:
            raise DSparkTrtError(f"{export_dir}: its target graph has K/V interface {t.get('kv_interface')}, which "
                                 f"{type(self).__name__} does not run; load it with TensorRTTarget.from_export")
        entry = engine_entry(manifest, "target")
        self._init_cache(t, entry, torch.device(device or "cuda"), compact_ratio)
        self.onnx_path = export_dir / t["onnx"]
        self._engine = TensorRTEngine(export_dir / entry["file"], entry, device=self.device, name="target")
        self._tensors = io_tensors(t["io"])
        self._engine.check_io(self._tensors)  # buffers are sized from the manifest: refuse another graph's plan
        self._mask_symbol = mask_symbol(self._tensors)
        profile_max = int(entry["build"]["batch"]["max"])
        self._max_batch = min(max_batch or profile_max, profile_max)
        self._max_graph_tokens, self._graph_mode = max_graph_tokens, graphs
        self._graphs: dict[int, object] = {}  # Q → TensorRTGraph
        self._bound = BoundAddresses()  # the cache buffers the graphs are bound to

    #: the target graph I/O this class binds (``artifact/target_io.py``)
    KV_INTERFACE = "per-layer-capacity-v1"

    def _init_cache(self, t: dict, entry: Mapping, device: torch.device, compact_ratio: float) -> None:
        """Shapes, dtype and the K/V cache from the manifest's target section ``t`` (the engine's ``entry``)."""
        from ...artifact.target_io import MAX_NEW_TOKENS, past_names

        dtype = TORCH_DTYPES[t["dtype"]]
        self._init_exported(num_layers=t["num_layers"], num_key_value_heads=t["num_key_value_heads"],
                            head_dim=t["head_dim"], hidden_size=t["hidden_size"], vocab_size=t["vocab_size"],
                            layer_ids=t["layer_ids"], dtype=dtype, eos_token_ids=t.get("eos_token_ids") or (),
                            device=device, compact_ratio=compact_ratio, max_context=t.get("max_context"),
                            prefill_chunk=profile_new_tokens(entry, MAX_NEW_TOKENS),  # chunks the profile takes
                            cache_dtype=dtype)
        self._past_names = past_names(self.num_layers)

    @classmethod
    def from_export(cls, export_dir: str | Path, **opts) -> "TensorRTTarget":
        """The target of an export directory: a Gemma-4 graph (K/V interface ``gemma4-windowed-v1``) as
        ``Gemma4TensorRTTarget``, else this class."""
        from ...artifact.export_dir import ExportDir
        from ...artifact.target_io import GEMMA4_KV_INTERFACE

        export = ExportDir(export_dir)
        # no manifest: the constructor's own checks speak first (TensorRT and a GPU, then the directory)
        if cls is TensorRTTarget and export.exists() and export.target.get("kv_interface") == GEMMA4_KV_INTERFACE:
            return Gemma4TensorRTTarget(export_dir, **opts)
        return cls(export_dir, **opts)

    def _storage(self):
        """The running requests' rows (the cache keeps a bucket of rows; the rest are padding), kept aside by
        ``extend`` and joined before the new requests' rows."""
        B = self._lengths.numel()
        return self.cache.k[:, :B], self.cache.v[:, :B]

    def _graph_for(self, Q: int, K: int | None = None):
        """The bucketed graph for Q new tokens (≤ max_graph_tokens, logits for all of them), or an exact-shape one
        for longer Q (a prefill chunk); the cache inputs are bound, never copied."""
        from ...artifact.kv_capacity import capacity_bucket
        from ..tensorrt_engine import TensorRTGraph

        key = Q if Q <= self._max_graph_tokens and K in (None, Q) else 0
        if key not in self._graphs:
            self._graphs[key] = TensorRTGraph(
                self._engine, self._tensors, context_dim="P", max_batch=self._max_batch,
                max_context=capacity_bucket(int(self.max_context or 8192)), fills=TARGET_FILLS, role="target",
                graphs=self._graph_mode, device=self.device, bucketed=key != 0,
                context_plus={"attention_mask": (self._mask_symbol, Q)}, fixed={"Q": Q, "K": Q},
                bound=self._past_names[0] + self._past_names[1])
        return self._graphs[key]

    def _run(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor | None = None,
             headroom: int = 0):
        """One engine call on the cache in place (module docstring); the new K/V are then written into slots
        S … S+Q-1 (the cache grown first when they do not fit)."""
        B, Q = ids.shape
        S = mask.shape[1] - Q
        if self.max_context is not None and S + Q > self.max_context:
            raise DSparkTrtError(f"the batch needs {S + Q} KV slots but the export's bound is {self.max_context}; "
                                 f"export again with a larger --max-context")
        n_rows = cache_rows(B, self._max_batch)
        self.cache.reserve(n_rows, max(S, 1), used=S)  # the engine reads what is cached (at least one slot)
        self._forget_moved_buffers()
        plan, replay = step_plan(B, S, Q, self.cache.capacity, self.cache.batch, max_batch=self._max_batch,
                                 max_graph_tokens=self._max_graph_tokens, logits=None if rows is None else rows.shape[1])
        feeds = self._cache_feeds(B, positions, replay)
        if not replay:  # exact shapes: the real rows (a contiguous block) and the mask over the whole capacity
            mask = capacity_mask(mask, S, self.cache.capacity)
        if rows is None:
            rows = torch.arange(Q, device=self.device).expand(B, Q)
        feeds.update({"input_ids": ids, "position_ids": positions, "attention_mask": mask.to(torch.int64),
                      "logits_index": rows.to(self.device)})
        out = self._graph_for(Q, rows.shape[1]).run(feeds, plan=plan, replay=replay)
        self.cache.reserve(n_rows, self._room(S + Q, headroom), used=S)
        self._write_new(S, out, positions, mask)
        return out["logits"], out["taps"]

    def _cache_feeds(self, B: int, positions: torch.Tensor, replay: bool) -> dict:
        """The cache inputs, bound in place: every row of the bucket (replayed graphs) or the B real rows."""
        keys, values = self.cache.layers()  # L × [rows, H, capacity, D]: the bound buffers
        if not replay:
            keys, values = [k[:B] for k in keys], [v[:B] for v in values]
        return {**dict(zip(self._past_names[0], keys)), **dict(zip(self._past_names[1], values))}

    def _write_new(self, S: int, out: dict, positions: torch.Tensor, mask: torch.Tensor) -> None:
        self.cache.write(S, out["new_key"], out["new_value"])  # [L, B, H, Q, D] into rows 0 … B-1

    def _forget_moved_buffers(self) -> None:
        """When the cache's buffers were replaced (growth, another batch bucket, requests joining), the captured
        graphs bound to the old ones read stale addresses and keep the old buffers alive: drop them all (the
        current shape's graph is captured again on its next use)."""
        if self._bound.moved(self.cache.k, self.cache.v):
            for graph in self._graphs.values():
                graph.forget(lambda key: True)

    def _select_rows(self, rows: torch.Tensor) -> None:
        self.cache.select(rows, total=cache_rows(len(rows), self._max_batch))  # in place within the bucket

    @torch.inference_mode()
    def prefill(self, prompts: Sequence[torch.Tensor]) -> TargetOutput:
        self._check_taps()
        lens = torch.tensor([len(p) for p in prompts], dtype=torch.int64, device=self.device)  # [B]
        B, T = len(prompts), int(lens.max())
        if self.max_context is not None and T > self.max_context:
            raise DSparkTrtError(f"a prompt of {T} tokens exceeds the export's bound of {self.max_context} tokens; "
                                 f"shorten it or export again with a larger --max-context")
        ids = torch.zeros(B, T, dtype=torch.int64, device=self.device)
        for b, p in enumerate(prompts):
            ids[b, : len(p)] = p.to(self.device)
        return self._prefill(ids, lens)

    @torch.inference_mode()
    def verify(self, tokens: torch.Tensor, *, with_taps: bool = True) -> TargetOutput:
        self._check_taps()
        Q = tokens.shape[1]
        positions, mask = self._begin_verify(Q)
        logits, taps = self._run(tokens.to(self.device, torch.int64), positions, mask)
        self._end_verify(mask, Q)
        return TargetOutput(logits=logits, taps=taps if with_taps else None)

    def activate(self) -> "TensorRTTarget":
        for g in self._graphs.values():
            g.activate()
        return self

    def deactivate(self) -> None:
        self._engine.synchronize()  # replays and exact-shape runs still in flight use the contexts and buffers
        for g in self._graphs.values():
            g.deactivate()
        self._graphs.clear()

    def reserved_device_memory(self) -> dict[str, int]:
        """Device memory the target's engine holds, by name: its contexts' one scratch buffer, and what TensorRT
        allocated itself (the weights; ``TensorRTEngine.memory_report``)."""
        return self._engine.memory_report()


# -- Gemma-4 ---------------------------------------------------------------------------------------------
def gemma4_binding(tensors, gemma4: Mapping, Q: int) -> dict:
    """``TensorRTGraph``'s binding options for a Gemma-4 target graph's I/O ``tensors`` scoring ``Q`` new tokens:
    context ``P`` (the global caches and the mask's first part), ``W`` = the ring, every cache input bound,
    ``FILLS`` for padded requests."""
    names = cache_names(gemma4)
    return {"context_dim": "P", "fills": FILLS, "context_plus": {"attention_mask": (mask_symbol(tensors), Q)},
            "fixed": {"Q": Q, "K": Q, "W": ring_size(gemma4)}, "bound": [n for group in names for n in group]}


def gemma4_specs(tensors, gemma4: Mapping, Q: int):
    """The graph runner's input specs that ``gemma4_binding`` gives (batch ``B``)."""
    from ..tensorrt_engine import input_specs

    b = gemma4_binding(tensors, gemma4, Q)
    return input_specs(tensors, "B", b["context_dim"], b["fills"], b["context_plus"], b["fixed"], b["bound"])


def check_ring_profile(entry: Mapping, gemma4: Mapping) -> None:
    """One line refusing an engine whose profile does not take the runtime's ring (``W``) — an engine built before
    the export recorded ``gemma4.ring`` (``W`` profiled as ``P``) may stop short of it."""
    ring = ring_size(gemma4)
    ranges = ((entry.get("build") or {}).get("dynamic_ranges") or {})
    w = ranges.get("W")
    if w is None or not int(w[0]) <= ring <= int(w[2]):
        raise DSparkTrtError(f"the target engine's profile takes W {list(w) if w else 'unknown'}, the Gemma-4 "
                             f"runtime binds a ring of {ring} slots per request; rebuild the engine with this "
                             f"dspark-trt (dspark build-engine EXPORT --force)")


class Gemma4TensorRTTarget(Gemma4Storage, TensorRTTarget):
    """An exported Gemma-4 target's TensorRT engine as a DSpark ``Target`` (CUDA tensors); the arguments are
    ``TensorRTTarget``'s. Verify rounds score at most ``RING_HEADROOM`` tokens (the ring's rollback)."""

    KV_INTERFACE = "gemma4-windowed-v1"

    def _init_cache(self, t: dict, entry: Mapping, device: torch.device, compact_ratio: float) -> None:
        from ...artifact.target_io import MAX_NEW_TOKENS

        g = t["gemma4"]
        check_ring_profile(entry, g)
        dtype = TORCH_DTYPES[t["dtype"]]
        gk, gd = g["global_kv"]
        self._init_exported(num_layers=len(g["stored_layers"]), num_key_value_heads=gk, head_dim=gd,
                            hidden_size=t["hidden_size"], vocab_size=t["vocab_size"], layer_ids=t["layer_ids"],
                            dtype=dtype, eos_token_ids=t.get("eos_token_ids") or (), device=device,
                            compact_ratio=compact_ratio, max_context=t.get("max_context"),
                            prefill_chunk=profile_new_tokens(entry, MAX_NEW_TOKENS), cache_dtype=dtype)
        self._gemma4 = dict(g)
        self._names = cache_names(g)
        self.cache = new_caches(g, dtype, device)

    def _graph_for(self, Q: int, K: int | None = None):
        from ...artifact.kv_capacity import capacity_bucket
        from ..tensorrt_engine import TensorRTGraph

        key = Q if Q <= self._max_graph_tokens and K in (None, Q) else 0
        if key not in self._graphs:
            self._graphs[key] = TensorRTGraph(
                self._engine, self._tensors, max_batch=self._max_batch,
                max_context=capacity_bucket(int(self.max_context or 8192)), role="target", graphs=self._graph_mode,
                device=self.device, bucketed=key != 0, **gemma4_binding(self._tensors, self._gemma4, Q))
        return self._graphs[key]

    def _cache_feeds(self, B: int, positions: torch.Tensor, replay: bool) -> dict:
        """Both caches bound in place (the global slots and the rings) with each row's window positions."""
        return graph_feeds(self.cache, self._names, positions[:, 0], rows=None if replay else B)

    def _write_new(self, S: int, out: dict, positions: torch.Tensor, mask: torch.Tensor) -> None:
        """The new K/V: the global cache at slots S …, the ring at ``position mod ring`` (valid tokens only)."""
        Q = positions.shape[1]
        write_new(self.cache, out, S, positions, mask[:, mask.shape[1] - Q:] != 0)

    def _forget_moved_buffers(self) -> None:
        c = self.cache
        if self._bound.moved(c.glob.k, c.glob.v, c.slid.k, c.slid.v):
            for graph in self._graphs.values():
                graph.forget(lambda key: True)

    @torch.inference_mode()
    def verify(self, tokens: torch.Tensor, *, with_taps: bool = True) -> TargetOutput:
        check_verify_length(tokens.shape[1])
        return super().verify(tokens, with_taps=with_taps)
