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


def test_the_managed_triton_environment_is_named_with_its_size_and_the_way_around_it(tmp_path, monkeypatch, capsys):
    """issue 47: the first `dspark serve` builds a 1.5 GB venv under the cache, and `dspark env` did not say so."""
    import dspark_trt.serving.environment as environment

    monkeypatch.setenv("DSPARK_TRT_CACHE", str(tmp_path))
    monkeypatch.delenv("DSPARK_TRITON_ENV", raising=False)
    monkeypatch.setattr(environment.shutil, "which", lambda name: None)  # no tritonserver on PATH
    assert main(["env"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("Triton Python env"))
    assert f"{tmp_path}/triton-env-py" in line and "not built: the first `dspark serve` builds it" in line
    assert "about 1.5 GB" in line and "--tritonserver PATH" in line
    assert main(["env", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["triton_server_env"]["path"].startswith(str(tmp_path))
