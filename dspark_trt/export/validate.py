"""Check exported graphs against the reference drafter: onnxruntime vs ``DSparkDrafter`` on the same inputs.

Rules (docs/dspark.md §10.14, §10.16):

* context K/V and candidate logits within a **dtype-aware tolerance** (``TOLERANCES``, each with its
  reason); −inf compared equal; candidates compared by *id*, never by position (order is irrelevant);
* fp32: drafted tokens equal, greedy and probabilistic (same seeds → same tokens), candidate sets equal;
* fp16/bf16: a row may diverge only at a near-tie — the token onnxruntime picked must score within the
  tolerance of the reference's pick under the reference's own scores (``z`` greedy, ``z/T + g`` with the
  same Gumbel noise probabilistic), or one side's pick must be missing from the other side's candidates (a
  top-k boundary tie, judged by the candidate-set rule below). Later slots of that row condition on a
  different token and are not compared;
* candidate sets (top-k): an id chosen on one side only must sit at the top-k boundary — its reference base
  logit within the tolerance of the reference's k-th largest — since ties there flip with any rounding
  (docs/dspark.md §10.14). Without the reference base logits, a mean overlap of ≥ 97 % is required instead;
* candidate union (``markov_topm`` M > 0): the last M candidates of a slot are ``table[d_j]``, a function of the
  predecessor only, so wherever the predecessor agrees they must be the reference's ids exactly, in order (a
  wrong or stale table fails here); a masked duplicate (−inf in a union slot) is not a value of its id, so
  candidates are compared by id over the values that are not masked.

``validate_onnx`` runs both graphs on random inputs (several batch sizes, greedy and mixed temperatures,
and taps with four massive-activation channels at ±3·10⁴ whose K/V must be finite on both sides, for
every dtype: ``reference/precision.py``), logs the max errors, returns a ``ValidationReport`` and raises
``errors.ValidationMismatch`` (exit 3) on any failure.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from ..reference.markov import MarkovWalkResult, draft_to_target
from ..reference.precision import MASSIVE_ACTIVATION
from ..reference.sampling import DRAFT_SALT, gumbel_noise, is_greedy

__all__ = ["Tolerance", "TOLERANCES", "Check", "ValidationReport", "check_finite", "compare_context",
           "compare_draft", "validate_onnx"]

log = logging.getLogger("dspark.export")


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    reason: str
    min_overlap: float = 1.0  # mean candidate-set overlap required (top-k)
    exact_tokens: bool = True

    def bound(self, ref: torch.Tensor) -> torch.Tensor:
        return self.atol + self.rtol * ref.abs()

    def summary(self) -> str:
        return f"atol {self.atol:g}, rtol {self.rtol:g}"


#: per export dtype; the reason is printed with every report
TOLERANCES = {
    "fp32": Tolerance(2e-4, 1e-4, "fp32 both sides; onnxruntime's MLAS GEMMs sum in another order than torch "
                      "(~1e-6 relative per op, grown through the layers and the lm_head)"),
    "fp16": Tolerance(6e-2, 2e-2, "fp16 activations: onnxruntime and torch round fp16 intermediates at "
                      "different points (10-bit mantissa, ~1e-3 per op, grown through layers and lm_head)",
                      min_overlap=0.97, exact_tokens=False),
    "bf16": Tolerance(2.5e-1, 4e-2, "bf16 activations (8-bit mantissa, ~4e-3 per op) on both sides; "
                      "accumulation order flips roundings (docs/dspark.md §8.3.2: rtol 4e-2, atol 1e-1 per op)",
                      min_overlap=0.97, exact_tokens=False),
}


@dataclass
class Check:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'} {self.name}: {self.detail}"


@dataclass
class ValidationReport:
    dtype: str
    tolerance: Tolerance
    checks: list[Check] = field(default_factory=list)
    title: str = "validation"

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def lines(self) -> list[str]:
        t = self.tolerance
        head = f"{self.title} ({self.dtype}: {t.summary()} — {t.reason})"
        return [head] + ["  " + c.line() for c in self.checks]

    def raise_on_failure(self) -> None:
        if not self.ok:
            from ..errors import ValidationMismatch

            bad = [c for c in self.checks if not c.ok]
            raise ValidationMismatch(
                f"exported ONNX disagrees with the reference ({len(bad)} of {len(self.checks)} checks): "
                f"{bad[0].name}: {bad[0].detail}; re-export, or report a bug if it persists", self.lines()
            )


def _close(name: str, got: torch.Tensor, ref: torch.Tensor, tol: Tolerance, mask: torch.Tensor | None = None) -> Check:
    """Elementwise |got − ref| ≤ atol + rtol·|ref|; −inf == −inf; NaN always fails."""
    got, ref = got.to(torch.float64), ref.to(torch.float64)
    if got.shape != ref.shape:
        return Check(name, False, f"shape {list(got.shape)} != reference {list(ref.shape)}")
    both_inf = torch.isinf(got) & torch.isinf(ref) & (torch.sign(got) == torch.sign(ref))
    finite = torch.isfinite(got) & torch.isfinite(ref)
    err = torch.where(finite, (got - ref).abs(), torch.where(both_inf, 0.0, float("inf")))  # NaN, ±inf vs x: inf
    bad = ~both_inf & (~finite | (err > tol.bound(torch.where(finite, ref, 0.0))))
    if mask is not None:
        err, bad = err[mask], bad[mask]
    worst = float(err.max()) if err.numel() else 0.0
    n_bad = int(bad.sum())
    where = ""
    if n_bad:
        full = torch.zeros_like(got, dtype=torch.bool)
        full[mask if mask is not None else ...] = bad
        where = f", first at {tuple(int(i) for i in full.nonzero()[0])}"
    return Check(name, n_bad == 0, f"max |Δ| {worst:.3g}, {n_bad} of {err.numel()} outside tolerance{where}")


def check_finite(name: str, taps_dtype: torch.dtype, *tensors: torch.Tensor) -> Check:
    """All of ``tensors`` (reference and exported K/V) finite; else the fix: the dtype overflowed."""
    bad = [i for i, t in enumerate(tensors) if not bool(torch.isfinite(t).all())]
    if not bad:
        return Check(f"{name} finite", True, f"K/V finite on taps with channels at ±{MASSIVE_ACTIVATION:g}")
    return Check(f"{name} finite", False,
                 f"{len(bad)} of {len(tensors)} K/V tensors non-finite on taps with channels at "
                 f"±{MASSIVE_ACTIVATION:g} (taps fed as {str(taps_dtype).removeprefix('torch.')}): the context "
                 f"fusion overflowed; export in bf16 or fp32, or load the drafter with load_drafter(dtype='fp16') "
                 f"so fc and hidden_norm stay fp32")


def compare_context(got_k, got_v, ref_k, ref_v, tol: Tolerance, label: str = "context") -> list[Check]:
    """K/V [L, B, T, H_kv, D] against the reference."""
    return [_close(f"{label} ctx_k", got_k, ref_k, tol), _close(f"{label} ctx_v", got_v, ref_v, tol)]


def _union_masked(result: MarkovWalkResult) -> torch.Tensor:
    """[B, N, k (+ M)] bool: the union's masked duplicates (−inf in one of the last M slots)."""
    masked = torch.zeros(result.cand_logits.shape, dtype=torch.bool)
    M = result.union_width
    if M:
        masked[..., -M:] = result.cand_logits[..., -M:].cpu() == float("-inf")
    return masked


