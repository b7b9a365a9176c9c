"""The embedded demo pair's build: progress reported per training step, logged per stage."""

from __future__ import annotations

import logging

import pytest

from dspark_trt.demo.pair import build_embedded_pair


@pytest.mark.slow
def test_the_build_reports_progress(tmp_path, caplog):
    """The first-use build used to show nothing for ~40 s; the CLI turns these calls into a progress bar."""
    steps = []
    with caplog.at_level(logging.INFO, logger="dspark"):
        pair = build_embedded_pair(tmp_path / "demo", target_steps=3, distill_steps=2, progress=lambda: steps.append(1))
    assert len(steps) == 3 + 2
    assert "training the tiny target (3 steps)" in caplog.text and "distilling the drafter from it (2 steps)" in caplog.text
    assert pair.drafter.is_dir() and (tmp_path / "demo" / "build.json").is_file()


def test_the_pair_is_cached_under_the_one_cache_root(tmp_path, monkeypatch):
    """``cache_dir("demo")``: $DSPARK_TRT_CACHE (else XDG_CACHE_HOME), keyed by version, build version and options."""
    from dspark_trt.demo import pair as demo

    built = []

    def fake_build(out, *, force, progress, **options):
        built.append(options)
        (out / "build.json").parent.mkdir(parents=True)
        (out / "build.json").write_text("{}")

    monkeypatch.setattr(demo, "build_embedded_pair", fake_build)
    monkeypatch.setenv("DSPARK_TRT_CACHE", str(tmp_path / "cache"))
    first = demo.embedded_pair()
    assert first.drafter.parent.parent == tmp_path / "cache" / "demo" and len(built) == 1
    assert demo.embedded_pair() == first and len(built) == 1  # built once
    assert demo.embedded_pair(seed=1) != first and len(built) == 2  # every option is in the key
    monkeypatch.delenv("DSPARK_TRT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert demo.embedded_pair().drafter.parent.parent == tmp_path / "xdg" / "dspark-trt" / "demo"
