"""Served-model settings: round trip through config parameters, checks, runtime choice."""

from __future__ import annotations

import pytest

from dspark_trt.errors import DSparkTrtError
from dspark_trt.serving.served_decoder import choose_runtime, have_tensorrt
from dspark_trt.serving.settings import ModelSettings


def test_settings_round_trip_through_string_parameters(tmp_path):
    s = ModelSettings(export_dir=str(tmp_path), runtime="onnxruntime", topk=16, confidence_threshold=0.25,
                      verify_drafts=2, max_batch_size=8, max_context=None, threads=2)
    params = s.to_parameters()
    assert all(isinstance(v, str) for v in params.values()) and "max_context" not in params
    assert ModelSettings.from_parameters(params) == s.check()
    auto = ModelSettings(export_dir=str(tmp_path), runtime="onnxruntime", verify_drafts="auto")
    assert ModelSettings.from_parameters(auto.to_parameters()).verify_drafts == "auto"


@pytest.mark.parametrize("kwargs, message", [
    (dict(runtime="torch"), "either export_dir"),
    (dict(export_dir="X", drafter_dir="Y", runtime="onnxruntime"), "either export_dir"),
    (dict(drafter_dir="Y", runtime="torch"), "both drafter_dir and target_dir"),
    (dict(export_dir="X", runtime="torch"), "checkpoint pair"),
    (dict(drafter_dir="X", target_dir="Y", runtime="tensorrt"), "engines"),
    (dict(export_dir="X", runtime="vllm"), "unknown runtime"),
    (dict(export_dir="/nonexistent/dir", runtime="onnxruntime"), "does not exist"),
])
def test_bad_settings_are_one_line_errors(tmp_path, kwargs, message):
    kwargs = {k: (str(tmp_path) if v in ("X", "Y") else v) for k, v in kwargs.items()}
    with pytest.raises(DSparkTrtError, match=message):
        ModelSettings(**kwargs).check()


def test_non_numeric_parameter_is_refused():
    with pytest.raises(DSparkTrtError, match="topk='many'"):
        ModelSettings.from_parameters({"topk": "many"})


def test_runtime_choice(tmp_path):
    assert choose_runtime(export_dir=None) == "torch"
    (tmp_path / "manifest.json").write_text('{"format_version": 2, "engines": {"tensorrt": {"file": "x.engine"}}}')
    assert choose_runtime(export_dir=str(tmp_path)) == ("tensorrt" if have_tensorrt() else "onnxruntime")
    (tmp_path / "manifest.json").write_text('{"format_version": 2, "engines": {}}')
    assert choose_runtime(export_dir=str(tmp_path)) == "onnxruntime"
    assert choose_runtime(export_dir=str(tmp_path), forced="tensorrt") == "tensorrt"
    with pytest.raises(DSparkTrtError, match="nothing does not exist: pass an export directory"):
        choose_runtime(export_dir=str(tmp_path / "nothing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DSparkTrtError, match="no manifest.json"):
        choose_runtime(export_dir=str(tmp_path / "empty"))
    with pytest.raises(DSparkTrtError, match="unknown runtime"):
        choose_runtime(export_dir=None, forced="tgi")


def test_scheduler_gets_the_served_draft_options(tiny_pair):
    from dspark_trt.serving.served_decoder import build_scheduler

    settings = ModelSettings(drafter_dir=str(tiny_pair.drafter), target_dir=str(tiny_pair.target), runtime="torch",
                             topk=4, confidence_threshold=0.3, verify_drafts=2).check()
    sched = build_scheduler(settings)
    assert (sched.topk, sched.confidence_threshold, sched.verify_cap) == (4, 0.3, 2)
    with pytest.raises(DSparkTrtError, match="verify_drafts must be an integer"):
        build_scheduler(ModelSettings(**{**settings.__dict__, "verify_drafts": 99}), decoder=sched.decoder)
