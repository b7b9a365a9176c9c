"""Training drafters: ``dspark distill`` (``distill.py``, the full recipe on the CPU or a GPU) and the quick
in-memory distiller the embedded demo pair and the tests' distilled pairs use (``quick.py``); both build the same
teacher-forced blocks (``blocks.py``). Above runtime/ and synthetic/; below the demo pair, models/, bench/ and
the CLI."""

from .distill import DistillSettings, distill
from .drafter_init import DrafterShape

__all__ = ["DistillSettings", "DrafterShape", "distill"]
