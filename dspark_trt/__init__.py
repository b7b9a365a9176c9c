"""dspark-trt: DSpark speculative-decoding drafters from checkpoint to TensorRT and Triton.

The public API is imported lazily so that ``import dspark_trt`` (and ``dspark --help``) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "DSparkConfig": "dspark_trt.config",
    "load_drafter": "dspark_trt.loader",
    "DSparkTrtError": "dspark_trt.errors",
    "DSparkTrtInternalError": "dspark_trt.errors",
    "CheckpointContractError": "dspark_trt.errors",
    "SpeculativeDecoder": "dspark_trt.runtime",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dspark_trt' has no attribute {name!r}")
