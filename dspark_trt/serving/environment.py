"""The server-side Python environment: a managed venv that tritonserver's Python backend runs in.

Why a separate environment: the ``tritonserver`` that PyTriton's wheel (``nvidia-pytriton``) bundles runs
the Python backend stub with an embedded interpreter built against numpy < 2 (with numpy 2 the stub aborts
on the first BYTES tensor), while the rest of dspark-trt may need numpy >= 2. So ``dspark serve`` builds,
once, a venv with ``numpy<2``, ``nvidia-pytriton`` and the runtime's dependencies pinned to the versions of
the calling environment (same torch, transformers, onnxruntime), and points the stub at it. dspark_trt
itself is not installed there: the server process gets this package's source directory on PYTHONPATH.

The venv lives under the cache root (``dspark_trt.cache``: ``$DSPARK_TRT_CACHE``, else
``$XDG_CACHE_HOME/dspark-trt``, else ``~/.cache/dspark-trt``) in a directory keyed by the Python version and the pins, is built under a file lock (parallel test workers build it once), and is
marked complete only when pip succeeded; an interrupted build is removed and redone.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

from ..cache import cache_root
from ..errors import DSparkTrtError

__all__ = ["ServerEnvironment", "server_environment", "server_environment_root", "server_environment_status",
           "server_requirements"]

log = logging.getLogger("dspark")

#: what the server venv needs besides the calling environment's pinned runtime packages
BASE_REQUIREMENTS = ("numpy<2", "nvidia-pytriton>=0.7")
#: runtime packages pinned to the calling environment's versions when installed there
MIRRORED = ("torch", "transformers", "safetensors", "tokenizers", "onnxruntime", "onnx", "onnx-ir", "filelock")
COMPLETE = ".dspark-complete"
#: what a first build costs (measured: a fresh build on a CPU host with a warm pip cache)
SIZE_NOTE = "about 1.5 GB, once: about a minute, several on a slow host or link"


def server_requirements() -> list[str]:
    """pip requirement strings for the server venv (pins follow the calling environment)."""
    reqs = list(BASE_REQUIREMENTS)
    for name in MIRRORED:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        reqs.append(f"{name}=={version}")
    return reqs


@dataclass(frozen=True)
class ServerEnvironment:
    """A built server venv and what launching tritonserver from it needs."""

    root: Path  # the venv

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    def query(self) -> dict:
        """Paths inside the venv: site-packages, the interpreter's LIBDIR, its X.Y version."""
        code = ("import json, sys, sysconfig; print(json.dumps({'purelib': sysconfig.get_paths()['purelib'], "
                "'libdir': sysconfig.get_config_var('LIBDIR'), 'version': '%d.%d' % sys.version_info[:2]}))")
        out = subprocess.run([str(self.python), "-c", code], check=True, capture_output=True, text=True).stdout
        return json.loads(out)


def _key(requirements: list[str]) -> str:
    text = "\n".join([sys.version, sys.base_prefix, *requirements])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def server_environment_root(reqs: list[str] | None = None) -> Path:
    """Where the managed venv is (or will be): ``$DSPARK_TRITON_ENV``, else a directory under the cache root."""
    reqs = server_requirements() if reqs is None else reqs
    return Path(os.environ.get("DSPARK_TRITON_ENV") or cache_root() / f"triton-env-py{sys.version_info[0]}"
                f"{sys.version_info[1]}-{_key(reqs)}")


def server_environment_status() -> dict:
    """What ``dspark env`` reports of the managed venv: where it is, whether it is built, and when it is built
    (a ``tritonserver`` on PATH needs none)."""
    root = server_environment_root()
    on_path = shutil.which("tritonserver")
    if on_path:
        state = f"not needed (tritonserver on PATH: {on_path})"
    elif (root / COMPLETE).is_file():
        state = "built"
    else:
        state = (f"not built: the first `dspark serve` builds it ({SIZE_NOTE}); `--tritonserver PATH` uses an "
                 f"existing tritonserver instead, $DSPARK_TRITON_ENV a venv of your own")
    return {"path": str(root), "state": state}


def server_environment(*, root: str | Path | None = None, build: bool = True) -> ServerEnvironment:
    """The managed server venv, built on first use (minutes, once; later calls return at once)."""
    from filelock import FileLock

    reqs = server_requirements()
    root = Path(root) if root is not None else server_environment_root(reqs)
    env = ServerEnvironment(root)
    if (root / COMPLETE).is_file():
        return env
    if not build:
        raise DSparkTrtError(f"the Triton server environment {root} is not built; run `dspark serve` once "
                             f"(it builds it) or drop --no-build")
    root.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root) + ".lock"):
        if (root / COMPLETE).is_file():
            return env
        _build(root, reqs)
    return env


def _build(root: Path, reqs: list[str]) -> None:
    if root.exists():
        shutil.rmtree(root)
    log.warning("building the Triton server environment in %s (once; a few minutes): %s", root, " ".join(reqs))
    start = time.perf_counter()
    base = getattr(sys, "_base_executable", None) or sys.executable
    try:
        subprocess.run([base, "-m", "venv", str(root)], check=True, capture_output=True, text=True)
        pip = [str(root / "bin" / "python"), "-m", "pip", "install", "--progress-bar", "off",
               "--disable-pip-version-check", "-q", *reqs]
        subprocess.run(pip, check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as e:
        shutil.rmtree(root, ignore_errors=True)
        tail = (e.stderr or e.stdout or "").strip().splitlines()[-1:] or ["(no output)"]
        raise DSparkTrtError(f"building the Triton server environment failed ({tail[0]}); check network access to "
                             f"the package index, or set DSPARK_TRITON_ENV to a venv with {' '.join(reqs)}") from None
    (root / COMPLETE).write_text(json.dumps({"requirements": reqs, "seconds": round(time.perf_counter() - start, 1),
                                             "python": sys.version}) + "\n")
    log.warning("Triton server environment ready in %.0f s", time.perf_counter() - start)


def python_libdir() -> str:
    return sysconfig.get_config_var("LIBDIR")
