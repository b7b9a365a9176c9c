"""The embedded demo pair's build: progress reported per training step, logged per stage."""

from __future__ import annotations

import logging

import pytest

from dspark_trt.testing.embedded import build_embedded_pair


@pytest.mark.slow
def test_the_build_reports_progress(tmp_path, caplog):
    """The first-use build used to show nothing for ~40 s; the CLI turns these calls into a progress bar."""
    steps = []
    with caplog.at_level(logging.INFO, logger="dspark"):
        pair = build_embedded_pair(tmp_path / "demo", target_steps=3, distill_steps=2, progress=lambda: steps.append(1))
    assert len(steps) == 3 + 2
    assert "training the tiny target (3 steps)" in caplog.text and "distilling the drafter from it (2 steps)" in caplog.text
    assert pair.drafter.is_dir() and (tmp_path / "demo" / "build.json").is_file()
