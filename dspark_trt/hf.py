"""Small helpers around Hugging Face ``transformers`` (imported lazily)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

__all__ = ["no_progress_bars"]


@contextmanager
def no_progress_bars() -> Iterator[None]:
    """Silence transformers' loading/saving progress bars (our CLIs keep stderr to their own lines)."""
    import transformers

    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()
    try:
        yield
    finally:
        if bars:
            transformers.utils.logging.enable_progress_bar()
