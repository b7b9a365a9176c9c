"""Training drafters on the CPU (``dspark distill``). A room beside the product: nothing in the product imports it."""

from .distill import DistillSettings, distill
from .drafter_init import DrafterShape

__all__ = ["DistillSettings", "DrafterShape", "distill"]
