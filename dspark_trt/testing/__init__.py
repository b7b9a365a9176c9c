"""Helpers for tests only (nothing in the product imports this package): distilled tiny pairs, the
massive-activation case. The synthetic checkpoints and the demo pair are product modules: ``dspark_trt.synthetic``,
``dspark_trt.demo``.
"""

from .distill import distill_tiny_drafter, write_distilled_pair

__all__ = ["distill_tiny_drafter", "write_distilled_pair"]
