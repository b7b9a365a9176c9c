"""Helpers for tests and demos: tiny deterministic checkpoint pairs."""

from .tiny import TinyCheckpoint, tiny_config, write_tiny_checkpoint

__all__ = ["TinyCheckpoint", "tiny_config", "write_tiny_checkpoint"]
