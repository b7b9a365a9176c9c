"""Start and stop a ``tritonserver`` process for a model repository (``dspark serve``, tests, benchmarks).

Which server: a ``tritonserver`` on PATH (NVIDIA's container, a GPU host) when there is one, else the one
PyTriton's wheel bundles, run from the managed server venv (``environment.py``). The bundled binary needs
what PyTriton itself arranges: a scratch copy of ``pytriton/tritonserver`` with the Python backend stub for
this Python version beside ``libtriton_python.so``; ``LD_LIBRARY_PATH`` with the interpreter's LIBDIR (else
the stub loads the system libpython) and the wheel's ``nvidia_pytriton.libs``; the venv's ``bin`` first on
PATH (the stub's embedded interpreter finds its packages from there). model.py imports ``dspark_trt``, but
the stub's interpreter runs isolated (it ignores PYTHONPATH) with the working directory first on
``sys.path``: the server runs in a scratch directory that holds only a link to this ``dspark_trt``, so the
caller's package is the one served, from wherever ``dspark serve`` was started.

``model_control="explicit"`` starts the server with Triton's explicit model control (every model loaded at
start), so that ``load_model`` / ``unload_model`` (the repository API) can restart a model whose Python stub
died: Triton itself never restarts a dead stub and keeps answering ready (``stubs()`` sees it).

``restrict_control=True`` restricts, with Triton's own restricted-API options, the APIs that change or reveal
the server (``RESTRICTED_APIS``: loading and unloading models, the model configurations, shared-memory regions,
trace and log settings) on both HTTP and gRPC to requests carrying a header whose value is a secret made at each
start; this object sends it (``load_model`` / ``unload_model``), anyone else gets 403 (HTTP) or
PERMISSION_DENIED (gRPC). Health, metadata, inference and statistics stay open. The secret is on tritonserver's
command line, which local users can read (they can reach a loopback bind anyway); it never leaves the machine.

Without a ``log_file`` the server's output goes to this process's stderr through a filter that drops the
start-up errors a CPU host always shows (no CUDA driver, no NVML, no DCGM) and says once that they are harmless.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..errors import DSparkTrtError
from .addresses import client_address, is_ipv6, triton_address
from .auth import API_KEY_ENV

__all__ = ["TritonServer", "StubProcess", "free_port", "is_cpu_host_noise", "RESTRICTED_APIS", "CONTROL_HEADER"]

log = logging.getLogger("dspark")
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the directory holding dspark_trt/


#: tritonserver's start-up lines on a host without a GPU: harmless, and printed as errors
CPU_HOST_NOISE = re.compile(r"CudaDriverHelper has not been initialized|Failed to initialize NVML|DCGM unable to start|"
                            r"Unable to allocate pinned system memory|CUDA memory pool disabled|"
                            r"Unable to initialize CUDA|CUDA driver version is insufficient")
CPU_HOST_NOTE = ("(tritonserver's CUDA / NVML / DCGM start-up errors are harmless on a host without a GPU; "
                 "hidden)")


def is_cpu_host_noise(line: str) -> bool:
    return bool(CPU_HOST_NOISE.search(line))


@dataclass(frozen=True)
class StubProcess:
    """A Python-backend stub: one per model instance, a child process of tritonserver."""

    pid: int
    model: str  # the model's directory name
    instance: str  # e.g. dspark_0_0
    alive: bool  # False: exited (a zombie tritonserver never reaps)


def _die_with_parent() -> None:
    """``preexec_fn``: the server gets SIGTERM when the process that started it dies (Linux), even by SIGKILL."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # not Linux: nothing to do
        pass


#: Triton's APIs that only the supervisor may call when ``restrict_control`` is on (the names its
#: --http-restricted-api and --grpc-restricted-protocol take)
RESTRICTED_APIS = ("model-repository", "model-config", "shared-memory", "trace", "logging")
#: the header that carries the supervisor's secret
CONTROL_HEADER = "dspark-control"


def free_port(host: str = "127.0.0.1") -> int:
    name = host.strip("[]")
    with socket.socket(socket.AF_INET6 if is_ipv6(name) else socket.AF_INET) as s:
        s.bind((name, 0))
        return s.getsockname()[1]


