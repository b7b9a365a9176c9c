"""The ``onnxruntime`` drafter backend: the exported ``context`` and ``draft`` graphs in onnxruntime.

It runs exactly what TensorRT is built from (the top-k walk through the node's standard-op local function),
so it is both a portable executor and the proof that the ONNX hand-off computes what the reference does.
Inputs and outputs are torch tensors on the CPU; ids come back as int64 like the reference's.

Construct it from an export directory (``artifact.ExportDir``: ``dspark-export``, ``SaveOnnx``, or one an older
dspark-trt wrote; its top-k and candidate-union width M are fixed) or, with ``from_pretrained``, from a drafter
checkpoint: the exporter (``runtime/exporter.py``: provided from above the runtime) exports and validates the
graphs once into a content-addressed cache directory, and a ``draft`` call with another top-k or M exports and
loads that variant. An export with ``--markov-topm M`` walks the candidate union (``DSparkTopKMarkovUnion`` through its
local function): ``draft(..., markov_topm=M)``. A gated or RNN Markov head's export (``DSparkTopKMarkovGated`` /
``DSparkTopKMarkovRNN``, the head's hidden part computed in the graph) has the same inputs and outputs, so it runs
here unchanged.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from ...errors import DSparkTrtError
from ...reference.markov import MarkovWalkResult
from .base import DrafterBackend, check_export_variant

__all__ = ["OnnxRuntimeDrafterBackend"]

log = logging.getLogger("dspark.runtime")

_TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class OnnxRuntimeDrafterBackend(DrafterBackend):
    """Drafter backend over an ONNX export directory.

    Args:
        export_dir: an export directory (``artifact.ExportDir``: its manifest and ``onnx/`` graphs).
        providers (*optional*, defaults to CPU): onnxruntime execution providers.
        threads (*optional*): intra-op threads per session.
        low_memory (*optional*): ``OrtGraph``'s low-memory sessions (no arena, no prepacked copies; a bf16 export's
            weights stay memory-mapped and are cast per run): slower rounds, about the export's size in memory.

    Example:
        >>> with OnnxRuntimeDrafterBackend.from_pretrained("drafter/", target_dir="target/", topk=16) as b:
        ...     k, v = b.context_kv(taps, positions)
        ...     result = b.draft(anchor, k, v, ctx_len, topk=16, temperature=None, seed=None)
    """

    name = "onnxruntime"

    def __init__(self, export_dir: str | Path, *, providers: list[str] | None = None, threads: int | None = None,
                 device: str | torch.device | None = None, low_memory: bool = False):
        if device is not None and torch.device(device).type != "cpu" and providers is None:
            raise DSparkTrtError(f"the onnxruntime drafter backend runs on the CPU here (device {device!r} asked); "
                                 f"pass providers=[...] for another onnxruntime execution provider, or use the "
                                 f"torch/tensorrt backend on GPUs")
        self._providers, self._threads, self._low_memory = providers, threads, low_memory
        self._rebuild = None  # (checkpoint, options) when built by from_pretrained: other top-k values export on demand
        self._graphs: dict | None = None
        self._load(Path(export_dir))

    def _load(self, export_dir: Path) -> None:
        from ...artifact.export_dir import ExportDir

        export = ExportDir(export_dir)
        if not export.exists():
            raise DSparkTrtError(f"{export_dir} is not an ONNX export directory (no manifest.json); export the "
                                 f"drafter first (dspark-export, or OnnxFromCheckpoint + SaveOnnx)")
        self.export_dir = export.root
        self.config, spec = export.config, export.spec
        self.topk: int | None = spec["topk"]
        self.markov_topm: int = int(spec.get("markov_topm") or 0)  # candidate union width of the graphs (0: none)
        self.dtype = _TORCH_DTYPES[spec["dtype"]]
        self.max_context: int = int(spec["max_context"])
        self.device = torch.device("cpu")
        self._files = export.graph_paths
        self.d2t: torch.Tensor | None = None  # [V_d] int64, reduced draft vocabularies only
        if self.config.has_reduced_vocab:
            d2t = export.d2t
            if d2t is None or len(d2t) != self.config.draft_vocab_size:
                raise DSparkTrtError(f"{export_dir} has a reduced draft vocabulary but no d2t table in its "
                                     f"manifest (an older export); export the drafter again")
            self.d2t = torch.tensor(d2t, dtype=torch.int64)

    @property
    def supports_markov_topm(self) -> bool:
        """The graphs walk a candidate union, or (``from_pretrained``) any M can be exported on demand."""
        return self.markov_topm > 0 or self._rebuild is not None

    @property
    def fixed_markov_topm(self) -> int | None:
        """An export directory's M (no other runs); None when built from a checkpoint (any M exports)."""
        return None if self._rebuild is not None else self.markov_topm

    @classmethod
    def from_export(cls, export_dir: str | Path, *, device=None, **kwargs) -> "OnnxRuntimeDrafterBackend":
        """The drafter graphs of a ``dspark-export`` directory (``OUT/onnx/``; the export's top-k and dtype)."""
        return cls(export_dir, device=device, **kwargs)

    @classmethod
    def from_pretrained(cls, drafter_dir: str | Path, *, target_dir: str | Path | None = None,
                        dtype: str | None = None, topk: int | str | None = None, cache_dir: str | Path | None = None,
                        max_context: int | None = None, validate: bool = True, markov_topm: int = 0,
                        exporter=None, **kwargs) -> "OnnxRuntimeDrafterBackend":
        """Export ``drafter_dir`` into ``cache_dir`` (default ``cache.cache_dir("onnx")``) unless cached, then load
        it. ``exporter``: what exports (``runtime/exporter.py``; default: the installed one).

        ``dtype`` defaults to fp32 (onnxruntime's CPU provider computes bf16 only through emulation).
        """
        from ...cache import cache_dir as default_cache_dir
        from ...optional import require
        from ..exporter import onnx_exporter

        require("onnxruntime", "the onnxruntime drafter backend")  # before the export, which takes a while
        export = onnx_exporter(exporter)
        options = dict(target_dir=target_dir, dtype=dtype or "fp32", target="onnxruntime", max_context=max_context,
                       validate=validate)
        cache_dir = cache_dir or default_cache_dir("onnx")
        path = export(drafter_dir, cache_dir, topk=topk, markov_topm=int(markov_topm),
                      **options)
        backend = cls(path, **kwargs)
        backend._rebuild = (export, drafter_dir, cache_dir, options)
        return backend

    def _switch_topk(self, topk: int | None, markov_topm: int = 0) -> None:
        """Load (exporting into the cache on a miss) the graphs for another top-k / union width (from_pretrained)."""
        export, drafter_dir, cache_dir, options = self._rebuild
        union = f", candidate union M {markov_topm}" if markov_topm else ""
        log.info(f"onnxruntime backend: switching to top-k {topk or 'off'}{union} (export cached in {cache_dir})")
        self._load(export(drafter_dir, cache_dir, topk=topk, markov_topm=int(markov_topm),
                          **options))
        if self._graphs is not None:
            self._graphs = None
            self.activate()

    # -- lifetime ----------------------------------------------------------------------------------------
    def activate(self) -> None:
        from ..ort_session import OrtGraph

        if self._graphs is None:
            from ...artifact.drafter_io import check_draft_interface

            graphs = {name: OrtGraph(file, providers=self._providers, threads=self._threads, low_memory=self._low_memory)
                      for name, file in self._files.items()}
            check_draft_interface(graphs["draft"].inputs, str(self.export_dir))  # older stacked ctx_k: re-export
            self._graphs = graphs

    def deactivate(self) -> None:
        self._graphs = None

    def _graph(self, name: str):
        if self._graphs is None:
            self.activate()
        return self._graphs[name]

    # -- the interface -----------------------------------------------------------------------------------
    def context_kv(self, taps: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from ..drafter_graphs import run_context

        self._check_context(taps.shape[1])
        return run_context(self._graph("context"), taps, positions)  # K, V [L, B, T, H_kv, D] model dtype

    def draft(self, anchor, ctx_k, ctx_v, ctx_len, *, topk, temperature, seed,
              markov_topm: int = 0, ctx_start: torch.Tensor | None = None) -> MarkovWalkResult:
        from ..drafter_graphs import run_draft

        if (topk, int(markov_topm)) != (self.topk, self.markov_topm) and self._rebuild is not None:
            self._switch_topk(topk, markov_topm)
        check_export_variant("this ONNX export", have_topk=self.topk, have_markov_topm=self.markov_topm, topk=topk,
                             markov_topm=markov_topm)
        self._check_context(ctx_k.shape[2])  # the cache's capacity: its per-layer blocks are fed as they lie
        return run_draft(self._graph("draft"), anchor, ctx_k, ctx_v, ctx_len, temperature, seed,
                         draft_vocab=self.config.draft_vocab_size, union_width=self.markov_topm, ctx_start=ctx_start)

    def _check_context(self, length: int) -> None:
        if length > self.max_context:
            raise DSparkTrtError(f"context length {length} exceeds the export's bound of {self.max_context} "
                                 f"tokens; export again with a larger --max-context")
