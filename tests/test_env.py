"""`dspark env`: the report names every component, and a broken package is reported, not fatal."""

from __future__ import annotations

import json

import torch

from dspark_trt.cli.main import main
from dspark_trt.env import collect_env, format_env, tensorrt_status


def test_report_has_the_bug_report_fields():
    env = collect_env()
    assert env["packages"]["torch"] and torch.__version__.startswith(env["packages"]["torch"].split("+")[0])
    assert env["cuda_available"] == torch.cuda.is_available()
    text = format_env(env)
    for name in ("python", "torch", "onnxruntime", "triton", "tensorrt", "tensorrt_rtx", "CUDA available", "nvcc"):
        assert name in text


def test_missing_and_broken_modules_are_described():
    assert tensorrt_status("surely_not_a_module_dspark") == "not installed"
    status = tensorrt_status("tensorrt")
    try:
        import tensorrt  # noqa: F401
    except Exception:
        assert status in ("not installed",) or status.startswith("installed but not importable")
    else:
        assert status[0].isdigit()


def test_cli_json(capsys):
    assert main(["env", "--json"]) == 0
    env = json.loads(capsys.readouterr().out)
    assert env["python"] and "packages" in env
