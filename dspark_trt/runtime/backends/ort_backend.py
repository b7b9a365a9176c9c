"""The ``onnxruntime`` drafter backend: the exported ``context`` and ``draft`` graphs in onnxruntime.

It runs exactly what TensorRT is built from (the top-k walk through the node's standard-op local function),
so it is both a portable executor and the proof that the ONNX hand-off computes what the reference does.
Inputs and outputs are torch tensors on the CPU; ids come back as int64 like the reference's.

Construct it from an export directory (``SaveOnnx`` / ``dspark export``) or, with ``from_pretrained``, from a
drafter checkpoint: the graphs are exported (and validated) once into a content-addressed cache directory.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ...errors import DSparkTrtError
from ...reference.markov import MarkovWalkResult
from .base import DrafterBackend

__all__ = ["OnnxRuntimeDrafterBackend", "default_cache_dir"]

_TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def default_cache_dir() -> Path:
    """``$DSPARK_TRT_CACHE/onnx`` or ``~/.cache/dspark-trt/onnx`` (``$XDG_CACHE_HOME`` honoured)."""
    root = os.environ.get("DSPARK_TRT_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dspark-trt"
    return Path(root) / "onnx"


class OnnxRuntimeDrafterBackend(DrafterBackend):
    """Drafter backend over an ONNX export directory.

    Args:
        export_dir: directory with ``context.onnx``, ``draft.onnx`` and ``onnx_export.json``.
        providers (*optional*, defaults to CPU): onnxruntime execution providers.
        threads (*optional*): intra-op threads per session.

    Example:
        >>> with OnnxRuntimeDrafterBackend.from_pretrained("drafter/", target_dir="target/", topk=16) as b:
        ...     k, v = b.context_kv(taps, positions)
        ...     result = b.draft(anchor, k, v, ctx_len, topk=16, temperature=None, seed=None)
    """

    name = "onnxruntime"

    def __init__(self, export_dir: str | Path, *, providers: list[str] | None = None, threads: int | None = None):
        from ...export.onnx import GRAPH_FILES, OnnxFromDir

        self.export_dir = Path(export_dir)
        source = OnnxFromDir(self.export_dir)
        self.config, spec = source.config(), source.spec()
        self.topk: int | None = spec.topk
        self.dtype = _TORCH_DTYPES[spec.dtype]
        self.max_context: int = spec.max_context
        self.device = torch.device("cpu")
        self._files = {name: self.export_dir / file for name, file in GRAPH_FILES.items()}
        self._providers, self._threads = providers, threads
        self._graphs: dict | None = None

    @classmethod
    def from_pretrained(cls, drafter_dir: str | Path, *, target_dir: str | Path | None = None,
                        dtype: str | None = None, topk: int | str | None = None, cache_dir: str | Path | None = None,
                        max_context: int | None = None, validate: bool = True,
                        **kwargs) -> "OnnxRuntimeDrafterBackend":
        """Export ``drafter_dir`` into ``cache_dir`` (default ``default_cache_dir()``) unless cached, then load it.

        ``dtype`` defaults to fp32 (onnxruntime's CPU provider computes bf16 only through emulation).
        """
        from ...export.onnx import cached_onnx_export

        path = cached_onnx_export(drafter_dir, cache_dir or default_cache_dir(), target_dir=target_dir,
                                  dtype=dtype or "fp32", topk="off" if topk is None else topk, target="onnxruntime",
                                  max_context=max_context, validate=validate)
        return cls(path, **kwargs)

    # -- lifetime ----------------------------------------------------------------------------------------
    def activate(self) -> None:
        from ...export.ort_session import OrtGraph

        if self._graphs is None:
            self._graphs = {name: OrtGraph(file, providers=self._providers, threads=self._threads)
                            for name, file in self._files.items()}

    def deactivate(self) -> None:
        self._graphs = None

    def _graph(self, name: str):
        if self._graphs is None:
            self.activate()
        return self._graphs[name]

    # -- the interface -----------------------------------------------------------------------------------
    def context_kv(self, taps: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from ...export.graphs import run_context

        self._check_context(taps.shape[1])
        return run_context(self._graph("context"), taps, positions)  # K, V [L, B, T, H_kv, D] model dtype

    def draft(self, anchor, ctx_k, ctx_v, ctx_len, *, topk, temperature, seed) -> MarkovWalkResult:
        from ...export.graphs import run_draft

        if topk != self.topk:
            have = self.topk or "off"
            raise DSparkTrtError(f"this ONNX export drafts with top-k {have} but top-k {topk or 'off'} was "
                                 f"requested; run with --topk {have} or export again with --topk {topk or 'off'}")
        self._check_context(ctx_k.shape[2])
        return run_draft(self._graph("draft"), anchor, ctx_k, ctx_v, ctx_len, temperature, seed,
                         draft_vocab=self.config.draft_vocab_size)

    def _check_context(self, length: int) -> None:
        if length > self.max_context:
            raise DSparkTrtError(f"context length {length} exceeds the export's bound of {self.max_context} "
                                 f"tokens; export again with a larger --max-context")
