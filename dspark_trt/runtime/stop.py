"""Stop strings: a request ends as soon as its text contains one of them, and its text is cut before it.

Two sides of one rule, both on the text ``tokenizer.decode(tokens, skip_special_tokens=False)``:

* tokens (the decoder's requests, ``StopStrings.tokens_through``): after each round, the request's text is
  searched; on a match the request keeps the fewest tokens whose text contains a stop string, and finishes
  with reason ``"stop"``. Its text is then ``cut(decode(tokens))``: everything before the earliest match.
* text (streaming, ``StopText``): pieces from ``IncrementalText`` are handed out only once they can no longer
  become part of a stop string. A tail that could be the start of one is held back until the next tokens
  decide, and nothing from the stop string on is ever handed out::

      stop ["###"]:  "ab#" → "ab" (holds "#");  "#x" → "##x";  "##" → "" (holds "##");  "#" → "" (stopped)

The concatenation of ``StopText``'s pieces is ``cut(decode(tokens))``, the non-streamed text.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from ..errors import DSparkTrtError
from .text import IncrementalText

__all__ = ["MAX_STOP_STRINGS", "StopStrings", "StopText"]

MAX_STOP_STRINGS = 4  # as the OpenAI API


class StopStrings:
    """A request's stop strings (1 … ``MAX_STOP_STRINGS`` non-empty strings), checked once here."""

    def __init__(self, stops: Iterable[str]):
        stops = [stops] if isinstance(stops, str) else list(stops)
        if not stops:
            raise DSparkTrtError("stop needs at least one string; leave it unset for none")
        if len(stops) > MAX_STOP_STRINGS:
            raise DSparkTrtError(f"stop takes at most {MAX_STOP_STRINGS} strings, got {len(stops)}")
        for s in stops:
            if not isinstance(s, str) or not s:
                raise DSparkTrtError(f"stop strings must be non-empty text, got {s!r}")
        self.strings: tuple[str, ...] = tuple(dict.fromkeys(stops))

    def __repr__(self) -> str:
        return f"StopStrings({list(self.strings)!r})"

    def find(self, text: str) -> int | None:
        """Where the earliest stop string in ``text`` starts, or None."""
        found = [i for i in (text.find(s) for s in self.strings) if i >= 0]
        return min(found) if found else None

    def cut(self, text: str) -> str:
        """``text`` up to (not including) its earliest stop string."""
        at = self.find(text)
        return text if at is None else text[:at]

    def held_tail(self, text: str) -> int:
        """Length of the longest end of ``text`` that is the start of a stop string (not a whole one)."""
        best = 0
        for s in self.strings:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best

    def tokens_through(self, tokenizer, ids: Sequence[int], start: int = 0) -> int | None:
        """None while ``decode(ids)`` holds no stop string; else the fewest leading tokens (at least ``start``,
        the tokens already checked) whose text holds one."""
        decode = lambda n: tokenizer.decode(list(ids[:n]), skip_special_tokens=False)  # noqa: E731
        if self.find(decode(len(ids))) is None:
            return None
        for n in range(max(start, 1), len(ids)):
            if self.find(decode(n)) is not None:
                return n
        return len(ids)


class StopText:
    """``IncrementalText`` that holds back what could still become a stop string and ends before one.

    ``push(new_ids)`` → the text now safe to hand out; ``finish()`` → the rest (cut before a stop string);
    ``stopped`` tells whether a stop string was met. Without stop strings it is ``IncrementalText``.
    """

    def __init__(self, tokenizer, stop: StopStrings | Iterable[str] | None = None):
        self.text = IncrementalText(tokenizer)
        self.stop = stop if isinstance(stop, StopStrings) or stop is None else StopStrings(stop)
        self.held = ""  # decoded, not yet handed out
        self.stopped = False

    def push(self, new_ids) -> str:
        return self._release(self.text.push(new_ids), final=False)

    def finish(self) -> str:
        return self._release(self.text.finish(), final=True)

    def _release(self, piece: str, *, final: bool) -> str:
        if self.stopped:
            return ""
        text = self.held + piece
        if self.stop is None:
            self.held = ""
            return text
        at = self.stop.find(text)  # nothing handed out can start a match: it would have been held back
        if at is not None:
            self.stopped, self.held = True, ""
            return text[:at]
        keep = 0 if final else self.stop.held_tail(text)
        self.held = text[len(text) - keep:]
        return text[: len(text) - keep]
