"""CPU thread counts for torch and the Numba Markov kernels (``--threads``)."""

from __future__ import annotations

import importlib.util

from .errors import DSparkTrtError

__all__ = ["set_cpu_threads"]


def set_cpu_threads(n: int) -> None:
    """``--threads N``: torch's intra-op threads and, when Numba is installed, the CPU Markov kernels' threads."""
    if n < 1:
        raise DSparkTrtError(f"--threads must be >= 1, got {n}")
    import torch

    torch.set_num_threads(n)
    if importlib.util.find_spec("numba") is not None:
        import numba

        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
