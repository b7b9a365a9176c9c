"""Check the exported target graph against ``transformers``: ``OnnxRuntimeTarget`` vs ``HFTarget``, same model.

The scenario is the runtime's own: a right-padded prefill of two prompts of different lengths, a verify of
4 tokens, a commit that keeps 3 and 1 of them (a per-request rollback, leaving a hole), and a second verify
of 3 tokens over that cache. Logits (fp32) and taps are compared at every valid slot within the export
dtype's tolerance (``TARGET_TOLERANCES``, printed with its reason); a mismatch raises ``ValidationMismatch``
(CLI exit 3).

fp32: elementwise ``atol + rtol·|ref|`` (both sides store fp32; only summation order differs). fp16/bf16
(``RoundingTolerance``): both sides round every stored activation to the dtype (unit roundoff u), and a
pre-norm transformer spreads a rounding anywhere in a token's row over the whole row (RMSNorm, then GEMMs
that mix every channel), so errors scale with the row's RMS — massive activations included — and add up in
quadrature over the n layers a value has passed. Per row (one token's tap block of layer id ℓ: n = ℓ + 1;
its logits: n = L + 1)::

    rms(Δ_row) ≤ c · u · √n · rms(ref_row)                           the row as a whole
    |Δ_i|      ≤ a · u · |ref_i| + t · u · √n · rms(ref_row)         each element: own roundings + the row's

Constants measured, not tuned (docs/export.md "Precision"): on SmolLM2-135M (30 layers, massive activations
of 2.6·10⁴), transformers' own bf16 lies up to 4.9 u·√n·rms from its fp32 (rows), the exported graph up to
2.5 from transformers, a graph tapping one layer deeper ≥ 15 in its worst tap's worst row; c = 10 is twice a
model's own rounding error, t = 10·c an outlier no rounding explains, a = 4 the element's own two roundings
on each side.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from ..process_memory import memory_available
from .validate import Check, Tolerance, ValidationReport, _close

__all__ = ["TARGET_TOLERANCES", "RoundingTolerance", "UNIT_ROUNDOFF", "validate_target_onnx"]

log = logging.getLogger("dspark.export")

#: unit roundoff u (half an ulp at 1) of each half-precision storage dtype
UNIT_ROUNDOFF = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}
#: float64 values a RoundingTolerance check holds per slice of rows (~32 MB each, a few at once)
CHECK_SLICE_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class RoundingTolerance:
    """Two implementations of one target that both store activations in a half-precision dtype: per row,
    ``rms(Δ) ≤ c·u·√n·rms(ref)`` and ``|Δ_i| ≤ a·u·|ref_i| + t·u·√n·rms(ref)`` (module docstring)."""

    dtype: str
    reason: str
    element: float = 4.0  # a
    row_rms: float = 10.0  # c
    row_tail: float = 100.0  # t

    @property
    def unit(self) -> float:
        return UNIT_ROUNDOFF[self.dtype]

    def summary(self) -> str:
        return (f"per row over n layers rms|Δ| ≤ {self.row_rms:g}·u·√n·rms(ref), each |Δ| ≤ "
                f"{self.element:g}·u·|ref| + {self.row_tail:g}·u·√n·rms(ref), u = {self.unit:.3g}")

    def widened(self, own: float, factor: float, own_tail: float = 0.0) -> "RoundingTolerance":
        """This bound, or ``factor`` × a model's own measured error where that is larger: c' = max(c, factor·own)
        (``own``: its worst row, in u·√n·rms), t' = max(t·c'/c, factor·own_tail) (``own_tail``: its worst element
        past a·u·|ref|, in the same units: ``RowStats.worst_tail``)."""
        c = max(self.row_rms, factor * own)
        return dataclasses.replace(self, row_rms=c, row_tail=max(self.row_tail * c / self.row_rms, factor * own_tail))

    def measure(self, got: torch.Tensor, ref: torch.Tensor, depths: Sequence[int],
                mask: torch.Tensor | None = None) -> RowStats:
        """``got``/``ref`` [..., len(depths)·w]: one row of width w per depth n; ``mask`` [...] selects rows."""
        blocks = len(depths)
        G = got.reshape(*got.shape[:-1], blocks, -1)  # [..., m, w] in the compared dtypes
        R = ref.reshape(*ref.shape[:-1], blocks, -1)
        if mask is not None:
            G, R = G[mask], R[mask]
        G, R = G.reshape(-1, blocks, G.shape[-1]), R.reshape(-1, blocks, R.shape[-1])  # [rows, m, w]
        u = self.unit
        root_n = u * torch.tensor([max(int(n), 1) for n in depths], dtype=torch.float64).sqrt().view(1, blocks)
        # rows in slices of ~CHECK_SLICE_ELEMENTS float64 values: the same statistics, computed row by row, in a
        # bounded amount of memory (a prefill's logits at full vocabulary are GBs; fp64 copies of them were 5x that)
        step = max(1, CHECK_SLICE_ELEMENTS // max(1, blocks * G.shape[-1]))
        nonfinite, worst_row, n_out, max_diff, worst_tail = 0, 0.0, 0, 0.0, 0.0
        for start in range(0, G.shape[0], step):
            g = G[start:start + step].to(torch.float64)  # [rows', m, w]
            r = R[start:start + step].to(torch.float64)
            nonfinite += int((~torch.isfinite(g)).sum() + (~torch.isfinite(r)).sum())
            if nonfinite:
                continue  # counted over every row, as the report says how many
            diff = (g - r).abs()
            scale = root_n * r.pow(2).mean(-1).sqrt()  # [rows', m]: u·√n·rms(ref_row)
            err = diff.pow(2).mean(-1).sqrt()  # [rows', m]
            rel = torch.where(err == 0, 0.0, err / scale.clamp_min(torch.finfo(torch.float64).tiny))
            past = diff - self.element * u * r.abs()  # [rows', m, w]: beyond the element's own roundings
            outside = past > self.row_tail * scale.unsqueeze(-1)
            if rel.numel():
                worst_row, max_diff = max(worst_row, float(rel.max())), max(max_diff, float(diff.max()))
                tail = past / scale.unsqueeze(-1).clamp_min(torch.finfo(torch.float64).tiny)
                worst_tail = max(worst_tail, float(tail.max()))
            n_out += int(outside.sum())
        return RowStats(nonfinite, worst_row, n_out, max_diff, G.numel(), worst_tail)

    def check(self, name: str, got: torch.Tensor, ref: torch.Tensor, depths: Sequence[int],
              mask: torch.Tensor | None = None) -> Check:
        """``measure``, judged: every row within c and no element past its bound."""
        if got.shape != ref.shape:
            return Check(name, False, f"shape {list(got.shape)} != reference {list(ref.shape)}")
        s = self.measure(got, ref, depths, mask)
        if s.nonfinite:
            return Check(name, False, f"{s.nonfinite} non-finite values (graph or transformers)")
        ok = s.worst_row <= self.row_rms and s.outside == 0
        return Check(name, ok, f"max |Δ| {s.max_diff:.3g}, worst row rms|Δ| "
                               f"{s.worst_row:.2g}·u·√n·rms (limit {self.row_rms:.3g}), {s.outside} of {s.elements} "
                               f"elements outside their bound")


@dataclass(frozen=True)
class RowStats:
    """What ``RoundingTolerance.measure`` finds: non-finite values, the worst row's rms|Δ| in u·√n·rms(ref), the
    elements past their bound, the largest |Δ|, the elements compared, and the worst element's |Δ| beyond its own
    roundings (a·u·|ref|) in u·√n·rms(ref) of its row (the tail t it would need)."""

    nonfinite: int
    worst_row: float
    outside: int
    max_diff: float
    elements: int
    worst_tail: float = 0.0


#: per export dtype; the reason is printed with every report
TARGET_TOLERANCES = {
    "fp32": Tolerance(2e-4, 1e-4, "fp32 both sides; MLAS GEMMs and softmax sum in another order than torch "
                      "(~1e-7 relative per op, grown through the layers and the lm_head)"),
    "fp16": RoundingTolerance("fp16", "both sides store fp16 activations; roundings spread over a token's row and "
                              "add up over the layers (docs/export.md, Precision)"),
    "bf16": RoundingTolerance("bf16", "both sides store bf16 activations (the graph as its fp32 bf16-emulation twin "
                              "on onnxruntime's CPU provider); roundings spread over a token's row and add up over "
                              "the layers (docs/export.md, Precision)"),
}


def _compare(name: str, got: torch.Tensor, ref: torch.Tensor, tol, depths: Sequence[int],
             mask: torch.Tensor | None = None) -> Check:
    if isinstance(tol, RoundingTolerance):
        return tol.check(name, got, ref, depths, mask)
    if mask is not None:
        mask = mask.unsqueeze(-1).expand_as(ref)
    return _close(name, got, ref, tol, mask=mask)


#: the scenario after the prefill: (tokens verified, tokens kept per request) per verify step
_VERIFY_STEPS = ((4, (3, 1)), (3, (3, 3)))


def _play(target, layer_ids: Sequence[int], vocab_size: int, seed: int) -> dict:
    """Run the scenario on ``target`` (``HFTarget`` or ``OnnxRuntimeTarget``) and keep copies of what it returned:
    ``steps`` [(logits, taps)] for the prefill ([B, V], [B, T, m·d]) and each verify ([B, Q, V], [B, Q, m·d]),
    ``lengths`` (committed per request) and ``valid`` ([B, T] prefill slots holding a prompt token, or None)."""
    target.set_taps(layer_ids)
    gen = torch.Generator().manual_seed(seed)  # the same prompts and tokens on both sides
    prompts = [torch.randint(0, vocab_size, (n,), generator=gen) for n in (7, 3)]
    out = target.prefill(prompts)
    steps = [(out.logits.float().clone(), out.taps.clone())]
    valid = getattr(target, "valid", None)
    valid = None if valid is None else valid.clone()
    for Q, keep in _VERIFY_STEPS:
        out = target.verify(torch.randint(0, vocab_size, (2, Q), generator=gen))
        steps.append((out.logits.float().clone(), out.taps.clone()))
        target.commit(torch.tensor(keep))
    return {"steps": steps, "lengths": target.lengths.tolist(), "valid": valid}


def reference_model(model) -> tuple:
    """``model`` (a transformers model, or a function that builds one) → (the model, the builder or None). A validation
    given a builder owns the model: it may drop it once the reference has run, before the graph's weights are mapped."""
    build = model if callable(model) and not isinstance(model, torch.nn.Module) else None
    return (build() if build is not None else model), build


