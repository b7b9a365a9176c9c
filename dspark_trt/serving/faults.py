"""Fault injection for reliability tests, behind one documented switch: ``DSPARK_TRT_FAULT_POSITION``.

    fail_rounds_at(decoder, position=200)      # every draft of a batch holding a request at position >= 200 raises

A request reaches position 200 only when its prompt + output are that long, so a test sends one long request
among short ones: the long one's rounds raise (``InjectedFault``, a ``RuntimeError``), whoever shares them, and
the scheduler must fail it alone while the others go on unchanged. The served model (``triton_model.py``)
installs the same fault when ``DSPARK_TRT_FAULT_POSITION`` is set in the server's environment
(``install_from_env``; docs/triton.md, "Fault injection"); unset — the default — nothing changes, and nothing
else reads that variable. No runtime import: the decoder is duck-typed (``decoder.backend.draft``).
"""

from __future__ import annotations

import os

__all__ = ["InjectedFault", "fail_rounds_at", "install_from_env", "FAULT_POSITION_ENV"]

FAULT_POSITION_ENV = "DSPARK_TRT_FAULT_POSITION"


class InjectedFault(RuntimeError):
    """The error an injected fault raises."""


def fail_rounds_at(decoder, position: int) -> None:
    """Make ``decoder``'s draft step raise whenever a request of the batch is at ``position`` or beyond."""
    backend = decoder.backend
    draft = backend.draft

    def failing_draft(anchor, ctx_k, ctx_v, ctx_len, **options):
        at = [int(p) for p in ctx_len.tolist()]
        if max(at, default=0) >= position:
            raise InjectedFault(f"injected fault: a request reached position {max(at)} (>= {position})")
        return draft(anchor, ctx_k, ctx_v, ctx_len, **options)

    backend.draft = failing_draft  # the instance attribute shadows the method


def install_from_env(decoder) -> int | None:
    """``fail_rounds_at(decoder, N)`` when ``$DSPARK_TRT_FAULT_POSITION`` is N; returns N (None: unset)."""
    raw = os.environ.get(FAULT_POSITION_ENV, "").strip()
    if not raw:
        return None
    fail_rounds_at(decoder, int(raw))
    return int(raw)
