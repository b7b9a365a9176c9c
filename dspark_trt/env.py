"""``collect_env()``: the versions a bug report needs (Python, torch, ONNX stack, Triton, Numba, TensorRT, GPU).

Versions come from package metadata where possible, so the report is cheap and works when a package is
installed but broken (the PyPI ``tensorrt`` stub, for instance, installs but fails to import: we say so).
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import platform
import shutil
import subprocess
import sys

__all__ = ["collect_env", "format_env", "tensorrt_status"]

PACKAGES = ("torch", "transformers", "safetensors", "numpy", "onnx", "onnxscript", "onnxruntime",
            "polygraphy", "triton", "numba", "tensorrt", "tensorrt-rtx", "matplotlib")


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def tensorrt_status(module: str = "tensorrt") -> str:
    """'<version>' when importable, 'not installed', or 'installed but not importable (<reason>)'."""
    if importlib.util.find_spec(module) is None:
        return "not installed"
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # the PyPI stub raises ImportError/OSError/RuntimeError variants
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        return f"installed but not importable ({reason[:120]})"
    return str(getattr(mod, "__version__", "unknown version"))


def _nvcc() -> str | None:
    path = shutil.which("nvcc")
    if not path:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return path
    release = [line for line in out.splitlines() if "release" in line]
    return f"{path} ({release[-1].strip()})" if release else path


def collect_env() -> dict:
    import torch

    from . import __version__

    env: dict = {
        "dspark-trt": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": {name: _version(name) for name in PACKAGES},
        "tensorrt": tensorrt_status("tensorrt"),
        "tensorrt_rtx": tensorrt_status("tensorrt_rtx"),
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "nvcc": _nvcc(),
        "gpus": [],
    }
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(i)
            env["gpus"].append({"index": i, "name": torch.cuda.get_device_name(i), "compute_capability": f"{major}.{minor}"})
        env["cuda_driver"] = _driver_version()
    return env


def _driver_version() -> str | None:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0] if out else None


def format_env(env: dict) -> str:
    rows = [("dspark-trt", env["dspark-trt"]), ("python", env["python"]), ("platform", env["platform"])]
    rows += [(name, version or "not installed") for name, version in env["packages"].items()
             if name not in ("tensorrt", "tensorrt-rtx")]
    rows += [("tensorrt", env["tensorrt"]), ("tensorrt_rtx", env["tensorrt_rtx"]),
             ("torch CUDA build", env["torch_cuda"] or "none (CPU build)"),
             ("CUDA available", str(env["cuda_available"])), ("nvcc", env["nvcc"] or "not found")]
    if env.get("cuda_driver"):
        rows.append(("CUDA driver", env["cuda_driver"]))
    for gpu in env["gpus"]:
        rows.append((f"GPU {gpu['index']}", f"{gpu['name']} (compute capability {gpu['compute_capability']})"))
    if env.get("triton_server_env"):  # added by `dspark env` (serving/environment.py): the managed Triton venv
        server_env = env["triton_server_env"]
        rows.append(("Triton Python env", f"{server_env['path']} ({server_env['state']})"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