def _scores(result: MarkovWalkResult, temperature, seed, positions) -> torch.Tensor:
    """The reference's selection scores per candidate [B, N, k]: z (greedy) or z/T + g (probabilistic)."""
    z = result.cand_logits.to(torch.float64)
    if temperature is None:
        return z
    B, N, _ = z.shape
    steps = torch.arange(N).view(1, N, 1)
    g = gumbel_noise(seed.view(B, 1, 1), positions.view(B, 1, 1) + steps, result.cand_ids, DRAFT_SALT)
    greedy = is_greedy(temperature).view(B, 1, 1)
    temp = torch.where(greedy, 1.0, temperature.to(torch.float64).view(B, 1, 1))
    return torch.where(greedy, z, z / temp + g.to(torch.float64))


def _dense_rows(ids: torch.Tensor, values: torch.Tensor, vocab: int, skip: torch.Tensor | None = None) -> torch.Tensor:
    """Scatter candidates into −inf-filled rows [B, N, V_d] (so comparisons are by id, not position); ``skip``
    [B, N, k (+ M)] marks entries left out (the union's masked duplicates: their id's value is elsewhere)."""
    ids = ids.to(torch.int64)
    if skip is not None:
        ids = torch.where(skip, vocab, ids)  # an extra column, dropped below
    rows = torch.full((*ids.shape[:2], vocab + 1), float("-inf"), dtype=torch.float64)
    return rows.scatter(-1, ids, values.to(torch.float64))[..., :vocab]


