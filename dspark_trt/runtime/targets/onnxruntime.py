"""``OnnxRuntimeTarget``: the exported target graph (``onnx/target.onnx``) in onnxruntime, as a ``Target``.

The cache, taps, chunked prefill and slot bookkeeping are ``ExportedTarget``'s (``targets/exported.py``, shared
with ``TensorRTTarget``); this class runs the graph in one onnxruntime session, rolling back by length after each
round (the used slot count shrinks; nothing is copied).

bf16 graphs run on onnxruntime's CPU provider as their fp32 bf16-emulation twin (``runtime/ort_session.py``);
the cache is then kept in fp32 (bf16 values, exactly), the dtype the twin reads.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import torch

from ...errors import DSparkTrtError
from .base import TargetOutput
from .exported import PREFILL_CHUNK, ExportedTarget, capacity_mask
from .gemma4 import Gemma4Storage

__all__ = ["OnnxRuntimeTarget", "Gemma4OnnxRuntimeTarget"]

log = logging.getLogger("dspark.runtime")

_TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class OnnxRuntimeTarget(ExportedTarget):
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
        prefill_chunk: prompts longer than this run in chunks of this many tokens (None: in one call).

    Example:
        >>> target = OnnxRuntimeTarget.from_export("out/export")
        >>> target.set_taps([1, 2, 4])       # must equal the export's layer ids
        >>> out = target.prefill([torch.tensor([1, 2, 3])])
    """

    def __init__(self, onnx_path: str | Path, *, num_layers: int, num_key_value_heads: int, head_dim: int,
                 hidden_size: int, vocab_size: int, layer_ids: Sequence[int], dtype: str = "fp32",
                 eos_token_ids: Sequence[int] = (), providers: list[str] | None = None, threads: int | None = None,
                 compact_ratio: float = 2.0, max_context: int | None = None,
                 prefill_chunk: int | None = PREFILL_CHUNK, low_memory: bool = False):
        from ..ort_session import OrtGraph

        self.onnx_path = Path(onnx_path)
        if not self.onnx_path.is_file():
            raise DSparkTrtError(f"{self.onnx_path} is missing; re-run dspark-export with --target DIR")
        if dtype not in _TORCH_DTYPES:
            raise DSparkTrtError(f"unknown target dtype {dtype!r}: use fp32, fp16 or bf16")
        self.graph = OrtGraph(self.onnx_path, providers=providers, threads=threads, low_memory=low_memory)
        self._past_names = _past_names(self.graph.inputs, int(num_layers), self.onnx_path)
        # the cache in the dtype the session reads (fp32 for a bf16 graph's emulation twin): fed without conversion
        self._init_exported(num_layers=num_layers, num_key_value_heads=num_key_value_heads, head_dim=head_dim,
                            hidden_size=hidden_size, vocab_size=vocab_size, layer_ids=layer_ids,
                            dtype=_TORCH_DTYPES[dtype], eos_token_ids=eos_token_ids, device=torch.device("cpu"),
                            compact_ratio=compact_ratio, max_context=max_context, prefill_chunk=prefill_chunk,
                            cache_dtype=self.graph.input_dtype(self._past_names[0][0]))

    @classmethod
    def from_export(cls, export_dir: str | Path, *, device=None, **opts) -> "OnnxRuntimeTarget":
        """The target of a ``dspark-export`` directory (its manifest's ``target`` section)."""
        from ...artifact.export_dir import ExportDir

        if device is not None and torch.device(device).type != "cpu" and opts.get("providers") is None:
            raise DSparkTrtError(f"the onnxruntime target runs on the CPU here (device {device!r} asked); pass "
                                 f"providers=[...] for another onnxruntime execution provider, or use the tensorrt "
                                 f"backend on GPUs")
        export = ExportDir(export_dir)
        t = export.target
        if t.get("kv_interface") == "gemma4-windowed-v1":  # a Gemma-4 target graph: per-type caches
            return Gemma4OnnxRuntimeTarget.from_section(export.root, t, **opts)
        return cls(export.root / t["onnx"], num_layers=t["num_layers"], num_key_value_heads=t["num_key_value_heads"],
                   head_dim=t["head_dim"], hidden_size=t["hidden_size"], vocab_size=t["vocab_size"],
                   layer_ids=t["layer_ids"], dtype=t["dtype"], eos_token_ids=t.get("eos_token_ids") or (),
                   max_context=t.get("max_context"), **opts)

    # -- the graph ------------------------------------------------------------------------------------
    def _graph_for(self, Q: int):
        """The graph that scores Q new tokens (one session here; the TensorRT target buckets by Q)."""
        return self.graph

    def _run(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor | None = None,
             headroom: int = 0):
        """One graph call: ``ids`` [B, Q] at slots S … S+Q-1 (``mask`` [B, S + Q]). The graph reads the cache in
        place — its whole capacity, the unused slots masked — and returns the new K/V, written into those slots
        after the cache has room for them (and ``headroom`` more). ``rows`` [B, K]: the new tokens that get logits
        (default all). → logits [B, K, V] fp32, taps [B, Q, m·d]."""
        B, Q = ids.shape
        S = mask.shape[1] - Q
        if self.max_context is not None and S + Q > self.max_context:
            raise DSparkTrtError(f"the batch needs {S + Q} KV slots but the export's bound is {self.max_context}; "
                                 f"export again with a larger --max-context")
        self.cache.reserve(B, max(S, 1), used=S)  # the graph reads what is cached (at least one slot)
        keys, values = self.cache.layers()  # L × [B, H, capacity, D] views, contiguous: no copy
        if rows is None:
            rows = torch.arange(Q, device=ids.device).expand(B, Q)
        feeds = {"input_ids": ids, "position_ids": positions, "logits_index": rows,
                 "attention_mask": capacity_mask(mask, S, self.cache.capacity)}
        feeds.update(zip(self._past_names[0], keys))
        feeds.update(zip(self._past_names[1], values))
        out = self._graph_for(Q).run(feeds)
        self.cache.reserve(B, self._room(S + Q, headroom), used=S)  # grows by buckets: copies the S used slots
        self.cache.write(S, out["new_key"], out["new_value"])  # [L, B, H, Q, D]
        return out["logits"], out["taps"]  # [B, K, V] fp32, [B, Q, m·d]

    @torch.inference_mode()
    def prefill(self, prompts: Sequence[torch.Tensor]) -> TargetOutput:
        """Start a batch: prompts (1-D int64, any lengths ≥ 1) are right-padded into one cache."""
        self._check_taps()
        lens = torch.tensor([len(p) for p in prompts], dtype=torch.int64)  # [B]
        B, T = len(prompts), int(lens.max())
        if self.max_context is not None and T > self.max_context:
            raise DSparkTrtError(f"a prompt of {T} tokens exceeds the export's bound of {self.max_context} tokens; "
                                 f"shorten it or export again with a larger --max-context")
        ids = torch.zeros(B, T, dtype=torch.int64)
        for b, p in enumerate(prompts):
            ids[b, : len(p)] = p.cpu()
        return self._prefill(ids, lens)  # logits [B, V], taps [B, T, m·d]

    @torch.inference_mode()
    def verify(self, tokens: torch.Tensor, *, with_taps: bool = True) -> TargetOutput:
        """Score ``tokens`` [B, Q] at positions ``lengths … lengths+Q-1``; they stay pending until ``commit``."""
        self._check_taps()
        Q = tokens.shape[1]
        positions, mask = self._begin_verify(Q)  # [B, Q], [B, S + Q]
        logits, taps = self._run(tokens.cpu().to(torch.int64), positions, mask)
        self._end_verify(mask, Q)
        return TargetOutput(logits=logits, taps=taps if with_taps else None)


