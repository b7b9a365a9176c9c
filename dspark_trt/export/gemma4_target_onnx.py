"""Gemma-4 target → ONNX (``gemma4_target_graph.Gemma4TargetGraph``), and its check against ``transformers``.

    path = export_gemma4_target_onnx(model, layer_ids, "out/onnx/target.onnx")
    report = validate_gemma4_target_onnx(path, model, layer_ids)        # prompt longer than the sliding window
                                                                        # (the model in the export dtype)

Dynamic dims: batch ``B``, new tokens ``Q``, logits rows ``K``, the global layers' capacity ``P`` (mask ``S`` = P + Q)
and the sliding layers' ring capacity ``W``. The validation plays what a runtime does with a prompt of
2·window + 5 tokens: a prefill in two chunks and a verify of 4 tokens; after each call the sliding layers keep only
a ring of their last window − 1 + 3 tokens, stored rotated (slot order ≠ position order) so that the graph must
read positions, not slot order. Logits (soft-capped), taps and the new slots' K/V are compared with transformers
run once over the whole sequence (eager attention) in the export dtype (``gemma4_tolerance``): fp32 elementwise as
every target; fp16/bf16 the Llama/Qwen target's per-row rounding tolerance with a bound measured for Gemma-4's
unscaled attention (the graph runs as its fp32 emulation twin, rounding where PyTorch rounds), widened per block to
√2 × the model's own rounding error where transformers also runs in fp32 (``OwnRounding``): at full head sizes that
error is several times the tiny models' bound.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import torch

from ..errors import DSparkTrtError
from .validate import Check, ValidationReport

__all__ = ["export_gemma4_target_onnx", "validate_gemma4_target_onnx", "gemma4_section", "gemma4_tolerance",
           "RING_HEADROOM", "GEMMA4_ROW_RMS",
           "OWN_ROUNDING_FACTOR", "OwnRounding"]

log = logging.getLogger("dspark.export")

#: ring slots a sliding layer keeps past its window − 1: a round's rejected tokens roll back into the window
RING_HEADROOM = 3
#: the per-row rms bound c of a half-precision Gemma-4 validation (the Llama/Qwen target's tolerance has 10): see
#: ``gemma4_tolerance``
GEMMA4_ROW_RMS = 30.0
#: two implementations that each round as the model does lie up to ~√2 × its own rounding error apart (independent
#: errors of one size add in quadrature): a half-precision block's bound is max(c, this × the model's own error)
OWN_ROUNDING_FACTOR = 2 ** 0.5


def gemma4_tolerance(dtype: str):
    """The validation tolerance of a Gemma-4 target in ``dtype``: fp32 as every target; fp16/bf16 the target's
    ``RoundingTolerance`` (same form, a = 4, t = 100) with c = ``GEMMA4_ROW_RMS``. Gemma-4 attends unscaled over
    normed q/k, so a score's rounding moves the softmax √head_dim times more than in a Qwen3: on the tiny Gemma-4s
    of ``tests/export/test_gemma4_target.py`` (3 variants × 4 prompts × bf16/fp16) transformers' own half precision
    lies up to 31 u·√n·rms from its fp32, the exported graph up to 15 from transformers (only its split softmax
    rounds differently: with the two value products summed in fp32 it is bit-exact in bf16), while a graph tapping
    one layer off or attending over another window lies ≥ 110 away. c = 30: twice the graph's largest, about one
    model's own rounding error (docs/checkpoints.md, "The Gemma-4 target"). At full head sizes the model's own error
    is larger (60–79 at 256 / 512): the validation widens c per block to √2 × it when given the fp32 weights
    (``validate_gemma4_target_onnx(reference_fp32=...)``)."""
    import dataclasses

    from .validate_target import TARGET_TOLERANCES, RoundingTolerance

    tol = TARGET_TOLERANCES[dtype]
    if not isinstance(tol, RoundingTolerance):
        return tol
    return dataclasses.replace(tol, row_rms=GEMMA4_ROW_RMS, reason=tol.reason + "; Gemma-4's unscaled attention "
                               "over normed q/k: c measured for it (export/gemma4_target_onnx.py)")


def _example(graph, dtype: torch.dtype, B: int = 2, Q: int = 3, P: int = 4, W: int = 5, K: int = 2) -> tuple:
    g = torch.Generator().manual_seed(0)
    V = int(graph.cfg.vocab_size)
    past = [torch.randn(B, *graph.kv_shape[i][:1], P if graph.layer_types[i] == "full_attention" else W,
                        graph.kv_shape[i][1], generator=g).to(dtype) for i in graph.stored]
    pastv = [t.clone() for t in past]
    return (torch.randint(0, V, (B, Q), generator=g), (P + torch.arange(Q)).expand(B, Q).contiguous(),
            torch.ones(B, P + Q, dtype=torch.int64), torch.arange(W).expand(B, W).contiguous(),
            (torch.arange(K) % Q).expand(B, K).contiguous(), past, pastv)


def export_gemma4_target_onnx(model, target_layer_ids: Sequence[int], out_path: str | Path) -> Path:
    """Export a ``Gemma4ForCausalLM`` (its dtype is the graph's) tapping ``target_layer_ids``; write ``out_path``."""
    import onnx_ir as ir
    from torch.export import Dim

    from ..artifact.external_data import EXTERNAL_DATA_BYTES
    from ..torch_to_onnx import torch_onnx_export
    from .gemma4_target_graph import OUTPUT_NAMES, Gemma4TargetGraph, gemma4_input_names

    graph = Gemma4TargetGraph(model, target_layer_ids)
    dtype = next(model.parameters()).dtype
    args = _example(graph, dtype)
    b, q, k = Dim("B", min=1, max=4096), Dim("Q", min=1, max=1 << 20), Dim("K", min=1, max=1 << 20)
    p, s, w = Dim("P", min=1, max=1 << 20), Dim("S", min=2, max=1 << 21), Dim("W", min=1, max=1 << 20)
    past = [{0: b, 2: p if graph.layer_types[i] == "full_attention" else w} for i in graph.stored]
    dynamic = {"input_ids": {0: b, 1: q}, "position_ids": {0: b, 1: q}, "attention_mask": {0: b, 1: s},
               "window_positions": {0: b, 1: w}, "logits_index": {0: b, 1: k}, "past_keys": past,
               "past_values": past}
    log.info("exporting the Gemma-4 target graph (%d layers, %d with a cache, taps %s)", graph.num_layers,
             len(graph.stored), list(target_layer_ids))
    program = torch_onnx_export(graph, args, input_names=gemma4_input_names(graph.stored), output_names=OUTPUT_NAMES,
                                dynamic_shapes=dynamic)
    model_ir = program.model
    foreign = sorted({n.domain for n in model_ir.graph.all_nodes() if n.domain not in ("", "ai.onnx")})
    if foreign:
        raise DSparkTrtError(f"the Gemma-4 target graph uses non-standard ONNX domains {foreign} that TensorRT cannot "
                             f"parse; report this target")
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    size = sum(v.const_value.nbytes for v in model_ir.graph.initializers.values() if v.const_value is not None)
    ir.save(model_ir, out_path, external_data=f"{out_path.name}.data" if size > EXTERNAL_DATA_BYTES else None)
    return out_path


def gemma4_section(model, layer_ids: Sequence[int]) -> dict:
    """What the manifest's target section adds for a Gemma-4 graph: its K/V interface, per-type cache shapes and
    ``ring``, the sliding layers' cache per request that the runtimes keep (window − 1 + their rollback headroom)
    and the TensorRT profile optimizes ``W`` for (its maximum)."""
    from ..runtime.targets.gemma4 import RING_HEADROOM as RUNTIME_HEADROOM
    from .gemma4_target_graph import KV_INTERFACE, Gemma4TargetGraph

    graph = Gemma4TargetGraph(model, layer_ids)
    glob = [i for i in graph.stored if graph.layer_types[i] == "full_attention"]
    slid = [i for i in graph.stored if graph.layer_types[i] == "sliding_attention"]
    return {"kv_interface": KV_INTERFACE, "gemma4": {
        "sliding_window": graph.window, "stored_layers": graph.stored, "global_layers": glob, "sliding_layers": slid,
        "global_kv": list(graph.kv_shape[glob[0]]), "sliding_kv": list(graph.kv_shape[slid[0]]),
        "final_logit_softcapping": graph.softcap, "ring": graph.window - 1 + RUNTIME_HEADROOM}}


class _Ring:
    """One request's caches as a runtime would hold them: global layers all positions, sliding layers a rotated
    ring of the last ``keep`` positions (``window_positions``)."""

    def __init__(self, graph, keep: int):
        self.graph, self.keep = graph, keep
        self.glob = [i for i in graph.stored if graph.layer_types[i] == "full_attention"]
        self.slid = [i for i in graph.stored if graph.layer_types[i] == "sliding_attention"]
        self.k = {i: torch.zeros(1, graph.kv_shape[i][0], 0, graph.kv_shape[i][1]) for i in graph.stored}
        self.v = {i: t.clone() for i, t in self.k.items()}
        self.pos = torch.zeros(0, dtype=torch.int64)  # positions of the sliding ring's slots

    def feeds(self) -> tuple[dict, int, int]:
        """The cache inputs (fp32: exact for fp16/bf16 values; ``OrtGraph`` feeds the graph's dtype), the global
        capacity P and the slots used."""
        out = {}
        used = self.k[self.glob[0]].shape[2]
        P = max(used, 1)
        W = max(len(self.pos), 1)
        for i in self.graph.stored:
            cap = P if i in self.glob else W
            for name, src in (("key", self.k), ("value", self.v)):
                t = torch.zeros(1, src[i].shape[1], cap, src[i].shape[3])
                t[:, :, :src[i].shape[2]] = src[i]
                out[f"past_{name}_{i}"] = t
        wpos = torch.full((1, W), -1, dtype=torch.int64)
        wpos[0, :len(self.pos)] = self.pos
        out["window_positions"] = wpos
        return out, P, used

    def append(self, start: int, new: dict) -> None:
        Q = new[self.glob[0]][0].shape[2]
        for i in self.graph.stored:
            nk, nv = new[i]
            self.k[i] = torch.cat([self.k[i], nk], 2)
            self.v[i] = torch.cat([self.v[i], nv], 2)
        pos = torch.cat([self.pos, torch.arange(start, start + Q)])
        order = torch.argsort(pos)[-self.keep:]  # the last ``keep`` positions ...
        order = torch.roll(order, shifts=len(order) // 3)  # ... stored rotated, as a ring holds them
        for i in self.slid:
            self.k[i], self.v[i] = self.k[i][:, :, order], self.v[i][:, :, order]
        self.pos = pos[order]


def _reference_run(model, ids: torch.Tensor, layer_ids: Sequence[int], num_layers: int, stored: Sequence[int],
                   last: int, logit_rows: torch.Tensor | None = None, attention: str = "eager") -> tuple:
    """transformers over the whole prompt (``attention``: eager, or sdpa as a second implementation): logits [1, T, V] (``logit_rows``: only those positions,
    [1, R, V]) and taps [1, T, m·d] in the model's dtype, the K/V of the last ``last`` positions per stored layer
    ([1, H, ≤last, D] fp32 each), and the hidden states (L+1 tensors [1, T, d]: the taps one layer off are read from
    them)."""
    from ..taps import LayerTaps

    before = model.config._attn_implementation
    model.config._attn_implementation = attention
    taps_of = LayerTaps(layer_ids, num_layers)  # the last layer tapped before the final norm, as the graph
    try:
        with torch.no_grad(), taps_of.capture(model):
            out = model(ids, output_hidden_states=True, use_cache=True,
                        logits_to_keep=0 if logit_rows is None else logit_rows)  # 0: every position
    finally:
        model.config._attn_implementation = before
    cache = {i: (out.past_key_values.layers[i].keys[:, :, -last:].float(),
                 out.past_key_values.layers[i].values[:, :, -last:].float()) for i in stored}
    return out.logits, taps_of.select(out.hidden_states), cache, out.hidden_states


def _block_stats(tols: Sequence, got: torch.Tensor, ref: torch.Tensor, depths: Sequence[int]) -> list:
    """``got``/``ref`` [..., len(depths)·w]: each block of width w measured with its own tolerance ``tols[j]`` and
    depth → [RowStats per block]."""
    w = got.shape[-1] // len(depths)
    return [t.measure(got[..., j * w:(j + 1) * w], ref[..., j * w:(j + 1) * w], [n])
            for j, (t, n) in enumerate(zip(tols, depths))]


def _one_layer_off(layer_ids: Sequence[int], num_layers: int, hidden) -> torch.Tensor:
    """The taps a graph one layer off would give (layer i − 1 for each id i; the embeddings' neighbour is layer 0),
    read from transformers' hidden states (L+1 tensors [1, T, d]) → [1, T, m·d]."""
    from ..taps import LayerTaps

    return LayerTaps([i - 1 if i >= 0 else i + 1 for i in layer_ids], num_layers).select(hidden)


class OwnRounding:
    """How far a second implementation of the model lies from the reference, per check, in the tolerance's units
    u·√n·rms, per block (the logits; each tap; one layer's K/V): its worst row and worst element. For the half
    precision checks, transformers in the export dtype against itself in fp32 (the same weights, upcast: the
    model's own rounding); for the unrounded check, transformers in fp32 with sdpa against eager attention (how far
    summation order alone moves the model at this shape). A graph that computes as the model does lies about that
    far from it, not further: the bound of a block is max(c, √2·own) (``OWN_ROUNDING_FACTOR``;
    ``RoundingTolerance.widened``), the element tail likewise."""

    def __init__(self, tol):
        self.tol, self.own, self.tail = tol, {}, {}  # (chunk, kind) → [worst row per block], [worst element]

    def measure(self, key: tuple, other: torch.Tensor, ref: torch.Tensor, depths: Sequence[int]) -> None:
        """``other``/``ref`` [..., len(depths)·w]: one block per depth."""
        stats = _block_stats([self.tol] * len(depths), other.float(), ref.float(), depths)
        self.own[key] = [s.worst_row for s in stats]
        self.tail[key] = [s.worst_tail for s in stats]

    def bounds(self, key: tuple, blocks: int) -> list:
        own, tail = self.own.get(key, [0.0] * blocks), self.tail.get(key, [0.0] * blocks)
        return [self.tol.widened(e, OWN_ROUNDING_FACTOR, t) for e, t in zip(own, tail)]


def _check_blocks(name: str, got: torch.Tensor, ref: torch.Tensor, tols: Sequence, depths: Sequence[int],
                  own: Sequence[float] | None, apart: Sequence[float] | None = None,
                  own_label: str = "transformers' own rounding") -> Check:
    """Each block of ``got``/``ref`` [..., len(depths)·w] within its own bound ``tols[j]``; one line for all.
    ``own``: the model's own rounding per block (None: not measured); ``apart``: how far a tap one layer off lies,
    per block (the taps: block j taps layer depths[j] − 1; reported, with the layers whose tap this shape cannot
    tell from its neighbour's)."""
    if got.shape != ref.shape:
        return Check(name, False, f"shape {list(got.shape)} != reference {list(ref.shape)}")
    stats = _block_stats(tols, got, ref, depths)
    nonfinite = sum(s.nonfinite for s in stats)
    if nonfinite:
        return Check(name, False, f"{nonfinite} non-finite values (graph or transformers)")
    ok = all(s.worst_row <= t.row_rms and s.outside == 0 for s, t in zip(stats, tols))
    fmt = lambda xs: "/".join(f"{x:.0f}" if x >= 10 else f"{x:.2g}" for x in xs)  # noqa: E731
    detail = (f"max |Δ| {max(s.max_diff for s in stats):.3g}, worst row rms|Δ| {fmt(s.worst_row for s in stats)}"
              f"·u·√n·rms (limit {fmt(t.row_rms for t in tols)}), {sum(s.outside for s in stats)} of "
              f"{sum(s.elements for s in stats)} elements outside their bound")
    if own is not None:
        detail += f"; {own_label} {fmt(own)}"
    if apart is not None:
        blind = [n - 1 for n, a, t in zip(depths, apart, tols) if a <= t.row_rms]
        detail += f"; a tap one layer off lies {fmt(apart)}"
        if blind:
            detail += (f" (within the limit for the tap{'s' if len(blind) > 1 else ''} of layer{'s' if len(blind) > 1 else ''} "
                       f"{blind}: not told from the layer below at this shape)")
    return Check(name, ok, detail)


def _round_like(model, names: set, dtype: torch.dtype) -> None:
    """Round ``model``'s tensors ``names`` (those the half model holds in ``dtype``) to ``dtype`` in place, kept in
    fp32: the fp32 reference then holds the graph's weights exactly, upcast, whatever dtype the checkpoint has. So
    is a scaled embedding's ``embed_scale``, which transformers casts to the weight's dtype where it is used (√3840
    is 62.0 in bf16): the half model's and the graph's scale, not the fp32 model's."""
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if name in names and tensor.is_floating_point():
                tensor.copy_(tensor.to(dtype).float())
        for module in model.modules():
            scale = getattr(module, "embed_scale", None)
            if isinstance(scale, torch.Tensor) and scale.is_floating_point() and hasattr(module, "weight"):
                scale.copy_(scale.to(dtype).float())


def _play_chunks(session, graph, ids: torch.Tensor, chunks, rows=None):
    """Run ``chunks`` of ``ids`` through ``session`` as a runtime does (a rotated ring for the sliding layers): per
    chunk yield (index, label, (a, b), outputs, new K/V per stored layer, the ring). ``rows``: per chunk, the
    positions whose logits the graph returns (default: all)."""
    ring = _Ring(graph, graph.window - 1 + RING_HEADROOM)
    glob, slid = ring.glob, ring.slid
    for n, (a, b) in enumerate(chunks):
        feeds, P, used = ring.feeds()
        Q = b - a
        mask = torch.zeros(1, P + Q, dtype=torch.int64)
        mask[0, :used] = 1
        mask[0, P:] = 1
        index = torch.arange(Q)[None] if rows is None else (rows[n] - a)[None]
        feeds.update(input_ids=ids[:, a:b], position_ids=torch.arange(a, b)[None], attention_mask=mask,
                     logits_index=index)
        out = session.run(feeds)
        kg, vg, ks, vs = (out[k].float() for k in ("new_key_global", "new_value_global", "new_key_sliding",
                                                   "new_value_sliding"))
        new = {i: (kg[glob.index(i)], vg[glob.index(i)]) if i in glob else (ks[slid.index(i)], vs[slid.index(i)])
               for i in graph.stored}
        label = "verify" if n == len(chunks) - 1 else f"prefill chunk {n + 1}"
        yield n, label, (a, b), out, new, ring
        ring.append(a, new)


def _kv_check(graph, new: dict, cache: dict, Q: int, check) -> Check:
    """The verify's new K/V of every stored layer against the reference's last slots (``check(name, got, ref, i)``);
    one line: the first failure, else the last layer's."""
    worst = []
    for i in graph.stored:
        keys, values = cache[i]
        m = min(Q, keys.shape[2])
        worst.append(check(f"new K/V of layer {i}", torch.cat([new[i][0][:, :, -m:], new[i][1][:, :, -m:]]),
                           torch.cat([keys[:, :, -m:], values[:, :, -m:]]), i))  # [2, H, m, D]: a row per head, token
    bad = [c for c in worst if not c.ok]
    glob = sum(1 for i in graph.stored if graph.layer_types[i] == "full_attention")
    return bad[0] if bad else Check(f"verify new K/V of the {len(graph.stored)} storing layers ({glob} global, "
                                    f"{len(graph.stored) - glob} sliding)", True, worst[-1].detail)


#: every this many prefill positions one row of logits is compared in fp32 (own rounding, unrounded check; the verify:
#: every row): all rows of a 2k-token prompt at 262K ids are GBs in fp32
UNROUNDED_LOGIT_STRIDE = 16
#: the unrounded graph against transformers in fp32 (same weights), per row ≤ this · u·√n·rms (u of the export dtype),
#: or √2 × what summation order alone moves the model (sdpa vs eager) where that is larger: both compute in fp32, so
#: they differ by ≤ 5·10⁻⁴ on the tiny Gemma-4s of the tests and ≤ 0.07 / 0.37 at full width (6 / 11 layers), while a
#: tap one layer off lies ≥ 50 there and ≥ 41 / 28 at full width
UNROUNDED_ROW_RMS = 3.0


def unrounded_tolerance(dtype: str):
    """The unrounded check's base bound: the target's rounding tolerance of ``dtype`` with c = ``UNROUNDED_ROW_RMS``
    (t = 10·c), widened per block like the half-precision checks (``OwnRounding``: sdpa against eager in fp32)."""
    import dataclasses

    from .validate_target import TARGET_TOLERANCES

    return dataclasses.replace(TARGET_TOLERANCES[dtype], row_rms=UNROUNDED_ROW_RMS, row_tail=10 * UNROUNDED_ROW_RMS)


def _logit_rows(chunks) -> list:
    """Per chunk, the positions whose logits the unrounded check compares: every ``UNROUNDED_LOGIT_STRIDE``-th of a
    prefill chunk, all of the verify ([R_n] int64 each)."""
    last = len(chunks) - 1
    return [torch.arange(a, b) if n == last else torch.arange(a, b, UNROUNDED_LOGIT_STRIDE)
            for n, (a, b) in enumerate(chunks)]


def _unrounded_checks(onnx_path, graph, ids, chunks, labels, ref: dict, tap_depths, logit_depths, dtype: str, *,
                      low_memory: bool) -> list:
    """The half-precision graph run unrounded (``OrtGraph(rounding=False)``: its ops in fp32) against transformers in
    fp32 on the same weights (``ref``: its logits at ``rows``, taps, new K/V, the taps one layer off, and ``order``:
    sdpa against eager, the bound per block): here no rounding noise hides a structural difference — unless the
    model's own summation order moves it as far at this shape (the report line says how far a tap one layer off
    lies, and which taps the bound cannot tell from the layer below)."""
    import dataclasses

    from ..runtime.ort_session import OrtGraph

    order = ref["order"]
    session = OrtGraph(onnx_path, threads=torch.get_num_threads(), emulate_fp16=True, rounding=False,
                       low_memory=low_memory)
    checks, seen = [], 0
    for n, label, (a, b), out, new, _ in _play_chunks(session, graph, ids, chunks, ref["rows"]):
        R = len(ref["rows"][n])
        apart = [st.worst_row for st in _block_stats([order.tol] * len(tap_depths), ref["off"][:, a:b],
                                                     ref["taps"][:, a:b], tap_depths)]
        sdpa = "transformers fp32 sdpa vs eager"
        checks += [_check_blocks(f"unrounded {label} logits [{R} rows, V]", out["logits"].float(),
                                 ref["logits"][:, seen:seen + R], order.bounds((label, "logits"), 1), logit_depths,
                                 order.own[(label, "logits")], own_label=sdpa),
                   _check_blocks(f"unrounded {label} taps [Q={b - a}, m·d]", out["taps"].float(),
                                 ref["taps"][:, a:b], order.bounds((label, "taps"), len(tap_depths)), tap_depths,
                                 order.own[(label, "taps")], apart, own_label=sdpa)]
        seen += R
        if n == len(chunks) - 1:
            kv = _kv_check(graph, new, ref["cache"], b - a,
                           lambda name, got, want, i: _check_blocks(name, got, want, order.bounds(("verify", i), 1),
                                                                    [i + 1], order.own[("verify", i)], own_label=sdpa))
            checks.append(dataclasses.replace(kv, name="unrounded " + kv.name))
    return checks


def validate_gemma4_target_onnx(onnx_path: str | Path, model, layer_ids: Sequence[int], *, dtype: str | None = None,
                                seed: int = 0, raise_on_failure: bool = True, reference_fp32=None,
                                available: int | None = None) -> ValidationReport:
    """onnxruntime on ``onnx_path`` vs ``model`` (transformers in the export dtype) over a prompt of 2·window + 5
    tokens: two prefill chunks and a verify of 4 tokens, the sliding layers holding only their ring; logits, taps,
    new K/V within ``gemma4_tolerance(dtype)`` (fp32 elementwise; fp16/bf16 the rounding tolerance per row, n = the
    layers a value has passed; a bf16 or fp16 graph runs as its fp32 emulation twin, op by op as PyTorch rounds:
    ``runtime/ort_session.py``). ``dtype``: the export's (default: the model's).

    ``model`` is the transformers model, or a function that builds it: then the reference runs first and is dropped
    before onnxruntime maps the graph (its weights stay on disk, cast per run: ``low_memory``), so the two never hold
    their weights at once, as the Qwen3 target's validation (``validate_target.py``).

    ``reference_fp32`` (fp16/bf16 only; a model or a builder, as ``model``): the target in fp32, its weights first
    rounded to the export dtype in place (``_round_like``: the graph's weights, upcast). The half model's own
    rounding error is measured against it (``OwnRounding``; the logits at every ``UNROUNDED_LOGIT_STRIDE``-th prefill
    position and each verify position), and each block's bound becomes max(c, √2·own): at full
    head sizes a Gemma-4's own bf16 error is several times the tiny models' c. Then the graph runs a second time
    unrounded (its ops in fp32) against it, each row within ``UNROUNDED_ROW_RMS``: there no rounding noise hides a
    tap one layer off, unless summation order alone moves the model as far at that shape (each block within
    max(``UNROUNDED_ROW_RMS``, √2 × sdpa against eager in fp32)). A builder is skipped, falling back to c without the
    unrounded check, when its
    fp32 run does not fit ``available`` memory (default: what the kernel reports available)."""
    import gc
    from types import SimpleNamespace

    from ..runtime.ort_session import OrtGraph
    from .gemma4_target_graph import Gemma4TargetGraph
    from ..process_memory import memory_available
    from .validate_target import RoundingTolerance, _compare, reference_model

    model, build = reference_model(model)
    full = Gemma4TargetGraph(model, layer_ids)
    graph = SimpleNamespace(stored=full.stored, layer_types=full.layer_types, kv_shape=full.kv_shape,
                            window=full.window, num_layers=full.num_layers)  # what the ring and the checks read
    del full
    if dtype is None:
        dtype = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[next(model.parameters()).dtype]
    window = graph.window
    T = 2 * window + 5
    chunks = [(0, window + 2), (window + 2, T - 4), (T - 4, T)]  # prefill, prefill, verify
    labels = [f"prefill chunk {n + 1}" for n in range(len(chunks) - 1)] + ["verify"]
    Q_last = chunks[-1][1] - chunks[-1][0]
    vocab = int(model.config.vocab_size)
    ids = torch.randint(0, vocab, (1, T), generator=torch.Generator().manual_seed(seed))
    params = sum(p.numel() for p in model.parameters())
    half = {n for n, t in model.state_dict().items() if t.dtype in (torch.float16, torch.bfloat16)}  # the graph's
    ref_logits, all_taps, cache_tail, hidden = _reference_run(model, ids, layer_ids, graph.num_layers, graph.stored,
                                                              Q_last)  # [1, T, V], [1, T, m·d] in the model's dtype
    tol = gemma4_tolerance(dtype)
    tap_depths = [int(i) + 1 for i in layer_ids]  # layers a tap has passed (id -1: the embeddings)
    logit_depths = [graph.num_layers + 1]  # every layer, then the lm_head
    own, apart, own_note, unrounded = None, None, "", None
    if isinstance(tol, RoundingTolerance):  # how far a tap one layer off lies (from the reference's own states)
        off = _one_layer_off(layer_ids, graph.num_layers, hidden)
        apart = {label: [st.worst_row for st in _block_stats([tol] * len(tap_depths), off[:, a:b].float(),
                                                             all_taps[:, a:b].float(), tap_depths)]
                 for label, (a, b) in zip(labels, chunks)}
        del off
    del hidden
    if build is not None:
        del model
        gc.collect()  # the reference's weights are gone before the next are built or the graph's mapped
    if isinstance(tol, RoundingTolerance) and reference_fp32 is not None:
        rows = _logit_rows(chunks)  # the fp32 run's logits: these rows only (at 262K ids all rows are GBs)
        R = sum(len(r) for r in rows)
        need = 4 * params + 3 * 4 * R * vocab + (1 << 30)  # fp32 weights, its logits and their soft-capping, the rest
        usable = int(0.9 * (memory_available() if available is None else available))
        if callable(reference_fp32) and not isinstance(reference_fp32, torch.nn.Module) and need > usable:
            own_note = (f"; transformers' own rounding not measured: its fp32 run needs ~{need / 1e9:.1f} GB, "
                        f"{usable / 1e9:.1f} GB usable")
        else:
            fp32_model, _ = reference_model(reference_fp32)
            _round_like(fp32_model, half, {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype])
            f_logits, f_taps, f_cache, f_hidden = _reference_run(fp32_model, ids, layer_ids, graph.num_layers,
                                                                 graph.stored, Q_last, torch.cat(rows))
            own = OwnRounding(tol)
            seen = 0
            for label, (a, b), r in zip(labels, chunks, rows):  # the logits: at ``rows`` (their worst row)
                own.measure((label, "logits"), ref_logits[:, r], f_logits[:, seen:seen + len(r)].float(), logit_depths)
                own.measure((label, "taps"), all_taps[:, a:b], f_taps[:, a:b].float(), tap_depths)
                seen += len(r)
            for i in graph.stored:
                own.measure(("verify", i), torch.cat(cache_tail[i]), torch.cat(f_cache[i]), [i + 1])
            f_off = _one_layer_off(layer_ids, graph.num_layers, f_hidden)
            del f_hidden
            # a second fp32 implementation (sdpa): how far summation order alone moves the model at this shape
            g_logits, g_taps, g_cache, _ = _reference_run(fp32_model, ids, layer_ids, graph.num_layers, graph.stored,
                                                          Q_last, torch.cat(rows), attention="sdpa")
            del fp32_model
            order = OwnRounding(unrounded_tolerance(dtype))
            seen = 0
            for label, (a, b), r in zip(labels, chunks, rows):
                order.measure((label, "logits"), g_logits[:, seen:seen + len(r)], f_logits[:, seen:seen + len(r)],
                              logit_depths)
                order.measure((label, "taps"), g_taps[:, a:b], f_taps[:, a:b], tap_depths)
                seen += len(r)
            for i in graph.stored:
                order.measure(("verify", i), torch.cat(g_cache[i]), torch.cat(f_cache[i]), [i + 1])
            unrounded = {"rows": rows, "logits": f_logits.float(),  # [1, R, V] fp32
                         "taps": f_taps.float(), "cache": f_cache, "off": f_off.float(), "order": order}
            del f_logits, f_taps, f_off, g_logits, g_taps, g_cache
            gc.collect()
    bound = (f"; each block within max(c, {OWN_ROUNDING_FACTOR:.3g}·transformers' own {dtype} rounding error, "
             f"measured against its fp32); then the graph unrounded against transformers in fp32, each block within "
             f"max({UNROUNDED_ROW_RMS:g}, {OWN_ROUNDING_FACTOR:.3g}·transformers' fp32 sdpa vs eager)·u·√n·rms"
             if own is not None else own_note)
    report = ValidationReport(dtype, tol, title=f"Gemma-4 target validation: onnxruntime vs transformers, a prompt of "
                                                f"{T} tokens (sliding window {window}) in chunks {chunks}{bound}")
    session = OrtGraph(onnx_path, threads=torch.get_num_threads(), emulate_fp16=True,  # op by op as torch
                       low_memory=build is not None)

    def compare(name, got, ref, key, depths, apart_of=None):
        if not isinstance(tol, RoundingTolerance):
            return _compare(name, got, ref, tol, depths)
        bounds = own.bounds(key, len(depths)) if own is not None else [tol] * len(depths)
        return _check_blocks(name, got, ref, bounds, depths, None if own is None else own.own[key], apart_of)

    for n, label, (a, b), out, new, ring in _play_chunks(session, graph, ids, chunks):
        Q = b - a
        report.checks += [compare(f"{label} logits [Q={Q}, V] (soft-capped)", out["logits"],
                                  ref_logits[:, a:b].float(), (label, "logits"), logit_depths),
                          compare(f"{label} taps [Q={Q}, m·d]", out["taps"].float(), all_taps[:, a:b].float(),
                                  (label, "taps"), tap_depths, None if apart is None else apart[label])]
        if n == len(chunks) - 1:  # the new slots' K/V: transformers' cache holds them (its sliding layers: the last)
            report.checks.append(_kv_check(graph, new, cache_tail, Q, lambda *a: compare(*a[:3], ("verify", a[3]),
                                                                                       [a[3] + 1])))
    del session
    if unrounded is not None:  # the graph's arithmetic without roundings against transformers in fp32
        gc.collect()
        report.checks += _unrounded_checks(onnx_path, graph, ids, chunks, labels, unrounded, tap_depths, logit_depths,
                                           dtype, low_memory=build is not None)
    report.checks.append(Check("sliding layers held only their ring", len(ring.pos) == window - 1 + RING_HEADROOM < T,
                               f"{len(ring.pos)} of {T} positions ({window} window − 1 + {RING_HEADROOM} headroom)"))
    for line in report.lines():
        log.info(line)
    if raise_on_failure:
        report.raise_on_failure()
    return report
