"""Start and stop a ``tritonserver`` process for a model repository (``dspark serve``, tests, benchmarks).

Which server: a ``tritonserver`` on PATH (NVIDIA's container, a GPU host) when there is one, else the one
PyTriton's wheel bundles, run from the managed server venv (``environment.py``). The bundled binary needs
what PyTriton itself arranges: a scratch copy of ``pytriton/tritonserver`` with the Python backend stub for
this Python version beside ``libtriton_python.so``; ``LD_LIBRARY_PATH`` with the interpreter's LIBDIR (else
the stub loads the system libpython) and the wheel's ``nvidia_pytriton.libs``; the venv's ``bin`` first on
PATH (the stub's embedded interpreter finds its packages from there); this package's source directory on
PYTHONPATH (model.py imports ``dspark_trt``).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..errors import DSparkTrtError

__all__ = ["TritonServer", "free_port"]

log = logging.getLogger("dspark")
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the directory holding dspark_trt/


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class Endpoints:
    host: str
    http_port: int
    grpc_port: int
    metrics_port: int

    @property
    def http(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def grpc(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"


class TritonServer:
    """A tritonserver process serving ``repository``; a context manager (start on enter, stop on exit).

    Args:
        repository: the model repository (``dspark triton-repo``).
        http_port, grpc_port, metrics_port (*optional*): default: free ports.
        host (str, defaults to 127.0.0.1): the address every endpoint binds.
        executable (*optional*): a tritonserver binary; default: PATH, else PyTriton's bundled one.
        log_file (*optional*): where the server's output goes (default: inherited stdout/stderr).
    """

    def __init__(self, repository: str | Path, *, http_port: int | None = None, grpc_port: int | None = None,
                 metrics_port: int | None = None, host: str = "127.0.0.1", executable: str | None = None,
                 log_file: str | Path | None = None, verbose: int = 0):
        self.repository = Path(repository).resolve()
        if not (self.repository.is_dir() and any(self.repository.glob("*/config.pbtxt"))):
            raise DSparkTrtError(f"{repository} is not a Triton model repository (no */config.pbtxt); write one "
                                 f"with `dspark triton-repo`")
        ports = [p if p else free_port(host) for p in (http_port, grpc_port, metrics_port)]
        self.endpoints = Endpoints(host, *ports)
        self.executable = executable or shutil.which("tritonserver")
        self.log_file = Path(log_file) if log_file else None
        self.verbose = verbose
        self.process: subprocess.Popen | None = None
        self._scratch: Path | None = None
        self._log_handle = None

    # -- the command line ------------------------------------------------------------------------------
    def _bundled(self) -> tuple[list[str], dict]:
        """Command and environment for PyTriton's bundled tritonserver (scratch copy, managed venv)."""
        from .environment import server_environment

        venv = server_environment()
        info = venv.query()
        site = Path(info["purelib"])
        source = site / "pytriton" / "tritonserver"
        stub = source / "python_backend_stubs" / info["version"] / "triton_python_backend_stub"
        if not stub.is_file():
            raise DSparkTrtError(f"PyTriton has no Python backend stub for Python {info['version']} ({stub}); use "
                                 f"Python 3.8–3.13 or a tritonserver on PATH")
        self._scratch = Path(tempfile.mkdtemp(prefix="dspark-tritonserver-"))
        copy = self._scratch / "tritonserver"
        shutil.copytree(source, copy, ignore=shutil.ignore_patterns("python_backend_stubs"))
        shutil.copy2(stub, copy / "backends" / "python" / "triton_python_backend_stub")
        env = dict(os.environ)
        libs = [info["libdir"], str(site / "nvidia_pytriton.libs")]
        env["LD_LIBRARY_PATH"] = os.pathsep.join(libs + [p for p in [env.get("LD_LIBRARY_PATH")] if p])
        env["PATH"] = os.pathsep.join([str(venv.root / "bin"), env.get("PATH", "")])
        env["VIRTUAL_ENV"] = str(venv.root)
        env["PYTHONPATH"] = str(PACKAGE_ROOT)  # nothing of the caller's environment (numpy 2) leaks in
        env.pop("PYTHONHOME", None)
        cmd = [str(copy / "bin" / "tritonserver"), "--backend-directory", str(copy / "backends"),
               "--cache-directory", str(copy / "caches")]
        return cmd, env

    def command(self) -> tuple[list[str], dict]:
        if self.executable:
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
            cmd = [self.executable]
        else:
            cmd, env = self._bundled()
        e = self.endpoints
        cmd += ["--model-repository", str(self.repository), "--http-address", e.host, "--grpc-address", e.host,
                "--metrics-address", e.host, "--http-port", str(e.http_port), "--grpc-port", str(e.grpc_port),
                "--metrics-port", str(e.metrics_port), "--exit-timeout-secs", "30", "--strict-readiness", "true"]
        if self.verbose:
            cmd += ["--log-verbose", str(self.verbose)]
        return cmd, env

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self, timeout: float = 300.0) -> "TritonServer":
        """Start the server and wait until it and every model are ready; a one-line error otherwise."""
        cmd, env = self.command()
        out = None
        if self.log_file is not None:
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            self._log_handle = out = open(self.log_file, "ab")
        self.process = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT if out else None,
                                        start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code = self.process.returncode
                self._cleanup()
                raise DSparkTrtError(f"tritonserver exited with code {code} before it was ready; "
                                     f"see {self.log_file or 'its output above'}")
            if self.ready():
                return self
            time.sleep(0.25)
        self.stop()
        raise DSparkTrtError(f"tritonserver was not ready after {timeout:.0f} s; see {self.log_file or 'its output'}")

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.endpoints.http}/v2/health/ready", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, wait (the server drains), SIGKILL after ``timeout``; returns the exit code."""
        code = None
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                code = self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("tritonserver did not stop within %.0f s; killing it", timeout)
                os.killpg(self.process.pid, signal.SIGKILL)
                code = self.process.wait()
        elif self.process is not None:
            code = self.process.returncode
        self._cleanup()
        return code

    def _cleanup(self) -> None:
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