@dataclass
class Endpoints:
    host: str  # what HTTP and gRPC bind
    http_port: int
    grpc_port: int
    metrics_port: int
    metrics_host: str | None = None  # what the metrics endpoint binds (default: ``host``)

    def __post_init__(self):
        if self.metrics_host is None:
            self.metrics_host = self.host

    # what a client dials (``host`` is what the server binds; a wildcard bind is dialled at loopback)
    @property
    def http(self) -> str:
        return client_address(self.host, self.http_port)

    @property
    def grpc(self) -> str:
        return client_address(self.host, self.grpc_port)

    @property
    def metrics(self) -> str:
        return f"http://{client_address(self.metrics_host, self.metrics_port)}/metrics"


class TritonServer:
    """A tritonserver process serving ``repository``; a context manager (start on enter, stop on exit).

    Args:
        repository: the model repository (``dspark triton-repo``).
        http_port, grpc_port, metrics_port (*optional*): default: free ports.
        host (str, defaults to 127.0.0.1): the address the HTTP and gRPC endpoints bind.
        metrics_host (*optional*): the address the metrics endpoint binds (default: ``host``).
        executable (*optional*): a tritonserver binary; default: PATH, else PyTriton's bundled one.
        log_file (*optional*): where the server's output goes (default: this process's stderr, filtered).
        model_control (str, defaults to "none"): "explicit" allows ``load_model`` / ``unload_model``.
        exit_timeout (int, defaults to 30): seconds the server drains requests when stopped.
        restrict_control (bool, defaults to False): ``RESTRICTED_APIS`` answer only this object (see above).
    """

    def __init__(self, repository: str | Path, *, http_port: int | None = None, grpc_port: int | None = None,
                 metrics_port: int | None = None, host: str = "127.0.0.1", metrics_host: str | None = None,
                 executable: str | None = None, log_file: str | Path | None = None, verbose: int = 0,
                 model_control: str = "none", exit_timeout: int = 30, restrict_control: bool = False):
        self.repository = Path(repository).resolve()
        if not (self.repository.is_dir() and any(self.repository.glob("*/config.pbtxt"))):
            raise DSparkTrtError(f"{repository} is not a Triton model repository (no */config.pbtxt); write one "
                                 f"with `dspark triton-repo`")
        metrics_host = host if metrics_host is None else metrics_host
        ports = [p if p else free_port(h) for p, h in ((http_port, host), (grpc_port, host),
                                                       (metrics_port, metrics_host))]
        self.endpoints = Endpoints(host, *ports, metrics_host=metrics_host)
        # the supervisor's secret for the restricted APIs (one per object: a restart keeps it)
        self._control = secrets.token_urlsafe(32) if restrict_control else None
        self.executable = executable or shutil.which("tritonserver")
        self.log_file = Path(log_file) if log_file else None
        self.verbose = verbose
        if model_control not in ("none", "explicit"):
            raise DSparkTrtError(f"model_control must be 'none' or 'explicit', got {model_control!r}")
        self.model_control, self.exit_timeout = model_control, int(exit_timeout)
        self.process: subprocess.Popen | None = None
        self._pump: threading.Thread | None = None
        self._scratch: Path | None = None
        self._workdir: Path | None = None
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
        env.pop(API_KEY_ENV, None)  # the front end's keys: nothing tritonserver or the model needs
        e = self.endpoints
        cmd += ["--model-repository", str(self.repository), "--http-address", triton_address(e.host, "http"),
                "--grpc-address", triton_address(e.host, "grpc"),
                "--metrics-address", triton_address(e.metrics_host, "metrics"), "--http-port", str(e.http_port),
                "--grpc-port", str(e.grpc_port), "--metrics-port", str(e.metrics_port),
                "--exit-timeout-secs", str(self.exit_timeout), "--strict-readiness", "true"]
        if self._control is not None:
            rule = f"{','.join(RESTRICTED_APIS)}:{CONTROL_HEADER}={self._control}"
            cmd += ["--http-restricted-api", rule, "--grpc-restricted-protocol", rule]
        if self.model_control == "explicit":
            cmd += ["--model-control-mode", "explicit", "--load-model", "*"]
        if self.verbose:
            cmd += ["--log-verbose", str(self.verbose)]
        return cmd, env

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self, timeout: float = 300.0) -> "TritonServer":
        """Start the server and wait until it and every model are ready; a one-line error otherwise."""
        cmd, env = self.command()
        self._workdir = Path(tempfile.mkdtemp(prefix="dspark-tritonserver-cwd-"))
        (self._workdir / "dspark_trt").symlink_to(PACKAGE_ROOT / "dspark_trt", target_is_directory=True)
        if self.log_file is not None:
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            self._log_handle = out = open(self.log_file, "ab")
        else:
            out = subprocess.PIPE
        self.process = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                        preexec_fn=_die_with_parent, cwd=self._workdir)
        if self.log_file is None:
            self._pump = threading.Thread(target=self._forward_output, args=(self.process.stdout,),
                                          name="tritonserver-output", daemon=True)
            self._pump.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code = self.process.returncode
                self._kill_group()
                self._cleanup()
                raise DSparkTrtError(f"tritonserver exited with code {code} before it was ready; "
                                     f"see {self.log_file or 'its output above'}")
            if self.ready():
                return self
            time.sleep(0.25)
        self.stop()
        raise DSparkTrtError(f"tritonserver was not ready after {timeout:.0f} s; see {self.log_file or 'its output'}")

    def _forward_output(self, stream) -> None:
        """Copy the server's output to stderr, line by line, without the CPU-host start-up noise."""
        noted = False
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            if is_cpu_host_noise(line):
                if not noted:
                    sys.stderr.write(CPU_HOST_NOTE + "\n")
                    noted = True
                continue
            sys.stderr.write(line)
            sys.stderr.flush()
        stream.close()

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.endpoints.http}/v2/health/ready", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    # -- models: readiness, stubs, the repository API (explicit model control) -------------------------------
    def model_ready(self, model: str) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.endpoints.http}/v2/models/{model}/ready", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stubs(self) -> list[StubProcess]:
        """The Python-backend stub processes of this server (Linux ``/proc``; empty elsewhere)."""
        if self.process is None or not os.path.isdir("/proc"):
            return []
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                fields = stat.rsplit(")", 1)[1].split()
                if int(fields[1]) != self.process.pid or not stat.split("(", 1)[1].startswith("triton_python"):
                    continue
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
            model_py = Path(argv[1].decode(errors="replace")) if len(argv) > 1 else Path()
            instance = argv[8].decode(errors="replace") if len(argv) > 8 else ""
            found.append(StubProcess(int(entry), model_py.parent.parent.name, instance, fields[0] not in "ZX"))
        return found

    def _repository(self, model: str, action: str, timeout: float) -> None:
        url = f"http://{self.endpoints.http}/v2/repository/models/{model}/{action}"
        headers = {"Content-Type": "application/json"}
        if self._control is not None:
            headers[CONTROL_HEADER] = self._control
        request = urllib.request.Request(url, data=b"{}", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout):
                return
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")
            raise DSparkTrtError(f"tritonserver could not {action} model {model!r}: {detail}") from None
        except (urllib.error.URLError, OSError) as e:
            raise DSparkTrtError(f"tritonserver did not answer the {action} of model {model!r}: {e}") from None

    def unload_model(self, model: str, timeout: float = 60.0) -> None:
        self._repository(model, "unload", timeout)

    def load_model(self, model: str, timeout: float = 900.0) -> None:
        """Load (or load again, after ``unload_model``) a model; returns when it is ready or failed."""
        self._repository(model, "load", timeout)

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM, wait (the server drains for its exit timeout), SIGKILL after ``timeout`` (default: the exit
        timeout + 10 s); returns the exit code."""
        timeout = self.exit_timeout + 10.0 if timeout is None else timeout
        code = None
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                code = self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("tritonserver did not stop within %.0f s; killing it", timeout)
                self._kill_group()
                code = self.process.wait()
        elif self.process is not None:
            code = self.process.returncode
        if self.process is not None:
            self._kill_group()  # what a crashed server left: its orphaned stubs
        self._cleanup()
        return code

    def _kill_group(self) -> None:
        """SIGKILL the server's process group (its own session), the server and its stubs: a server that crashed
        leaves its Python stubs running, and they hold its sockets (a restart on the same ports could not listen)
        and any client connection they inherited (a call to the dead server would wait for its whole timeout)."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # none left

    def _cleanup(self) -> None:
        if self._pump is not None:
            self._pump.join(5)
            self._pump = None
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None
        for attr in ("_scratch", "_workdir"):
            if getattr(self, attr) is not None:
                shutil.rmtree(getattr(self, attr), ignore_errors=True)  # the link, not what it points to
                setattr(self, attr, None)

    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
