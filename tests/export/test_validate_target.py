"""The fp16/bf16 target tolerance (``RoundingTolerance``) on synthetic rows: what it lets through and what it
catches. The real target (SmolLM2, 30 layers) against it: tests/models/test_smollm2.py."""

from __future__ import annotations

import pytest
import torch

from dspark_trt.export.validate_target import TARGET_TOLERANCES, RoundingTolerance

DEPTHS = [4, 16, 29]  # taps of DeepSeek ids 3, 15, 28


def stream(seed: int = 0) -> torch.Tensor:
    """[B=2, T=5, 3·64] rows like a transformer's residual stream: RMS ~3, one massive channel at 2.6e4 at t = 0."""
    g = torch.Generator().manual_seed(seed)
    x = 3 * torch.randn(2, 5, 3 * 64, generator=g)
    x[:, 0, 7] = 2.6e4
    return x


def rounded_twice(x: torch.Tensor, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """``x`` as an implementation that rounds to ``dtype`` would give it: relative noise of u·√n per row."""
    tol = TARGET_TOLERANCES["bf16" if dtype == torch.bfloat16 else "fp16"]
    g = torch.Generator().manual_seed(seed)
    rows = x.unflatten(-1, (3, 64))
    rms = rows.pow(2).mean(-1, keepdim=True).sqrt()
    n = torch.tensor(DEPTHS, dtype=torch.float32).view(3, 1).sqrt()
    noisy = rows + tol.unit * n * rms * torch.randn(rows.shape, generator=g)
    return noisy.flatten(-2).to(dtype).float()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_two_roundings_pass_a_shift_an_outlier_and_nan_fail(dtype):
    tol = TARGET_TOLERANCES["bf16" if dtype == torch.bfloat16 else "fp16"]
    assert isinstance(tol, RoundingTolerance)
    x = stream()
    a, b = rounded_twice(x, dtype, 1), rounded_twice(x, dtype, 2)
    assert tol.check("taps", a, b, DEPTHS).ok
    shifted = x + 0.15 * 3 * torch.randn(x.shape, generator=torch.Generator().manual_seed(3))  # one layer's update
    failed = tol.check("taps", a, rounded_twice(shifted, dtype, 2), DEPTHS)
    assert not failed.ok and "limit 10" in failed.detail
    outlier = b.clone()
    outlier[1, 3, 100] += 200 * tol.unit * 4 * 3  # one element 200·u·√n·rms off: no rounding does that
    failed = tol.check("taps", a, outlier, DEPTHS)
    assert not failed.ok and "1 of 1920 elements outside" in failed.detail
    bad = b.clone()
    bad[0, 2, 5] = float("nan")
    assert "non-finite" in tol.check("taps", a, bad, DEPTHS).detail


def test_masked_rows_are_not_compared_and_shapes_must_match():
    tol = TARGET_TOLERANCES["bf16"]
    x = stream()
    a, b = rounded_twice(x, torch.bfloat16, 1), rounded_twice(x, torch.bfloat16, 2)
    b[1, 4] = 1e3  # padding slot of request 1
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[1, 4] = False
    assert tol.check("taps", a, b, DEPTHS, mask=mask).ok and not tol.check("taps", a, b, DEPTHS).ok
    assert not tol.check("taps", a, b[:, :4], DEPTHS).ok


def test_the_report_header_names_the_bound():
    assert "10·u·√n·rms(ref)" in TARGET_TOLERANCES["bf16"].summary()
    assert TARGET_TOLERANCES["fp32"].summary() == "atol 0.0002, rtol 0.0001"


@pytest.mark.parametrize("case", ["pass", "shift", "outlier", "nan", "masked"])
def test_row_slices_give_the_statistics_of_the_whole(case, monkeypatch):
    """The check runs over slices of rows (a full-vocabulary prefill's logits in fp64 at once were GBs): one row per
    slice, a few rows per slice and all rows at once give the same verdict and the same numbers."""
    from dspark_trt.export import validate_target

    tol = TARGET_TOLERANCES["bf16"]
    x = stream(5)
    a, b = rounded_twice(x, torch.bfloat16, 1), rounded_twice(x, torch.bfloat16, 2)
    mask = None
    if case == "shift":
        b = rounded_twice(x + 0.45 * torch.randn(x.shape, generator=torch.Generator().manual_seed(3)), torch.bfloat16, 2)
    elif case == "outlier":
        b[0, 4, 150] += 200 * tol.unit * 29 ** 0.5 * 3
    elif case == "nan":
        b[0, 1, 5], b[1, 3, 9] = float("nan"), float("inf")
    elif case == "masked":
        b[1, 4] = 1e3
        mask = torch.ones(2, 5, dtype=torch.bool)
        mask[1, 4] = False
    results = []
    for elements in (1, 3 * 64 * 3, 1 << 22):  # one row per slice, three rows, everything at once
        monkeypatch.setattr(validate_target, "CHECK_SLICE_ELEMENTS", elements)
        check = tol.check("taps", a, b, DEPTHS, mask=mask)
        results.append((check.ok, check.detail))
    assert results[0] == results[1] == results[2]
    assert results[0][0] == (case in ("pass", "masked"))
    if case == "nan":
        assert results[0][1].startswith("2 non-finite")