def validate_target_onnx(onnx_path: str | Path, model, layer_ids: Sequence[int], *, dtype: str, seed: int = 0,
                         raise_on_failure: bool = True) -> ValidationReport:
    """Run ``onnx_path`` (``OnnxRuntimeTarget``) and ``model`` (``HFTarget``) through prefill, verify, rollback,
    verify; compare logits and taps of ``layer_ids`` (the drafter's DeepSeek ids).

    ``model`` is the transformers model, or a function that builds it: then the reference runs first and is
    dropped before onnxruntime maps the graph, so the two never hold their weights at once (a validation's peak
    memory is one copy of the weights, not two)."""
    import gc

    from ..runtime.targets.onnxruntime import OnnxRuntimeTarget
    from ..runtime.targets.hf import HFTarget
    from .target_graph import target_shape

    model, build = reference_model(model)
    shape = target_shape(model.config)
    tol = TARGET_TOLERANCES[dtype]
    report = ValidationReport(dtype, tol, title="target validation: onnxruntime vs transformers, prefill + verify + "
                                                "rollback + verify")
    ref = _play(HFTarget(model), layer_ids, shape.vocab_size, seed)
    if build is not None:
        del model
        gc.collect()  # the reference's weights are gone before the graph's are mapped
    got = _play(OnnxRuntimeTarget(onnx_path, num_layers=shape.num_layers,
                                  num_key_value_heads=shape.num_key_value_heads, head_dim=shape.head_dim,
                                  hidden_size=shape.hidden_size, vocab_size=shape.vocab_size, layer_ids=layer_ids,
                                  dtype=dtype, low_memory=True), layer_ids, shape.vocab_size, seed)
    tap_depths = [int(i) + 1 for i in layer_ids]  # layers a tap has passed (id -1: the embeddings)
    logit_depths = [shape.num_layers + 1]  # every layer, then the lm_head
    steps = [("prefill", "[B, V]", "[B, T, m·d]", ref["valid"])] + [  # the prefill's padding slots are not compared
        (f"verify {i + 1} (Q={Q}{', after a rollback' if i else ''})", "[B, Q, V]", "[B, Q, m·d]", None)
        for i, (Q, _) in enumerate(_VERIFY_STEPS)]
    for (label, logits, taps, mask), (g_logits, g_taps), (r_logits, r_taps) in zip(steps, got["steps"], ref["steps"]):
        report.checks += [_compare(f"{label} logits {logits}", g_logits, r_logits, tol, logit_depths),
                          _compare(f"{label} taps {taps}", g_taps, r_taps, tol, tap_depths, mask=mask)]
    report.checks.append(Check("committed lengths", got["lengths"] == ref["lengths"],
                               f"{got['lengths']} vs transformers {ref['lengths']}"))
    for line in report.lines():
        log.info(line)
    if raise_on_failure and not report.ok:
        from ..errors import ValidationMismatch

        bad = [c for c in report.checks if not c.ok]
        raise ValidationMismatch(f"the exported target graph disagrees with transformers ({len(bad)} of "
                                 f"{len(report.checks)} checks): {bad[0].name}: {bad[0].detail}; re-export, or report "
                                 f"a bug if it persists", report.lines())
    return report


