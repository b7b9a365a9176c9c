"""cli/common: shared CLI plumbing."""

from __future__ import annotations

import pytest
import torch

from dspark_trt.cli.common import set_cpu_threads
from dspark_trt.errors import DSparkTrtError


def test_threads_reach_torch_and_the_cpu_kernels():
    numba = pytest.importorskip("numba")
    before = torch.get_num_threads(), numba.get_num_threads()
    try:
        set_cpu_threads(1)
        assert torch.get_num_threads() == 1 and numba.get_num_threads() == 1
        set_cpu_threads(10_000)  # more than Numba's pool: capped there, not an error
        assert numba.get_num_threads() == numba.config.NUMBA_NUM_THREADS
    finally:
        torch.set_num_threads(before[0])
        numba.set_num_threads(before[1])


def test_zero_threads_is_a_one_line_error():
    with pytest.raises(DSparkTrtError, match="--threads must be >= 1"):
        set_cpu_threads(0)


@pytest.mark.parametrize("cores, load, expected", [(2, 0.0, 2), (2, 1.0, 1), (2, 7.5, 1), (16, 3.4, 13), (4, 0.6, 3)])
def test_default_threads_are_the_idle_cores(monkeypatch, cores, load, expected):
    import os

    from dspark_trt.threads import default_cpu_threads

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    assert default_cpu_threads() == expected

