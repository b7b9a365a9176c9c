"""Installed without extras (or with a package missing): every entry point gives the one-line ``pip install``
hint and exits 1 instead of a ``ModuleNotFoundError`` traceback; ``--device cuda`` on a CPU-only torch too.

The packages are made unimportable in a child process by a ``sitecustomize`` that puts ``None`` in
``sys.modules`` for them (what Python does for a package that is not there: ``ModuleNotFoundError`` on import,
``find_spec`` → None), so the check runs with everything installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dspark_trt

pytestmark = pytest.mark.slow  # a child process per case (imports torch)

REPO = Path(dspark_trt.__file__).resolve().parents[1]

BLOCKER = """
import os, sys
for name in filter(None, os.environ.get("DSPARK_TEST_BLOCK", "").split(",")):
    sys.modules[name] = None
"""


def run_without(tmp_path, blocked: str, *argv: str, entry: str = "dspark_trt.cli.main"):
    (tmp_path / "blocker").mkdir(exist_ok=True)
    (tmp_path / "blocker" / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "DSPARK_TEST_BLOCK": blocked,
           "PYTHONPATH": os.pathsep.join([str(tmp_path / "blocker"), str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", entry, *argv], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=600)


def one_error_line(proc) -> str:
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def test_the_blocker_blocks(tmp_path):
    proc = run_without(tmp_path, "onnxruntime", "env")
    assert proc.returncode == 0
    env = {**os.environ, "DSPARK_TEST_BLOCK": "onnxruntime", "PYTHONPATH": str(tmp_path / "blocker")}
    probe = subprocess.run([sys.executable, "-c", "import onnxruntime"], capture_output=True, text=True, env=env)
    assert probe.returncode == 1 and "ModuleNotFoundError" in probe.stderr


@pytest.mark.parametrize("blocked, argv, hint", [
    ("triton", ["export", "{drafter}", "--topk", "16", "--engine", "none", "-o", "out"],
     "compiling the top-k Markov kernel to PTX (--topk) needs the Python package triton, which is not installed: "
     f"pip install -e '{REPO}[kernels]'"),
    ("tensorrt_rtx", ["export", "{drafter}", "--topk", "off", "--engine", "tensorrt-rtx", "-o", "out"],
     "--engine tensorrt-rtx needs the Python package tensorrt-rtx, which is not installed: "
     f"pip install -e '{REPO}[rtx]'"),
    ("onnx", ["export", "{drafter}", "--topk", "off", "--engine", "none", "-o", "out"],
     "dspark export needs the Python package onnx, which is not installed: pip install onnx (a dependency of "
     "dspark-trt: reinstalling dspark-trt brings it)"),
    ("onnxruntime", ["generate", "--drafter", "{drafter}", "--target", "{target}", "--backend", "onnxruntime",
                     "--input-ids", "1 2 3", "--max-new-tokens", "2"],
     "needs the Python package onnxruntime, which is not installed: pip install onnxruntime"),
    ("matplotlib", ["bench", "markov", "--plot", "m.png", "--vocab", "300", "--topk", "4", "--rank", "8"],
     "--plot needs the Python package matplotlib, which is not installed: "
     f"pip install -e '{REPO}[bench]'"),
])
def test_a_missing_package_is_a_one_line_pip_hint(tmp_path, tiny_pair, blocked, argv, hint):
    argv = [a.format(drafter=tiny_pair.drafter, target=tiny_pair.target) for a in argv]
    proc = run_without(tmp_path, blocked, *argv)
    assert hint in one_error_line(proc)
    assert not (tmp_path / "out").exists() and not (tmp_path / "m.png").exists()


def test_dspark_export_entry_point_too(tmp_path, tiny_pair):
    proc = run_without(tmp_path, "triton", str(tiny_pair.drafter), "--topk", "16", "-o", "out",
                       entry="dspark_trt.cli.export_entry")
    assert f"pip install -e '{REPO}[kernels]'" in one_error_line(proc)
    assert proc.stderr.rstrip().splitlines()[-1].startswith("FAILED | ")


@pytest.mark.skipif(torch.version.cuda is not None, reason="needs a CPU-only torch build")
@pytest.mark.parametrize("argv", [["generate", "--drafter", "{drafter}", "--target", "{target}", "--device", "cuda",
                                   "--input-ids", "1 2 3", "--max-new-tokens", "2"],
                                  ["bench", "markov", "--device", "cuda", "--vocab", "300", "--topk", "4"]])
def test_device_cuda_on_a_cpu_only_torch_is_one_line(tmp_path, tiny_pair, argv):
    argv = [a.format(drafter=tiny_pair.drafter, target=tiny_pair.target) for a in argv]
    proc = run_without(tmp_path, "", *argv)
    assert "--device cuda: this torch" in one_error_line(proc) and "is a CPU-only build" in proc.stderr