def _past_names(inputs, num_layers: int, where) -> tuple[list[str], list[str]]:
    """The graph's per-layer cache inputs, checked: a graph with another K/V interface is refused in one line."""
    from ...artifact.target_io import past_names

    keys, values = past_names(num_layers)
    if not set(keys + values) <= set(inputs):
        raise DSparkTrtError(f"{where} does not take the per-layer K/V cache inputs past_key_0 … past_value_"
                             f"{num_layers - 1} (an older target graph?); re-export the target (dspark-export "
                             f"DRAFTER --target TARGET -o OUT --force)")
    return keys, values


class Gemma4OnnxRuntimeTarget(Gemma4Storage, OnnxRuntimeTarget):
    """An exported Gemma-4 text target (``export/gemma4_target_graph.py``) as a DSpark ``Target`` (CPU tensors).

    The graph takes the global and the sliding layers' caches (two shapes) and ``window_positions``, each sliding
    slot's position. The global layers keep every slot (``KVCache``, the slot layout of every exported target);
    the sliding layers keep a ring of their last window − 1 + ``RING_HEADROOM`` tokens per request
    (``targets/gemma4.py``, whose cache I/O the TensorRT target shares), so their memory does not grow with the
    context."""

    def __init__(self, onnx_path: str | Path, *, gemma4: dict, hidden_size: int, vocab_size: int,
                 layer_ids: Sequence[int], dtype: str = "fp32", eos_token_ids: Sequence[int] = (),
                 providers: list[str] | None = None, threads: int | None = None, compact_ratio: float = 2.0,
                 max_context: int | None = None, prefill_chunk: int | None = PREFILL_CHUNK, low_memory: bool = False):
        from ..ort_session import OrtGraph
        from .gemma4 import cache_names, new_caches

        self.onnx_path = Path(onnx_path)
        if not self.onnx_path.is_file():
            raise DSparkTrtError(f"{self.onnx_path} is missing; re-run dspark-export with --target DIR")
        if dtype not in _TORCH_DTYPES:
            raise DSparkTrtError(f"unknown target dtype {dtype!r}: use fp32, fp16 or bf16")
        self.graph = OrtGraph(self.onnx_path, providers=providers, threads=threads, low_memory=low_memory)
        self._names = cache_names(gemma4)
        missing = sorted({n for names in self._names for n in names} - set(self.graph.inputs))
        if missing or "window_positions" not in self.graph.inputs:
            raise DSparkTrtError(f"{self.onnx_path} is not the Gemma-4 target graph its manifest describes (missing "
                                 f"{(missing or ['window_positions'])[0]}); re-export the target")
        gk, gd = gemma4["global_kv"]
        self._init_exported(num_layers=len(gemma4["stored_layers"]), num_key_value_heads=gk, head_dim=gd,
                            hidden_size=hidden_size, vocab_size=vocab_size, layer_ids=layer_ids,
                            dtype=_TORCH_DTYPES[dtype], eos_token_ids=eos_token_ids, device=torch.device("cpu"),
                            compact_ratio=compact_ratio, max_context=max_context, prefill_chunk=prefill_chunk,
                            cache_dtype=self.graph.input_dtype(self._names[0][0]))
        self._gemma4 = dict(gemma4)
        self.cache = new_caches(self._gemma4, self.cache.dtype, self.device)  # the dtype the session reads

    @torch.inference_mode()
    def verify(self, tokens: torch.Tensor, *, with_taps: bool = True) -> TargetOutput:
        from .gemma4 import check_verify_length

        check_verify_length(tokens.shape[1])
        return super().verify(tokens, with_taps=with_taps)

    @classmethod
    def from_section(cls, export_root: Path, t: dict, **opts) -> "Gemma4OnnxRuntimeTarget":
        return cls(export_root / t["onnx"], gemma4=t["gemma4"], hidden_size=t["hidden_size"],
                   vocab_size=t["vocab_size"], layer_ids=t["layer_ids"], dtype=t["dtype"],
                   eos_token_ids=t.get("eos_token_ids") or (), max_context=t.get("max_context"), **opts)

    def _run(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor | None = None,
             headroom: int = 0):
        from .gemma4 import graph_feeds, write_new

        B, Q = ids.shape
        S = mask.shape[1] - Q
        if self.max_context is not None and S + Q > self.max_context:
            raise DSparkTrtError(f"the batch needs {S + Q} KV slots but the export's bound is {self.max_context}; "
                                 f"export again with a larger --max-context")
        self.cache.reserve(B, max(S, 1), used=S)
        if rows is None:
            rows = torch.arange(Q, device=ids.device).expand(B, Q)
        feeds = {"input_ids": ids, "position_ids": positions, "logits_index": rows,
                 "attention_mask": capacity_mask(mask, S, self.cache.capacity),
                 **graph_feeds(self.cache, self._names, positions[:, 0])}
        out = self.graph.run(feeds)
        self.cache.reserve(B, self._room(S + Q, headroom), used=S)
        write_new(self.cache, out, S, positions, mask[:, S:] != 0)
        return out["logits"], out["taps"]
