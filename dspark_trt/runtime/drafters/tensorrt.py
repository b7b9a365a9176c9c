"""The ``tensorrt`` drafter backend: an export's TensorRT engines (``engines/context.plan``, ``engines/draft.plan``).

Each engine's contexts share one scratch buffer and one stream; the engines' I/O is checked against the
manifest at load. The draft round runs in CUDA graphs, one per (batch bucket, context-length bucket), the top-k
Markov walk is the AOT plugin inside the engine (no plugin registration, no Python at enqueue). The runtime's
``DrafterState`` keeps the batch bucket's rows (``state_rows``), so its per-layer ``[rows, H_kv, capacity, D]``
blocks *are* the graph's ``ctx_key_<l>`` / ``ctx_value_<l>`` inputs, bound by address like the target's cache
(``runtime/cuda_graphs.py: bound_context_plan``): a round copies only the anchors, lengths, temperatures and
seeds, whatever the context. A context of any other shape is padded into static buffers
(``runtime.tensorrt_engine.TensorRTGraph``). The context graph runs
with exact shapes (its outputs are as long as its input). Tensor names come from the manifest's I/O; the
engines' TensorRT version is checked against the installed one before deserializing.

Without full TensorRT or a GPU, constructing the backend is a one-line refusal (CLI exit 1).

    with TensorRTDrafterBackend.from_export("out/") as backend:
        k, v = backend.context_kv(taps, positions)
        result = backend.draft(anchor, k, v, ctx_len, topk=512, temperature=t, seed=s)
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...errors import DSparkTrtError
from ...reference.markov import MarkovWalkResult
from ..cuda_graphs import BoundAddresses, bound_context_plan, cache_rows
from ..tensorrt_engine import TENSOR_ALIGNMENT, engine_entry, require_tensorrt
from .base import DrafterBackend, check_export_variant

__all__ = ["TensorRTDrafterBackend"]


class TensorRTDrafterBackend(DrafterBackend):
    """Drafter backend over an export directory with TensorRT engines.

    Args:
        export_dir: a ``dspark-export`` directory whose manifest lists ``context.tensorrt`` / ``draft.tensorrt``.
        max_batch (*optional*): largest batch bucket (default: the engines' profile maximum).
        graphs (*optional*, defaults to ``"graph"``): ``"eager"`` runs the padded path without capture.
        device (*optional*): the CUDA device (default ``cuda``).
    """

    name = "tensorrt"

    def __init__(self, export_dir: str | Path, *, max_batch: int | None = None, graphs: str = "graph",
                 device: str | torch.device | None = None, max_graph_tokens: int | None = None):
        # max_graph_tokens is the target's option (SpeculativeDecoder.from_export passes both the same options)
        require_tensorrt("the tensorrt drafter backend")
        from ...artifact.export_dir import ExportDir
        from ..tensorrt_engine import TensorRTEngine, TensorRTGraph, io_tensors

        export = ExportDir(export_dir)
        self.export_dir, manifest = export.root, export.manifest
        self.config = export.config
        self.topk: int | None = export.topk
        self.markov_topm = export.markov_topm  # the engine's union width (0: none)
        self.supports_markov_topm = self.markov_topm > 0
        self.fixed_markov_topm = self.markov_topm
        self.max_context = export.max_context
        self.device = torch.device(device or "cuda")
        entries = {g: engine_entry(manifest, g) for g in ("context", "draft")}
        profile_max = int(entries["draft"]["build"]["batch"]["max"])
        max_batch = min(max_batch or profile_max, profile_max)
        self._max_batch = max_batch
        self._graphs = {}
        self._bound = BoundAddresses()  # the context buffers the bound draft graphs read
        for graph, entry in entries.items():
            engine = TensorRTEngine(self.export_dir / entry["file"], entry, device=self.device, name=graph)
            io = io_tensors(manifest["graphs"][graph])
            if graph == "draft":
                from ...artifact.drafter_io import check_draft_interface

                check_draft_interface([t.name for t in io], str(self.export_dir))
            if graph == "context":
                self._graphs[graph] = TensorRTGraph(engine, io, max_batch=max_batch, role="draft", graphs=graphs,
                                                    device=self.device, bucketed=False)
            else:
                from ...artifact.drafter_io import ctx_names

                keys, values = ctx_names(self.config.num_hidden_layers)
                for name, bound in (("draft", ()), ("draft_bound", keys + values)):  # context copied / bound
                    self._graphs[name] = TensorRTGraph(engine, io, context_dim=_context_symbol(io),
                                                       max_batch=max_batch, max_context=self.max_context,
                                                       role="draft", graphs=graphs, device=self.device, bound=bound)

    @classmethod
    def from_export(cls, export_dir: str | Path, **options) -> "TensorRTDrafterBackend":
        return cls(export_dir, **options)

    @classmethod
    def from_pretrained(cls, drafter_dir, **kwargs) -> "TensorRTDrafterBackend":
        require_tensorrt("the tensorrt drafter backend")
        raise DSparkTrtError("the tensorrt backend runs an export's engines, not a checkpoint: run dspark-export "
                             f"{drafter_dir} OUT on the GPU host, then load OUT (SpeculativeDecoder.from_export or "
                             "dspark generate --export OUT --backend tensorrt)")

    def activate(self) -> None:
        for g in self._graphs.values():
            g.activate()

    def deactivate(self) -> None:
        for g in self._graphs.values():
            g.deactivate()  # each synchronizes its engine's stream before dropping anything

    def reserved_device_memory(self) -> dict[str, int]:
        """Device memory the engines hold, by name: each one's context scratch and what TensorRT allocated itself
        (the weights; ``TensorRTEngine.memory_report``)."""
        report: dict[str, int] = {}
        for name, g in self._graphs.items():
            if name != "draft_bound":  # the draft engine's, counted once
                report.update(g.engine.memory_report())
        return report

    def context_kv(self, taps: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from ..drafter_graphs import run_context

        return run_context(self._graphs["context"], taps.to(self.device), positions.to(self.device))

    def draft(self, anchor, ctx_k, ctx_v, ctx_len, *, topk, temperature, seed, markov_topm: int = 0,
              ctx_start: torch.Tensor | None = None) -> MarkovWalkResult:
        from ..drafter_graphs import run_draft

        check_export_variant("these engines", have_topk=self.topk, have_markov_topm=self.markov_topm, topk=topk,
                             markov_topm=markov_topm)
        if ctx_k.shape[2] > self.max_context:
            raise DSparkTrtError(f"context length {ctx_k.shape[2]} exceeds the engines' bound of {self.max_context} "
                                 f"tokens; export again with a larger --max-context")
        dev, B = self.device, anchor.shape[0]
        ctx_k, ctx_v = ctx_k.to(dev), ctx_v.to(dev)  # [L, rows, T, H_kv, D]
        heads_k, heads_v = ctx_k.transpose(2, 3), ctx_v.transpose(2, 3)  # [L, rows, H_kv, T, D]
        plan = bound_context_plan(B, heads_k, heads_v, batch_dim=1, context_dim=3, max_batch=self._max_batch,
                                  max_context=self.max_context, alignment=TENSOR_ALIGNMENT)
        if plan is not None:  # a DrafterState of state_rows(B) rows: its layers are the bound inputs
            if self._bound.moved(heads_k, heads_v):  # another cache (grown, new rows): the old graphs are stale
                self._graphs["draft_bound"].forget(lambda key: True)
            graph = self._graphs["draft_bound"]
        else:  # copied into the bucket's static buffers: the requests' rows only
            graph, ctx_k, ctx_v = self._graphs["draft"], ctx_k[:, :B], ctx_v[:, :B]
        return run_draft(graph, anchor.to(dev), ctx_k, ctx_v, ctx_len.to(dev),
                         None if temperature is None else temperature.to(dev), None if seed is None else seed.to(dev),
                         draft_vocab=self.config.draft_vocab_size, union_width=self.markov_topm,
                         ctx_start=None if ctx_start is None else ctx_start.to(dev), plan=plan)

    def state_rows(self, batch: int) -> int:
        """The batch bucket: the ``DrafterState``'s buffers are then the bound draft graph's context inputs."""
        return cache_rows(batch, self._max_batch)


def _context_symbol(io) -> str | None:
    """The symbolic context-length dimension of the draft graph: axis 2 of ``ctx_key_0`` [B, H_kv, T, D]."""
    ctx_k = next((t for t in io if t.name == "ctx_key_0"), None)
    if ctx_k is None or len(ctx_k.shape) != 4 or isinstance(ctx_k.shape[2], int):
        return None
    return ctx_k.shape[2]
