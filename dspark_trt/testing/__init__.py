"""Helpers for tests and demos: tiny deterministic checkpoint pairs, distilled drafters."""

from .distill import distill_drafter, distill_tiny_drafter, write_distilled_pair
from .tiny import TinyCheckpoint, tiny_config, write_tiny_checkpoint

__all__ = [
    "TinyCheckpoint",
    "distill_drafter",
    "distill_tiny_drafter",
    "tiny_config",
    "write_distilled_pair",
    "write_tiny_checkpoint",
]