# -- at size: the full graph when its validation fits in memory, else a subset of its layers -----------------
def validation_need(weight_bytes: int, largest_fp32_bytes: int, *, copies: int = 1) -> int:
    """Resident bytes a validation needs: ``copies`` of the weights (1 for the target: the reference runs first and
    is dropped, then onnxruntime maps the graph's external data; 2 for the drafter, whose reference and graphs run
    side by side), the bf16 twin's per-run fp32 cast of its largest weight (twice: cast and GEMM operand) and 1 GB
    of activations and libraries."""
    return copies * weight_bytes + 2 * largest_fp32_bytes + (1 << 30)


def validate_target_files(onnx_path: str | Path, target_dir: str | Path, layer_ids: Sequence[int], *, dtype: str,
                          work_dir: str | Path, available: int | None = None) -> ValidationReport:
    """Validate the written target graph against transformers with the checkpoint's weights: the full graph when
    its validation (``validation_need``) fits in 90 % of the available memory, else the same export of the first
    k decoder layers (the most that fit in memory and in 90 % of the free disk, at least 2; embeddings, final
    norm and lm_head included; taps: the drafter's ids below k, else layer k - 1), written to ``work_dir`` and
    removed afterwards. The report's title says which."""
    import shutil

    from ..loader import resolve_dtype
    from .disk import free_bytes
    from ..artifact.external_data import load_graph_only
    from .streaming import Placeholders
    from .target_onnx import build_target_model, export_target_onnx

    torch_dtype = resolve_dtype(dtype)
    proto = load_graph_only(onnx_path)
    sizes = {i.name: _nbytes(i) for i in proto.graph.initializer}
    total, largest = sum(sizes.values()), max(sizes.values(), default=0)
    scale = 4 // torch.empty((), dtype=torch_dtype).element_size()
    budget = int(0.9 * (memory_available() if available is None else available))
    need = validation_need(total, largest * scale)
    layers = int(next((int(p.value) for p in proto.metadata_props if p.key == "dspark.num_layers"), 0)) or \
        _count_layers(proto)
    if need <= budget:
        report = validate_target_onnx(onnx_path, lambda: build_target_model(target_dir, torch_dtype), layer_ids,
                                      dtype=dtype)
        report.title += f" — the full graph ({layers} layers; needs ~{need / 1e9:.1f} GB, {budget / 1e9:.1f} GB usable)"
        return report
    outside, per_layer = _checkpoint_split(target_dir, torch_dtype, layers)
    fixed = validation_need(outside, largest * scale)
    work = Path(work_dir)
    disk = int(0.9 * free_bytes(work)[0]) - outside  # the subset graph is written to work_dir, then removed
    k = max(2, min(layers - 1, (budget - fixed) // per_layer, disk // per_layer))
    bound = "free disk" if disk < budget - fixed else "memory"
    ids = [i for i in layer_ids if i < k] or [k - 1]
    try:
        placeholders = Placeholders()
        sub = export_target_onnx(build_target_model(target_dir, torch_dtype, placeholders=placeholders, num_layers=k),
                                 ids, work / "target-subset.onnx", placeholders=placeholders)
        report = validate_target_onnx(sub, lambda: build_target_model(target_dir, torch_dtype, num_layers=k), ids,
                                      dtype=dtype, raise_on_failure=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report.title += (f" — a subset: the same export of decoder layers 0..{k - 1} of {layers} (the checkpoint's weights; "
                     f"embeddings, final norm, lm_head included; taps {ids}), since the full graph's "
                     f"validation needs ~{need / 1e9:.1f} GB and {budget / 1e9:.1f} GB are usable (k bounded by "
                     f"{bound}); the full graph's initializers were written from the same tensors")
    log.info(report.title)
    if not report.ok:
        from ..errors import ValidationMismatch

        bad = [c for c in report.checks if not c.ok]
        raise ValidationMismatch(f"the exported target graph disagrees with transformers ({len(bad)} of "
                                 f"{len(report.checks)} checks, layer subset): {bad[0].name}: {bad[0].detail}; "
                                 f"re-export, or report a bug if it persists", report.lines())
    return report


def _nbytes(tensor) -> int:
    for entry in tensor.external_data:
        if entry.key == "length":
            return int(entry.value)
    return len(tensor.raw_data)


def _count_layers(proto) -> int:
    return sum(1 for i in proto.graph.input if i.name.startswith("past_key_"))


def _checkpoint_split(target_dir, dtype: torch.dtype, layers: int) -> tuple[int, int]:
    """(bytes outside the decoder layers, bytes of one layer) of the target in ``dtype``, from the headers."""
    import math

    from ..checkpoint import SafetensorsCheckpoint

    item = torch.empty((), dtype=dtype).element_size()
    outside = inside = 0
    with SafetensorsCheckpoint(target_dir) as ck:
        for name, (shape, _) in ck.shapes().items():
            n = item * math.prod(shape)
            if ".layers." in f".{name}":
                inside += n
            else:
                outside += n
    return outside, max(1, inside // max(1, layers))
