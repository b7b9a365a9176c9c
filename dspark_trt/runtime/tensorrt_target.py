"""``TensorRTTarget``: the exported target graph's TensorRT engine (``engines/target.plan``) as a ``Target``.

Same slot bookkeeping and K/V buffers as ``OnnxRuntimeTarget`` (it subclasses it), on the GPU, with the
graph run by ``TensorRTGraph``: a verify round (Q ≤ ``max_graph_tokens`` new tokens) is padded to a batch
bucket and a past-length bucket and replayed from a CUDA graph, one per (batch bucket, past bucket, Q);
padded past slots are masked out (``attention_mask`` 0), padded requests attend to their own new tokens
only (mask 1, zero K/V), so every real row computes what it would alone. A prefill (long Q) runs eagerly
with exact shapes. All contexts share the engine's one scratch buffer and stream (``TensorRTEngine``); an
engine built with a small-Q verify profile runs verify rounds on it. The engine's I/O is checked against the
manifest's ``target.io`` at load.
Tensor names and dtypes come from the manifest's ``target.io`` (CONTRACT: ``input_ids``,
``position_ids``, ``attention_mask`` [B, P + Q], ``past_key``/``past_value`` [L, B, H, P, D] → ``logits``,
``taps``, ``new_key``/``new_value`` [L, B, H, Q, D]).

Without full TensorRT or a GPU, constructing it is a one-line refusal (CLI exit 1).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from ..errors import DSparkTrtError
from .ort_target import OnnxRuntimeTarget
from .target import TargetOutput
from .tensorrt_engine import engine_entry, require_tensorrt

__all__ = ["TensorRTTarget", "target_fills", "mask_symbol"]

#: padding of the target graph's inputs: (padded requests, padded past slots)
TARGET_FILLS = {"attention_mask": (1, 0)}


def target_fills() -> dict[str, tuple[int, int]]:
    return dict(TARGET_FILLS)


def mask_symbol(io_tensors) -> str:
    """The symbolic length of ``attention_mask`` [B, S] (S = P + Q) in the manifest's I/O."""
    mask = next((t for t in io_tensors if t.name == "attention_mask"), None)
    if mask is None or len(mask.shape) != 2 or isinstance(mask.shape[1], int):
        raise DSparkTrtError("the target graph's attention_mask is not [B, P + Q] with a dynamic length; re-export "
                             "the target with this dspark-trt")
    return mask.shape[1]


class TensorRTTarget(OnnxRuntimeTarget):
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
        from ..export.manifest import read_manifest
        from ..export.target_onnx import target_section
        from .tensorrt_engine import TensorRTEngine, io_tensors

        export_dir = Path(export_dir)
        manifest = read_manifest(export_dir)
        t = target_section(export_dir, manifest)
        entry = engine_entry(manifest, "target")
        self.num_layers, self.hidden_size, self.vocab_size = int(t["num_layers"]), int(t["hidden_size"]), int(
            t["vocab_size"])
        self.num_key_value_heads, self.head_dim = int(t["num_key_value_heads"]), int(t["head_dim"])
        self.layer_ids = tuple(int(i) for i in t["layer_ids"])
        self.dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[t["dtype"]]
        self.eos_token_ids = tuple(int(i) for i in (t.get("eos_token_ids") or ()))
        self.device = torch.device(device or "cuda")
        self.compact_ratio = compact_ratio
        self.max_context = t.get("max_context")
        self.onnx_path = export_dir / t["onnx"]
        self.k = self.v = None
        self._taps_set = False
        self._engine = TensorRTEngine(export_dir / entry["file"], entry, device=self.device, name="target")
        self._tensors = io_tensors(t["io"])
        self._engine.check_io(self._tensors)  # buffers are sized from the manifest: refuse another graph's plan
        self._mask_symbol = mask_symbol(self._tensors)
        profile_max = int(entry["build"]["batch"]["max"])
        self._max_batch = min(max_batch or profile_max, profile_max)
        self._max_graph_tokens, self._graph_mode = max_graph_tokens, graphs
        self._graphs: dict[int, object] = {}  # Q → TensorRTGraph

    @classmethod
    def from_export(cls, export_dir: str | Path, **opts) -> "TensorRTTarget":
        return cls(export_dir, **opts)

    def _graph_for(self, Q: int):
        """The bucketed graph for Q new tokens (≤ max_graph_tokens), or an exact-shape one for longer Q."""
        from .tensorrt_engine import TensorRTGraph

        key = Q if Q <= self._max_graph_tokens else 0
        if key not in self._graphs:
            self._graphs[key] = TensorRTGraph(
                self._engine, self._tensors, context_dim="P", max_batch=self._max_batch,
                max_context=int(self.max_context or 8192) - Q, fills=TARGET_FILLS, role="target",
                graphs=self._graph_mode, device=self.device, bucketed=key != 0,
                context_plus={"attention_mask": (self._mask_symbol, Q)}, fixed={"Q": Q})
        return self._graphs[key]

    @torch.inference_mode()
    def prefill(self, prompts: Sequence[torch.Tensor]) -> TargetOutput:
        self._check_taps()
        lens = torch.tensor([len(p) for p in prompts], dtype=torch.int64, device=self.device)  # [B]
        B, T = len(prompts), int(lens.max())
        ids = torch.zeros(B, T, dtype=torch.int64, device=self.device)
        for b, p in enumerate(prompts):
            ids[b, : len(p)] = p.to(self.device)
        self.k = self.v = None
        valid, positions = self._start(lens)
        logits, taps = self._run(ids, positions, valid)
        return TargetOutput(logits=logits[torch.arange(B, device=self.device), lens - 1], taps=taps)

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
        """Device memory the target's engine reserves for its contexts (one scratch buffer), by name."""
        return {"target engine scratch": self._engine.reserved_bytes()}
