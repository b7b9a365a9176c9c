"""The drafting options of a decode, resolved once against the drafter before any round runs: top-k and the
confidence threshold, the candidate union's M, and the cap on drafts verified per round. One-line errors.

``generate`` resolves them per call, ``RequestScheduler`` once for all its requests; the rounds then get the
resolved values (``round.RoundParams``).
"""

from __future__ import annotations

from ..errors import DSparkTrtError
from ..topk import resolve_topk

__all__ = ["resolve_draft_options", "resolve_markov_topm", "resolve_verify_drafts", "verify_length"]


def verify_length(text: str) -> int | str:
    """``--verify-drafts`` values (and the served model's parameter): an integer L, or 'auto' (argparse names this
    function in its error); ``resolve_verify_drafts`` checks the range against the drafter."""
    return "auto" if text.strip().lower() == "auto" else int(text)


def resolve_draft_options(c, topk, confidence_threshold: float | None, *, default_topk: int | None):
    """(top-k, threshold) for drafter config ``c``, checked: ``topk`` ``DEFAULT_TOPK`` → ``default_topk`` (the
    drafter's own), None or ``"off"`` → dense (None), K → K (``topk.parse_topk``)."""
    topk = resolve_topk(topk, default_topk)
    if topk is not None and not 1 <= topk <= c.draft_vocab_size:
        raise DSparkTrtError(f"top-k {topk} must be in [1, draft_vocab_size={c.draft_vocab_size}]; use a smaller "
                             f"--topk or 'off'")
    if confidence_threshold is not None:
        if not 0.0 <= float(confidence_threshold) <= 1.0:
            raise DSparkTrtError(f"confidence_threshold must be in [0, 1], got {confidence_threshold}")
        if not c.enable_confidence_head:
            raise DSparkTrtError("this drafter has no confidence head; drop confidence_threshold")
    return topk, confidence_threshold


def resolve_markov_topm(c, backend, markov_topm: int | None, topk: int | None) -> int:
    """The candidate union's M for drafter config ``c`` on ``backend`` (0 = top-k only); one-line errors where it
    cannot apply.

    ``None`` → an export's own M (``backend.fixed_markov_topm``), else the drafter config's
    ``draft_markov_topm`` where it can apply (a top-k round on a union-capable backend), else 0."""
    fixed = getattr(backend, "fixed_markov_topm", None)
    supports = getattr(backend, "supports_markov_topm", False)
    if markov_topm is None:
        if topk is None:
            markov_topm = 0
        elif fixed is not None:
            markov_topm = fixed
        else:
            markov_topm = c.draft_markov_topm if supports else 0
    markov_topm = int(markov_topm)
    if markov_topm:
        if not 0 < markov_topm <= c.draft_vocab_size:
            raise DSparkTrtError(f"--markov-topm {markov_topm} must be in [0, draft_vocab_size="
                                 f"{c.draft_vocab_size}]; use a smaller M")
        c.check_markov_topm(markov_topm)
        if topk is None:
            raise DSparkTrtError("--markov-topm needs a top-k head (the dense head already scores every token); "
                                 "pass --topk K or --markov-topm 0")
    if fixed is not None and topk is not None:  # an export: its M only (a top-k mismatch: the backend says so)
        from .drafters.base import check_export_variant

        check_export_variant("this export", have_topk=topk, have_markov_topm=fixed, topk=topk,
                             markov_topm=markov_topm)
    if markov_topm and not supports:
        raise DSparkTrtError(f"the {backend.name} backend has no candidate union yet; use --backend "
                             f"torch or --markov-topm 0")
    return markov_topm


def resolve_verify_drafts(c, verify_drafts: int | str | None) -> int | str | None:
    """The cap on drafts verified per round: ``None`` (or N) verifies all N; an integer in 1 … N; or ``"auto"``
    (``verify_policy``: chosen each round from the measured verify cost and acceptance)."""
    if verify_drafts is None:
        return None
    N = c.num_draft_tokens
    if isinstance(verify_drafts, str) and verify_drafts.strip().lower() == "auto":
        return "auto"
    if isinstance(verify_drafts, bool) or not isinstance(verify_drafts, int) or not 1 <= verify_drafts <= N:
        raise DSparkTrtError(f"verify_drafts must be an integer in 1 … {N} (the drafter's block N) or 'auto', got "
                             f"{verify_drafts!r}; leave it unset to verify all {N}")
    return verify_drafts if verify_drafts < N else None
