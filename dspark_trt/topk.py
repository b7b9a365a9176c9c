"""The draft top-k's one encoding, and the one function that reads its spellings.

Inside the package a top-k is an ``int`` k >= 1 (candidates per draft slot: the top-k Markov head) or ``None``
(the dense Markov head: every draft-vocabulary token). ``"off"`` is how people write dense: ``--topk off`` on
every command and ``off`` in written settings (config.pbtxt parameters); ``parse_topk`` reads every spelling
and ``topk_text`` writes one. Where an argument means "the drafter's own top-k" (a checkpoint's
``draft_topk``, an export's top-k), its value is ``DEFAULT_TOPK``, never ``None``:

    generate(prompts)                       DEFAULT_TOPK: the drafter's own top-k
    generate(prompts, topk=None)            dense (as topk="off")
    generate(prompts, topk=16)              top-16
"""

from __future__ import annotations

import enum

from .errors import DSparkTrtError

__all__ = ["DEFAULT_TOPK", "parse_topk", "resolve_topk", "topk_text"]


class _Default(str, enum.Enum):  # a str, so settings holding it stay JSON (written as "default")
    DEFAULT_TOPK = "default"

    def __repr__(self) -> str:
        return "DEFAULT_TOPK"

    def __str__(self) -> str:
        return self.value


#: "the drafter's own top-k": a checkpoint's ``draft_topk`` (dense when unset), an export's top-k
DEFAULT_TOPK = _Default.DEFAULT_TOPK


def parse_topk(value: int | str | None, *, zero_is_off: bool = False) -> int | None:
    """A top-k in any spelling → the encoding: an integer K >= 1 (or its text) → K; ``"off"`` or ``None`` → None
    (dense). ``zero_is_off``: 0 means dense too (``dspark serve --topk`` and ``dspark triton-repo --topk`` have
    always taken it so); elsewhere 0 is refused like any K < 1. The range check against the drafter's vocabulary
    comes later, where the checkpoint is known."""
    if value is None:
        return None
    if value is DEFAULT_TOPK:
        raise DSparkTrtError("DEFAULT_TOPK is resolved against a drafter (resolve_topk), not parsed; pass K or 'off'")
    text = str(value).strip()
    if text.lower() == "off":
        return None
    try:
        k = int(text)
    except ValueError:
        k = -1
    if zero_is_off and k == 0 and not isinstance(value, bool):
        return None
    if k < 1 or isinstance(value, bool):
        raise DSparkTrtError(f"--topk {text}: use an integer K >= 1 (candidates per draft slot) or 'off' (the dense "
                             f"Markov head)")
    return k


def resolve_topk(value, default: int | None) -> int | None:
    """``value`` in the encoding, with ``DEFAULT_TOPK`` → ``default`` (the drafter's own top-k)."""
    return default if value is DEFAULT_TOPK else parse_topk(value)


def topk_text(topk: int | None) -> str:
    """How a top-k is written for people and settings files: ``"off"`` for dense, else K."""
    return "off" if topk is None else str(int(topk))
