"""``Gemma4OnnxRuntimeTarget``: an exported Gemma-4 text target (``export/gemma4_target_graph.py``) in onnxruntime.

The graph takes the global layers' caches and the sliding layers' caches as two families of different shapes
(``[B, H_g, P, D_g]`` and ``[B, H_s, W, D_s]``) plus ``window_positions`` [B, W], the position of each sliding slot
(−1: empty); layers that reuse another layer's K/V have no cache. Here both families are ``KVCache`` buffers with
the same slot layout as every other exported target (right-padded prefill, holes, rollback by length, compaction:
``SlotTarget``), and ``window_positions`` are the slots' positions, so the sliding layers attend only within their
window by position. This runtime keeps the sliding layers' slots for the whole context (the graph also takes a
ring of the last window − 1 + headroom tokens — what its validation feeds — but the runtime's ring is not written
yet: memory for sliding layers is that of global ones).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from ...errors import DSparkTrtError
from ..kv_cache import KVCache
from .exported import PREFILL_CHUNK, capacity_mask
from .onnxruntime import _TORCH_DTYPES, OnnxRuntimeTarget

__all__ = ["Gemma4OnnxRuntimeTarget", "TypeCaches", "slot_positions"]


def slot_positions(mask: torch.Tensor, capacity: int) -> torch.Tensor:
    """``window_positions`` [B, capacity] from the slot mask [B, S] (S ≤ capacity): each valid slot's position
    (holes do not count, as ``position_ids``), −1 for holes, padding and unused capacity."""
    B, S = mask.shape
    valid = mask != 0
    pos = torch.where(valid, valid.long().cumsum(1) - 1, torch.full_like(mask, -1, dtype=torch.int64))
    out = torch.full((B, capacity), -1, dtype=torch.int64)
    out[:, :S] = pos
    return out


class TypeCaches:
    """The global and the sliding layers' ``KVCache`` with one slot layout: every ``KVCache`` operation on both."""

    def __init__(self, *, glob: tuple[int, int, int], slid: tuple[int, int, int], dtype: torch.dtype,
                 device: torch.device):
        self.glob = KVCache(num_layers=glob[0], kv_heads=glob[1], head_dim=glob[2], dtype=dtype, device=device)
        self.slid = KVCache(num_layers=slid[0], kv_heads=slid[1], head_dim=slid[2], dtype=dtype, device=device)
        self.dtype = dtype

    @property
    def capacity(self) -> int:
        return self.glob.capacity

    @property
    def batch(self) -> int:
        return self.glob.batch

    @property
    def k(self):
        return self.glob.k, self.slid.k

    @property
    def v(self):
        return self.glob.v, self.slid.v

    def reserve(self, batch: int, slots: int, used: int) -> bool:
        a = self.glob.reserve(batch, slots, used)
        b = self.slid.reserve(batch, max(slots, self.glob.capacity), used)
        return a or b

    def clear(self) -> None:
        self.glob.clear()
        self.slid.clear()

    def select(self, rows: torch.Tensor, total: int | None = None) -> None:
        self.glob.select(rows, total)
        self.slid.select(rows, total)

    def join(self, old_k, old_v, old_slots: int, new_slots: int) -> None:
        self.glob.join(old_k[0], old_v[0], old_slots, new_slots)
        self.slid.join(old_k[1], old_v[1], old_slots, new_slots)

    def gather_slots(self, order: torch.Tensor) -> None:
        self.glob.gather_slots(order)
        self.slid.gather_slots(order)

    def nbytes(self) -> int:
        return self.glob.nbytes() + self.slid.nbytes()


