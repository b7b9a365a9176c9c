"""CPU thread counts for torch and the Numba Markov kernels (``--threads``)."""

from __future__ import annotations

import importlib.util
import os

from .errors import DSparkTrtError

__all__ = ["default_cpu_threads", "set_cpu_threads"]


def set_cpu_threads(n: int) -> None:
    """``--threads N``: torch's intra-op threads and, when Numba is installed, the CPU Markov kernels' threads."""
    if n < 1:
        raise DSparkTrtError(f"--threads must be >= 1, got {n}")
    import torch

    torch.set_num_threads(n)
    if importlib.util.find_spec("numba") is not None:
        import numba

        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))


def default_cpu_threads() -> int:
    """The cores nobody else is using: the cores this process may run on minus the 1-minute load average,
    at least 1. Intra-op threads that wait for a core another process holds stall every op (a generate run
    with 2 threads and one core busy was 4–20x slower than with 1), so the default follows the load."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        busy = os.getloadavg()[0]
    except (AttributeError, OSError):
        busy = 0.0
    return max(1, min(cores, round(cores - busy)))