def _present(ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B, N, V_d] bool: which ids are candidates (a NaN logit is still a candidate, and then fails)."""
    mask = torch.zeros((*ids.shape[:2], vocab), dtype=torch.bool)
    return mask.scatter(-1, ids.to(torch.int64), True)


def _picked(result: MarkovWalkResult, b: int, j: int, d2t: torch.Tensor | None) -> int:
    """The draft-vocab id the walk picked at (b, j): its candidate whose target id is the drafted token."""
    ids = result.cand_ids[b, j].to(torch.int64)
    match = (draft_to_target(ids, d2t) == int(result.tokens[b, j])).nonzero()
    return int(ids[match[0, 0]]) if len(match) else -1


def compare_draft(got: MarkovWalkResult, ref: MarkovWalkResult, tol: Tolerance, *, vocab: int,
                  d2t: torch.Tensor | None = None, temperature: torch.Tensor | None = None,
                  seed: torch.Tensor | None = None, positions: torch.Tensor | None = None,
                  base_logits: torch.Tensor | None = None, label: str = "draft") -> list[Check]:
    """One draft round against the reference round (module docstring for the rules).

    ``positions`` is the position of d_1 per request (anchor position + 1), as the walk keys its noise.
    """
    checks = []
    B, N = ref.tokens.shape
    M = ref.union_width  # candidate union width (0 = none): the last M candidates are table ids
    if got.cand_ids.shape != ref.cand_ids.shape or got.union_width != M:
        return [Check(f"{label} candidates", False, f"{list(got.cand_ids.shape)} with union width {got.union_width} "
                      f"!= reference {list(ref.cand_ids.shape)} with union width {M}")]
    differs = got.tokens.to(torch.int64) != ref.tokens.to(torch.int64)  # [B, N]
    first = torch.where(differs.any(1), differs.to(torch.int8).argmax(1), torch.full((B,), N))  # [B]
    comparable = torch.arange(N).view(1, N) <= first.view(B, 1)  # slots whose predecessor agrees
    got_skip, ref_skip = _union_masked(got), _union_masked(ref)  # [B, N, k + M]: masked duplicates
    got_rows = _dense_rows(got.cand_ids, got.cand_logits, vocab, got_skip)  # [B, N, V_d], −inf off the candidates
    ref_rows = _dense_rows(ref.cand_ids, ref.cand_logits, vocab, ref_skip)
    n_rows = int(differs.any(1).sum())
    if tol.exact_tokens or not n_rows:
        detail = f"{B * N - int(differs.sum())} of {B * N} equal"
        if n_rows:
            detail += f", first difference at {tuple(int(i) for i in differs.nonzero()[0])}"
        checks.append(Check(f"{label} tokens", n_rows == 0, detail))
    else:
        ref_scores = _dense_rows(ref.cand_ids, _scores(ref, temperature, seed, positions), vocab, ref_skip)
        got_scores = _dense_rows(got.cand_ids, _scores(got, temperature, seed, positions), vocab, got_skip)
        bad, at_boundary = [], 0
        for b in range(B):
            j = int(first[b])
            if j == N:
                continue
            mine, best = _picked(got, b, j, d2t), _picked(ref, b, j, d2t)
            if mine < 0 or best < 0:
                bad.append(f"row {b} slot {j}: drafted token is not one of its candidates")
                continue
            if not bool((got.cand_ids[b, j] == best).any()) or not bool((ref.cand_ids[b, j] == mine).any()):
                at_boundary += 1  # a pick the other side could not make: a top-k boundary tie, judged by the
                continue  # candidate-ids check below (sampling over flat logits may pick a boundary id)
            mine_score = ref_scores[b, j, mine] if torch.isfinite(ref_scores[b, j, mine]) else got_scores[b, j, mine]
            temp = 1.0 if temperature is None or is_greedy(temperature[b]) else float(temperature[b])
            slack = float(tol.bound(ref_rows[b, j, best])) / temp
            gap = float(ref_scores[b, j, best] - mine_score)
            if not gap <= slack:
                bad.append(f"row {b} slot {j}: picked a candidate {gap:.3g} below the reference's (slack {slack:.3g})")
        detail = (f"{B * N - int(differs.sum())} of {B * N} equal; {n_rows - len(bad) - at_boundary} row(s) "
                  f"diverged at a near-tie" + (f", {at_boundary} at a top-k boundary tie" if at_boundary else "")
                  + " (later slots not compared)")
        checks.append(Check(f"{label} tokens", not bad, detail + ("; " + bad[0] if bad else "")))
    k = ref.cand_ids.shape[-1] - M  # the top-k part
    got_top, ref_top = got.cand_ids[..., :k], ref.cand_ids[..., :k]
    in_both = _present(got.cand_ids, vocab) & _present(ref.cand_ids, vocab)  # [B, N, V_d]
    if k < vocab and base_logits is not None:
        checks.append(_boundary_check(f"{label} candidate ids", got_top, ref_top, base_logits, tol, comparable, vocab))
    else:
        overlap = (_present(got_top, vocab) & _present(ref_top, vocab)).sum(-1).to(torch.float64) / k  # [B, N]
        mean_overlap = float(overlap[comparable].mean())
        need = tol.min_overlap if k < vocab else 1.0
        checks.append(Check(f"{label} candidate ids", mean_overlap >= need,
                            f"mean overlap {mean_overlap:.4f} (need ≥ {need:g})"))
    if M:
        same = (got.cand_ids[..., k:].to(torch.int64) == ref.cand_ids[..., k:].to(torch.int64)).all(-1)  # [B, N]
        wrong = ~same & comparable
        detail = f"{int((same & comparable).sum())} of {int(comparable.sum())} slots hold the reference's {M} table ids"
        if wrong.any():
            detail += f", first difference at {tuple(int(i) for i in wrong.nonzero()[0])}"
        checks.append(Check(f"{label} union ids", not bool(wrong.any()), detail))
    checks.append(_close(f"{label} cand_logits", got_rows, ref_rows, tol, mask=in_both & comparable.unsqueeze(-1)))
    if (got.confidence is None) != (ref.confidence is None):
        checks.append(Check(f"{label} confidence", False, "present on one side only"))
    elif ref.confidence is not None:
        checks.append(_close(f"{label} confidence", got.confidence, ref.confidence, tol, mask=comparable))
    return checks


def _boundary_check(name: str, got_ids: torch.Tensor, ref_ids: torch.Tensor, base_logits: torch.Tensor,
                    tol: Tolerance, comparable: torch.Tensor, vocab: int) -> Check:
    """Ids in one top-k set only must be boundary ties: |U_ref(id) − kth largest U_ref| within tolerance."""
    k = ref_ids.shape[-1]
    base = base_logits.to(torch.float64)  # [B, N, V_d] reference base logits
    kth = torch.topk(base, k, dim=-1).values[..., -1:]  # [B, N, 1]
    only_one = (_present(got_ids, vocab) ^ _present(ref_ids, vocab)) & comparable.unsqueeze(-1)  # [B, N, V_d]
    off = ((base - kth).abs() > tol.bound(kth)) & only_one
    n_diff, n_off = int(only_one.sum()), int(off.sum())
    detail = f"{n_diff} id(s) in one set only"
    if n_diff:
        worst = float(((base - kth).abs() * only_one).max())
        detail += f", all within {worst:.3g} of the top-k boundary" if not n_off else \
            f"; {n_off} of them are not boundary ties (up to {worst:.3g} from the k-th base logit)"
    return Check(name, n_off == 0, detail)


def validate_onnx(context, draft, drafter, *, topk: int | None, dtype: str, batch_sizes=(1, 3), seed: int = 0,
                  raise_on_failure: bool = True, markov_topm: int = 0) -> ValidationReport:
    """Run the exported graphs (``OrtGraph``s) and the reference drafter on the same random inputs.

    Context: random taps → K/V. Draft: the reference's K/V with random valid lengths, random anchors, a
    greedy round (temperature 0 in the graph, ``None`` in the reference) and a probabilistic round with
    mixed per-request temperatures (greedy included) and seeds. Logs every check; raises
    ``ValidationMismatch`` on a failure unless ``raise_on_failure=False``. ``markov_topm`` M > 0: the draft graph
    walks the candidate union, checked against the reference round with the same M (its own table).
    """
    from ..runtime.drafter_graphs import run_context, run_draft

    from ..reference.precision import massive_channels, massive_taps

    c = drafter.config
    tol = TOLERANCES[dtype]
    report = ValidationReport(dtype, tol)
    gen = torch.Generator().manual_seed(seed)
    taps_dtype = drafter.fc.weight.dtype  # the context fusion's dtype (fp32 in an fp16 drafter)
    channels = massive_channels(c.num_taps, c.hidden_size, count=4, seed=seed)
    cases = [(B, False) for B in batch_sizes] + [(2, True)]  # last: massive-activation taps (issue #16)
    for B, massive in cases:
        T = 13 + 4 * B
        taps = torch.randn(B, T, c.num_taps * c.hidden_size, generator=gen)
        taps = (massive_taps(taps, channels) if massive else taps).to(taps_dtype)
        positions = torch.arange(T).expand(B, T)
        ref_k, ref_v = drafter.context_kv(taps, positions)
        got_k, got_v = run_context(context, taps, positions)
        label = f"B={B} massive" if massive else f"B={B}"
        if massive:
            report.checks.append(check_finite(f"{label} context", taps.dtype, ref_k, ref_v, got_k, got_v))
        report.checks += compare_context(got_k, got_v, ref_k, ref_v, tol, label=f"{label} context")
        ctx_len = torch.randint(1, T + 1, (B,), generator=gen)
        anchor = torch.randint(0, c.vocab_size, (B,), generator=gen)
        seeds = torch.randint(0, 2**31 - 1, (B,), generator=gen)
        temps = torch.tensor([0.0, 0.8, 1.3])[torch.arange(B) % 3] if B > 1 else torch.tensor([0.9])
        # sampled: row 0 at a random position ≤ p (a sliding cache's offset: runtime/drafter_state.py)
        offset = (torch.rand(B, generator=gen) * (ctx_len + 1)).to(torch.int64)  # [B] in [0, p]
        for mode, temperature, start in (("greedy", None, None), ("sampled", temps, offset)):
            ref = drafter.draft(anchor, ref_k, ref_v, ctx_len, topk=topk, temperature=temperature, seed=seeds,
                                markov_topm=markov_topm, ctx_start=start)
            base = drafter.base_logits(drafter.block_hidden(anchor, ref_k, ref_v, ctx_len, start))  # [B, N, V_d]
            got = run_draft(draft, anchor, ref_k, ref_v, ctx_len, temperature, seeds,
                            draft_vocab=c.draft_vocab_size, union_width=markov_topm, ctx_start=start)
            report.checks += compare_draft(got, ref, tol, vocab=c.draft_vocab_size, d2t=drafter.d2t_or_none,
                                           temperature=temperature, seed=seeds, positions=ctx_len + 1,
                                           base_logits=base, label=f"{label} {mode} draft")
    for line in report.lines():
        log.info(line)
    if raise_on_failure:
        report.raise_on_failure()
    return report