class Gemma4OnnxRuntimeTarget(OnnxRuntimeTarget):
    """The Gemma-4 target graph of an export as a DSpark ``Target`` (CPU tensors; the module docstring)."""

    def __init__(self, onnx_path: str | Path, *, gemma4: dict, hidden_size: int, vocab_size: int,
                 layer_ids: Sequence[int], dtype: str = "fp32", eos_token_ids: Sequence[int] = (),
                 providers: list[str] | None = None, threads: int | None = None, compact_ratio: float = 2.0,
                 max_context: int | None = None, prefill_chunk: int | None = PREFILL_CHUNK, low_memory: bool = False):
        from ..ort_session import OrtGraph

        self.onnx_path = Path(onnx_path)
        if not self.onnx_path.is_file():
            raise DSparkTrtError(f"{self.onnx_path} is missing; re-run dspark-export with --target DIR")
        self.graph = OrtGraph(self.onnx_path, providers=providers, threads=threads, low_memory=low_memory)
        self._glob, self._slid = list(gemma4["global_layers"]), list(gemma4["sliding_layers"])
        names = [f"past_{kind}_{i}" for kind in ("key", "value") for i in self._glob + self._slid]
        missing = sorted(set(names) - set(self.graph.inputs))
        if missing or "window_positions" not in self.graph.inputs:
            raise DSparkTrtError(f"{self.onnx_path} is not the Gemma-4 target graph its manifest describes (missing "
                                 f"{(missing or ['window_positions'])[0]}); re-export the target")
        gk, gd = gemma4["global_kv"]
        self._init_exported(num_layers=len(gemma4["stored_layers"]), num_key_value_heads=gk, head_dim=gd,
                            hidden_size=hidden_size, vocab_size=vocab_size, layer_ids=layer_ids,
                            dtype=_TORCH_DTYPES[dtype], eos_token_ids=eos_token_ids, device=torch.device("cpu"),
                            compact_ratio=compact_ratio, max_context=max_context, prefill_chunk=prefill_chunk,
                            cache_dtype=self.graph.input_dtype(f"past_key_{self._glob[0]}"))
        self._gemma4 = dict(gemma4)
        self.cache = self._new_cache(self.cache.dtype)

    def _new_cache(self, dtype: torch.dtype) -> TypeCaches:
        g = self._gemma4
        return TypeCaches(glob=(len(self._glob), *g["global_kv"]), slid=(len(self._slid), *g["sliding_kv"]),
                          dtype=dtype, device=self.device)

    @classmethod
    def from_section(cls, export_root: Path, t: dict, **opts) -> "Gemma4OnnxRuntimeTarget":
        return cls(export_root / t["onnx"], gemma4=t["gemma4"], hidden_size=t["hidden_size"],
                   vocab_size=t["vocab_size"], layer_ids=t["layer_ids"], dtype=t["dtype"],
                   eos_token_ids=t.get("eos_token_ids") or (), max_context=t.get("max_context"), **opts)

    def _run(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor | None = None,
             headroom: int = 0):
        B, Q = ids.shape
        S = mask.shape[1] - Q
        if self.max_context is not None and S + Q > self.max_context:
            raise DSparkTrtError(f"the batch needs {S + Q} KV slots but the export's bound is {self.max_context}; "
                                 f"export again with a larger --max-context")
        self.cache.reserve(B, max(S, 1), used=S)
        gk, gv = self.cache.glob.layers()
        sk, sv = self.cache.slid.layers()
        if rows is None:
            rows = torch.arange(Q, device=ids.device).expand(B, Q)
        capacity = self.cache.capacity
        feeds = {"input_ids": ids, "position_ids": positions, "logits_index": rows,
                 "attention_mask": capacity_mask(mask, S, capacity),
                 "window_positions": slot_positions(mask[:, :S], capacity)}
        for layers, keys, values in ((self._glob, gk, gv), (self._slid, sk, sv)):
            feeds.update({f"past_key_{i}": k for i, k in zip(layers, keys)})
            feeds.update({f"past_value_{i}": v for i, v in zip(layers, values)})
        out = self.graph.run(feeds)
        self.cache.reserve(B, self._room(S + Q, headroom), used=S)
        self.cache.glob.write(S, out["new_key_global"], out["new_value_global"])
        self.cache.slid.write(S, out["new_key_sliding"], out["new_value_sliding"])
        return out["logits"], out["taps"]

    def fork(self) -> "Gemma4OnnxRuntimeTarget":
        import copy

        other = copy.copy(self)
        other.cache = self._new_cache(self.cache.dtype)
        other.valid = other._lengths = None
        other._pending = 0
        return other
