"""``OnnxRuntimeTarget``: the exported target graph (``onnx/target.onnx``) in onnxruntime, as a ``Target``.

The graph is stateless (``export/target_graph.py``): it reads each layer's K/V cache in place and returns
the new slots' K/V. This class keeps the cache in persistent buffers ``[L, B, H, capacity, D]``
(``runtime/kv_cache.py``: capacity buckets, grown when a round would overflow) whose per-layer views are the
graph's inputs as they lie — a step copies only its new slots, whatever the context — and shares the slot
bookkeeping of ``HFTarget`` (``SlotTarget``): right-padded prefill, a slot mask with holes for padding and
per-request rejections, rollback by length after each round (the used slot count shrinks; nothing is
copied), ``select`` for finished requests, compaction when holes pile up. Long prompts are prefilled in
chunks of ``prefill_chunk`` tokens (peak memory bounded by the chunk, not the prompt; faster too), logits
only at each prompt's last token. Taps are baked into
the graph at export; ``set_taps`` checks they are the drafter's.

bf16 graphs run on onnxruntime's CPU provider as their fp32 bf16-emulation twin (``runtime/ort_session.py``);
the cache is then kept in fp32 (bf16 values, exactly), the dtype the twin reads.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import torch

from ..errors import DSparkTrtError
from ..artifact.target_io import MAX_NEW_TOKENS
from .kv_cache import KVCache
from .target import SlotTarget, TargetOutput

__all__ = ["OnnxRuntimeTarget", "prefill_chunks", "capacity_mask", "PREFILL_CHUNK"]

log = logging.getLogger("dspark.runtime")

_TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
#: tokens per prefill chunk (a prompt of T tokens runs as ⌈T / chunk⌉ graph calls over the growing cache). On a
#: CPU, 2,048 tokens took 17 s in chunks of 128 or 256, 20 s in chunks of 512, 32 s (and 0.6 GiB more) at once;
#: at most the graph profile's ``MAX_NEW_TOKENS``
PREFILL_CHUNK = min(256, MAX_NEW_TOKENS)
#: slots reserved past the prompt at prefill, so the first rounds do not grow the cache at once
ROUND_HEADROOM = 16


def prefill_chunks(length: int, chunk: int | None) -> list[tuple[int, int]]:
    """[start, end) token ranges of a prefill of ``length`` tokens in chunks of ``chunk`` (None/0: one range)."""
    if length < 1:
        raise DSparkTrtError("a prompt needs at least one token")
    step = length if not chunk or chunk >= length else int(chunk)
    return [(a, min(a + step, length)) for a in range(0, length, step)]


def capacity_mask(mask: torch.Tensor, used: int, past: int) -> torch.Tensor:
    """The graph's ``attention_mask`` [B, past + Q] int64 from the slot mask ``mask`` [B, used + Q]: the used
    slots, zeros up to the capacity ``past`` the graph reads, then the Q new slots."""
    B, Q = mask.shape[0], mask.shape[1] - used
    out = torch.zeros(B, past + Q, dtype=torch.int64, device=mask.device)
    out[:, :used] = mask[:, :used]
    out[:, past:] = mask[:, used:]
    return out


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
        from .ort_session import OrtGraph

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
        self.prefill_chunk = prefill_chunk
        self.graph = OrtGraph(self.onnx_path, providers=providers, threads=threads, low_memory=low_memory)
        self._past_names = _past_names(self.graph.inputs, self.num_layers, self.onnx_path)
        # the cache in the dtype the session reads (fp32 for a bf16 graph's emulation twin): fed without conversion
        self.cache = KVCache(num_layers=self.num_layers, kv_heads=self.num_key_value_heads, head_dim=self.head_dim,
                             dtype=self.graph.input_dtype(self._past_names[0][0]), device=self.device)
        self._taps_set = False

    @classmethod
    def from_export(cls, export_dir: str | Path, *, device=None, **opts) -> "OnnxRuntimeTarget":
        """The target of a ``dspark-export`` directory (its manifest's ``target`` section)."""
        from ..artifact.export_dir import ExportDir

        if device is not None and torch.device(device).type != "cpu" and opts.get("providers") is None:
            raise DSparkTrtError(f"the onnxruntime target runs on the CPU here (device {device!r} asked); pass "
                                 f"providers=[...] for another onnxruntime execution provider, or use the tensorrt "
                                 f"backend on GPUs")
        export = ExportDir(export_dir)
        t = export.target
        return cls(export.root / t["onnx"], num_layers=t["num_layers"], num_key_value_heads=t["num_key_value_heads"],
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

    def _room(self, slots: int, headroom: int) -> int:
        """Slots to reserve: ``slots`` plus ``headroom`` within the export's bound."""
        room = slots + headroom
        return room if self.max_context is None else max(slots, min(room, self.max_context))

    def _prefill(self, ids: torch.Tensor, lens: torch.Tensor) -> TargetOutput:
        """Right-padded prompts ``ids`` [B, T] (lengths ``lens``) into a fresh cache, chunk by chunk: the cache grows
        with the chunks, so each one attends over about the slots before it; logits only at each prompt's end."""
        B, T = ids.shape
        valid, positions = self._start(lens)  # [B, T] each
        self.cache.clear()
        last = lens - 1  # [B] slot of each prompt's last token
        logits = torch.empty(B, self.vocab_size, dtype=torch.float32, device=self.device)
        taps = []
        for a, b in prefill_chunks(T, self.prefill_chunk):
            room = ROUND_HEADROOM if b == T else 0  # the last chunk leaves room for the first rounds
            index = (last - a).clamp(0, b - a - 1).view(B, 1)  # [B, 1]: the prompt's last token, if in this chunk
            chunk_logits, chunk_taps = self._run(ids[:, a:b], positions[:, a:b], valid[:, :b], index, room)
            ends = ((last >= a) & (last < b)).nonzero().view(-1)
            logits[ends] = chunk_logits[ends, 0].to(logits.device)
            taps.append(chunk_taps)
        return TargetOutput(logits=logits, taps=torch.cat(taps, dim=1) if len(taps) > 1 else taps[0])

    def _check_taps(self) -> None:
        if not self._taps_set:
            raise DSparkTrtError("OnnxRuntimeTarget.set_taps(target_layer_ids) must be called before prefill/verify")

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

    # -- storage: the cache buffers ------------------------------------------------------------------
    def _crop_slots(self, end: int) -> None:
        """Rollback by length: slots ≥ end are simply reused by the next round."""

    def _select_rows(self, rows: torch.Tensor) -> None:
        self.cache.select(rows)

    def _storage(self):
        return self.cache.k, self.cache.v

    def _join_rows(self, old, old_slots: int, slots: int) -> None:
        self.cache.join(old[0], old[1], old_slots, self.valid.shape[1])

    def _gather_slots(self, order: torch.Tensor) -> None:
        self.cache.gather_slots(order)

    def fork(self) -> "OnnxRuntimeTarget":
        """Another target on the same graph session with a cache and slots of its own (e.g. one per context length
        in a benchmark, without loading the graph again)."""
        import copy

        other = copy.copy(self)
        other.cache = KVCache(num_layers=self.num_layers, kv_heads=self.num_key_value_heads, head_dim=self.head_dim,
                              dtype=self.cache.dtype, device=self.device)
        other.valid = other._lengths = None
        other._pending = 0
        return other

    def cache_bytes(self) -> int:
        """Bytes held by the K/V cache now (memory per request = this / batch)."""
        return self.cache.nbytes()


def _past_names(inputs, num_layers: int, where) -> tuple[list[str], list[str]]:
    """The graph's per-layer cache inputs, checked: a graph with another K/V interface is refused in one line."""
    from ..artifact.target_io import past_names

    keys, values = past_names(num_layers)
    if not set(keys + values) <= set(inputs):
        raise DSparkTrtError(f"{where} does not take the per-layer K/V cache inputs past_key_0 … past_value_"
                             f"{num_layers - 1} (an older target graph?); re-export the target (dspark-export "
                             f"DRAFTER --target TARGET -o OUT --force)")
    return keys, values
