"""Text of a growing token sequence, handed out in pieces whose concatenation is the full decode.

    text = IncrementalText(tokenizer)
    text.push([72, 195])   → "H"        the lone 195 is half of "é" (shown as U+FFFD): held back
    text.push([169])       → "é"
    text.finish()          → ""         whatever is still held back (an unfinished character at the very end)
"""

from __future__ import annotations

__all__ = ["IncrementalText"]


class IncrementalText:
    """Text of a growing token sequence, handed out in pieces whose concatenation is the full decode.

    ``push(new_ids)`` returns the text that became final; a trailing incomplete UTF-8 character (shown by
    the tokenizer as U+FFFD) is held back until the next tokens complete it, or until ``finish()``.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.sent = 0  # characters handed out

    def _text(self) -> str:
        return self.tokenizer.decode(self.ids, skip_special_tokens=False)

    def push(self, new_ids) -> str:
        self.ids.extend(int(t) for t in new_ids)
        text = self._text()
        end = len(text)
        while end > self.sent and text[end - 1] == "\ufffd":
            end -= 1
        piece, self.sent = text[self.sent:end], max(self.sent, end)
        return piece

    def finish(self) -> str:
        text = self._text()
        piece, self.sent = text[self.sent:], len(text)
        return piece
