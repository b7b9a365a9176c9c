"""``OnnxRuntimeTarget``: the exported target graph (``onnx/target.onnx``) in onnxruntime, as a ``Target``.

The graph is stateless (``export/target_graph.py``): it takes the past K/V and returns the new slots' K/V.
This class keeps them in static per-batch buffers ``[L, B, H, capacity, D]`` (grown by doubling when a
round would overflow) and shares the slot bookkeeping of ``HFTarget`` (``SlotTarget``): right-padded
prefill, a slot mask with holes for padding and per-request rejections, rollback by length after each
round (the used slot count shrinks; nothing is copied), ``select`` for finished requests, compaction when
holes pile up. Taps are baked into the graph at export; ``set_taps`` checks they are the drafter's.

bf16 graphs run on onnxruntime's CPU provider as their fp32 bf16-emulation twin (``export/ort_session.py``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import torch

from ..errors import DSparkTrtError
from .target import SlotTarget, TargetOutput

__all__ = ["OnnxRuntimeTarget"]

log = logging.getLogger("dspark.runtime")

_TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class OnnxRuntimeTarget(SlotTarget):
    """The exported target graph as a DSpark ``Target`` (CPU tensors in and out).

    Args:
        onnx_path: ``target.onnx`` written by ``dspark-export`` (its I/O: docs/export.md).
        num_layers / num_key_value_heads / head_dim / hidden_size / vocab_size: the target's shapes.
        layer_ids: the DeepSeek layer ids baked into the graph's ``taps`` output.
        dtype: the graph's K/V and taps dtype (``fp32`` | ``fp16`` | ``bf16``).
        eos_token_ids: the target's stop ids.
        providers / threads: onnxruntime execution providers and intra-op threads.
        compact_ratio: as ``HFTarget``.
        max_context: refuse sequences beyond this many slots (the engine profile's bound), None = unbounded.

    Example:
        >>> target = OnnxRuntimeTarget.from_export("out/export")
        >>> target.set_taps([1, 2, 4])       # must equal the export's layer ids
        >>> out = target.prefill([torch.tensor([1, 2, 3])])
    """

    def __init__(self, onnx_path: str | Path, *, num_layers: int, num_key_value_heads: int, head_dim: int,
                 hidden_size: int, vocab_size: int, layer_ids: Sequence[int], dtype: str = "fp32",
                 eos_token_ids: Sequence[int] = (), providers: list[str] | None = None, threads: int | None = None,
                 compact_ratio: float = 2.0, max_context: int | None = None):
        from ..export.ort_session import OrtGraph

        self.onnx_path = Path(onnx_path)
        if not self.onnx_path.is_file():
            raise DSparkTrtError(f"{self.onnx_path} is missing; re-run dspark-export with --target DIR")
        self.num_layers, self.hidden_size, self.vocab_size = int(num_layers), int(hidden_size), int(vocab_size)
        self.num_key_value_heads, self.head_dim = int(num_key_value_heads), int(head_dim)
        self.layer_ids = tuple(int(i) for i in layer_ids)
        if dtype not in _TORCH_DTYPES:
            raise DSparkTrtError(f"unknown target dtype {dtype!r}: use fp32, fp16 or bf16")
        self.dtype = _TORCH_DTYPES[dtype]
        self.eos_token_ids = tuple(int(i) for i in eos_token_ids)
        self.device = torch.device("cpu")
        self.compact_ratio = compact_ratio
        self.max_context = max_context
        self.graph = OrtGraph(self.onnx_path, providers=providers, threads=threads)
        self.k: torch.Tensor | None = None  # [L, B, H, capacity, D] dtype
        self.v: torch.Tensor | None = None
        self._taps_set = False

    @classmethod
    def from_export(cls, export_dir: str | Path, *, device=None, **opts) -> "OnnxRuntimeTarget":
        """The target of a ``dspark-export`` directory (its manifest's ``target`` section)."""
        from ..export.target_onnx import target_section

        if device is not None and torch.device(device).type != "cpu" and opts.get("providers") is None:
            raise DSparkTrtError(f"the onnxruntime target runs on the CPU here (device {device!r} asked); pass "
                                 f"providers=[...] for another onnxruntime execution provider, or use the tensorrt "
                                 f"backend on GPUs")
        export_dir = Path(export_dir)
        t = target_section(export_dir)
        return cls(export_dir / t["onnx"], num_layers=t["num_layers"], num_key_value_heads=t["num_key_value_heads"],
                   head_dim=t["head_dim"], hidden_size=t["hidden_size"], vocab_size=t["vocab_size"],
                   layer_ids=t["layer_ids"], dtype=t["dtype"], eos_token_ids=t.get("eos_token_ids") or (),
                   max_context=t.get("max_context"), **opts)

    # -- taps -----------------------------------------------------------------------------------------
    def set_taps(self, target_layer_ids: Sequence[int]) -> None:
        """The taps are part of the graph: ``target_layer_ids`` must be the ones it was exported with."""
        ids = tuple(int(i) for i in target_layer_ids)
        if ids != self.layer_ids:
            raise DSparkTrtError(f"the exported target taps layers {list(self.layer_ids)} but the drafter needs "
                                 f"{list(ids)}; export this drafter with its target (dspark-export DRAFTER --target "
                                 f"TARGET)")
        self._taps_set = True

    # -- the graph ------------------------------------------------------------------------------------
    def _graph_for(self, Q: int):
        """The graph that scores Q new tokens (one session here; the TensorRT target buckets by Q)."""
        return self.graph

    def _run(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor):
        """One graph call on the used slots; the new K/V are appended to the buffers. → logits, taps."""
        B, Q = ids.shape
        S = mask.shape[1] - Q
        if self.max_context is not None and S + Q > self.max_context:
            raise DSparkTrtError(f"the batch needs {S + Q} KV slots but the export's bound is {self.max_context}; "
                                 f"export again with a larger --max-context")
        self._reserve(B, S + Q)
        out = self._graph_for(Q).run({"input_ids": ids, "position_ids": positions,
                                      "attention_mask": mask.to(torch.int64), "past_key": self.k[:, :, :, :S],
                                      "past_value": self.v[:, :, :, :S]})
        self.k[:, :, :, S: S + Q] = out["new_key"]  # [L, B, H, Q, D]
        self.v[:, :, :, S: S + Q] = out["new_value"]
        return out["logits"], out["taps"]  # [B, Q, V] fp32, [B, Q, m·d]

    def _reserve(self, B: int, slots: int) -> None:
        """Buffers with room for ``slots`` slots (doubling; the used slots are kept)."""
        cap = 0 if self.k is None else self.k.shape[3]
        if self.k is not None and self.k.shape[1] == B and cap >= slots:
            return
        new_cap = max(slots, 2 * cap, 64)
        shape = (self.num_layers, B, self.num_key_value_heads, new_cap, self.head_dim)
        k = torch.zeros(shape, dtype=self.dtype, device=self.device)
        v = torch.zeros(shape, dtype=self.dtype, device=self.device)
        if self.k is not None and self.k.shape[1] == B:
            used = self.valid.shape[1] if self.valid is not None else 0
            k[:, :, :, :used], v[:, :, :, :used] = self.k[:, :, :, :used], self.v[:, :, :, :used]
        self.k, self.v = k, v

    def _check_taps(self) -> None:
        if not self._taps_set:
            raise DSparkTrtError("OnnxRuntimeTarget.set_taps(target_layer_ids) must be called before prefill/verify")

    @torch.inference_mode()
    def prefill(self, prompts: Sequence[torch.Tensor]) -> TargetOutput:
        """Start a batch: prompts (1-D int64, any lengths ≥ 1) are right-padded into one cache."""
        self._check_taps()
        lens = torch.tensor([len(p) for p in prompts], dtype=torch.int64)  # [B]
        B, T = len(prompts), int(lens.max())
        ids = torch.zeros(B, T, dtype=torch.int64)
        for b, p in enumerate(prompts):
            ids[b, : len(p)] = p.cpu()
        self.k = self.v = None  # a new batch: fresh buffers
        valid, positions = self._start(lens)  # [B, T] each
        logits, taps = self._run(ids, positions, valid)
        return TargetOutput(logits=logits[torch.arange(B), lens - 1], taps=taps)  # [B, V], [B, T, m·d]

    @torch.inference_mode()
    def verify(self, tokens: torch.Tensor, *, with_taps: bool = True) -> TargetOutput:
        """Score ``tokens`` [B, Q] at positions ``lengths … lengths+Q-1``; they stay pending until ``commit``."""
        self._check_taps()
        Q = tokens.shape[1]
        positions, mask = self._begin_verify(Q)  # [B, Q], [B, S + Q]
        logits, taps = self._run(tokens.cpu().to(torch.int64), positions, mask)
        self._end_verify(mask, Q)
        return TargetOutput(logits=logits, taps=taps if with_taps else None)

    # -- storage: the static buffers ------------------------------------------------------------------
    def _crop_slots(self, end: int) -> None:
        """Rollback by length: slots ≥ end are simply reused by the next round."""

    def _select_rows(self, rows: torch.Tensor) -> None:
        self.k, self.v = self.k[:, rows], self.v[:, rows]  # [L, B', H, capacity, D]

    def _storage(self):
        return self.k, self.v

    def _join_rows(self, old, old_slots: int, slots: int) -> None:
        (ok, ov), new_slots = old, self.valid.shape[1]
        cap = max(slots, ok.shape[3], self.k.shape[3])
        L, _, H, _, D = ok.shape
        B = ok.shape[1] + self.k.shape[1]
        k, v = torch.zeros((L, B, H, cap, D), dtype=self.dtype), torch.zeros((L, B, H, cap, D), dtype=self.dtype)
        Bo = ok.shape[1]
        k[:, :Bo, :, :old_slots], v[:, :Bo, :, :old_slots] = ok[:, :, :, :old_slots], ov[:, :, :, :old_slots]
        k[:, Bo:, :, :new_slots], v[:, Bo:, :, :new_slots] = self.k[:, :, :, :new_slots], self.v[:, :, :, :new_slots]
        self.k, self.v = k, v  # [L, B + Bn, H, capacity, D]

    def _gather_slots(self, order: torch.Tensor) -> None:
        B, longest = order.shape
        L, _, H, _, D = self.k.shape
        idx = order.view(1, B, 1, longest, 1).expand(L, B, H, longest, D)
        self.k[:, :, :, :longest] = self.k.gather(3, idx)
        self.v[:, :, :, :longest] = self.v.gather(3, idx)
