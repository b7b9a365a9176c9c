"""Speculative decoding: a target model, a DSpark drafter backend, and the loop between them.

    from dspark_trt.runtime import SpeculativeDecoder
    dec = SpeculativeDecoder.from_pretrained("drafter/", "target/")
    out = dec.generate([[1, 2, 3]], max_new_tokens=32)
"""

from .decoder import SpeculativeDecoder, check_pair, load_tokenizer
from .drafter_state import DrafterState
from .scheduler import RequestHandle, RequestScheduler, SchedulerStats
from .stats import GenerationResult, GenerationStats
from .targets.base import Target, TargetOutput
from .targets.hf import HFTarget

__all__ = [
    "DrafterState",
    "GenerationResult",
    "GenerationStats",
    "HFTarget",
    "RequestHandle",
    "RequestScheduler",
    "SchedulerStats",
    "SpeculativeDecoder",
    "Target",
    "TargetOutput",
    "check_pair",
    "load_tokenizer",
]
