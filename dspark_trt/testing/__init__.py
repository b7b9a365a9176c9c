"""Helpers for tests and demos: tiny deterministic checkpoint pairs, distilled drafters, real-shape presets."""

from .distill import distill_drafter, distill_tiny_drafter, write_distilled_pair
from .preset_checkpoint import WrittenCheckpoint, write_preset
from .tiny import TinyCheckpoint, tiny_config, write_tiny_checkpoint

__all__ = [
    "TinyCheckpoint",
    "WrittenCheckpoint",
    "distill_drafter",
    "distill_tiny_drafter",
    "tiny_config",
    "write_distilled_pair",
    "write_preset",
    "write_tiny_checkpoint",
]
