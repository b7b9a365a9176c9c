"""``dspark serve SOURCE``: from a checkpoint, an export or a model repository to a running OpenAI-compatible
endpoint, supervised.

    source = resolve_source("drafter/", target="target/")      # or an export directory, or a repository
    with Deployment(source, ServeOptions(openai_port=9000)) as d:  # export (cached), repository, servers
        d.watch(stop_event)                                      # until stopped; restarts a dead model

What runs: ``tritonserver`` (``server.py``) with explicit model control on a repository written by
``repository.write_model_repository`` (in a scratch directory, removed at the end) — or the given one —, its
endpoints on loopback unless ``triton_host`` publishes them and its control APIs restricted to this supervisor
(``restrict_control``) wherever they listen; and the OpenAI front end (``openai_app.py``) on a thread of this process. A checkpoint is exported first,
through the cache of ``export_cache.py`` (keyed by content digest and export options).

Supervision (``watch``): Triton never restarts a Python-backend stub that died and keeps answering ready,
so the stub processes are watched directly (``TritonServer.stubs``). When one of the served model's stubs
dies, the front end turns not ready (requests in flight are answered 503), one line says so, and the model
is unloaded and loaded again through Triton's repository API. tritonserver itself dying (its Python backend
aborts when a stub is killed holding the backend's shared-memory lock) is handled the same way: not ready, one
line, its orphaned stubs killed, the server started again on the same ports behind the same front end. With
``restart=False`` either ends the deployment with an error instead.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import DSparkTrtError
from .settings import ServeOptions

__all__ = ["Source", "Deployment", "resolve_source", "frontend_config", "default_dtype", "triton_host_of"]

log = logging.getLogger("dspark")

MODEL_NAME = "dspark"


@dataclass(frozen=True)
class Source:
    """What ``dspark serve`` was given: ``kind`` is "checkpoint", "export" or "repository"."""

    kind: str
    path: Path
    target: Path | None = None  # checkpoint: the target directory


def resolve_source(path: str | Path, *, target: str | Path | None = None) -> Source:
    """Classify ``path``: a model repository (``*/config.pbtxt``), an export (``manifest.json``), or a drafter
    checkpoint (``config.json``; its target from ``target`` or the one it records)."""
    from ..loader import resolve_target_dir

    p = Path(path)
    if not p.is_dir():
        raise DSparkTrtError(f"{path} is not a directory: pass a drafter checkpoint, an export directory "
                             f"(dspark-export) or a model repository (dspark triton-repo)")
    if any(p.glob("*/config.pbtxt")):
        kind = "repository"
    elif (p / "manifest.json").is_file() and (p / "onnx").is_dir():
        kind = "export"
    elif (p / "config.json").is_file():
        kind = "checkpoint"
    else:
        raise DSparkTrtError(f"{path} is not a Triton model repository (no */config.pbtxt), an export (no "
                             f"manifest.json) or a drafter checkpoint (no config.json); pass one of those")
    if target is not None and kind != "checkpoint":
        raise DSparkTrtError(f"--target goes with a drafter checkpoint; {path} is an {kind} directory, which "
                             f"already names its target")
    if kind == "checkpoint":
        found = resolve_target_dir(p, target)
        if found is None:
            raise DSparkTrtError(f"{path} is a drafter checkpoint that names no target found here: pass --target "
                                 f"DIR (the target model's directory)")
        if not (Path(found) / "config.json").is_file():
            raise DSparkTrtError(f"the target {found} has no config.json: pass the target model's directory")
        return Source(kind, p, Path(found))
    if kind == "export":
        from ..artifact.export_dir import ExportDir

        if not ExportDir(p).has_target:
            raise DSparkTrtError(f"the export {path} has no target graph (exported with --skip-target or without "
                                 f"--target): re-export it with --target DIR, or serve the checkpoint")
    return Source(kind, p)


def default_dtype() -> str:
    """bf16 where TensorRT runs the engines (a GPU host), fp32 on a CPU host (onnxruntime)."""
    from .served_decoder import have_tensorrt

    return "bf16" if have_tensorrt() else "fp32"


def _served_model(repository: Path, wanted: str | None) -> str:
    models = sorted(p.parent.name for p in repository.glob("*/config.pbtxt"))
    if wanted is not None:
        if wanted not in models:
            raise DSparkTrtError(f"the repository {repository} has no model {wanted!r} (it has {', '.join(models)}); "
                                 f"pass --model NAME")
        return wanted
    if MODEL_NAME in models:
        return MODEL_NAME
    if len(models) == 1:
        return models[0]
    raise DSparkTrtError(f"the repository {repository} holds several models ({', '.join(models)}); pass --model NAME "
                         f"for the OpenAI front end")


def triton_host_of(options: ServeOptions) -> str:
    """The address Triton's HTTP and gRPC endpoints bind: ``--triton-host``, else loopback in ``--host``'s family
    (whatever ``--host`` says: publishing Triton is a choice of its own)."""
    from .addresses import loopback

    return options.triton_host or loopback(options.host)


def frontend_config(repository: str | Path, model: str, grpc_url: str, *, served_model_name: str | None = None,
                    chat_template: str | None = None, api_keys: tuple[str, ...] = ()):
    """The front end's view of a repository's model: its tokenizer directory and context limit, read from
    ``config.pbtxt`` and the export's manifest (no model is loaded)."""
    from ..jsonfile import read_json
    from .openai_app import FrontendConfig
    from .repository import read_model_config
    from .settings import ModelSettings

    model_dir = Path(repository) / model
    config = read_model_config(model_dir / "config.pbtxt")
    params = {k: v.string_value for k, v in config.parameters.items()}
    settings = ModelSettings.from_parameters(params).resolved(model_dir / "1")
    tokenizer_dir, limit = None, settings.max_context
    if settings.export_dir:
        from ..artifact.export_dir import ExportDir

        export = ExportDir(settings.export_dir)
        tokenizer_dir = export.tokenizer_dir
        limit = limit or (export.manifest.get("target") or {}).get("max_context") or export.manifest.get("max_context")
    elif settings.target_dir:
        tokenizer_dir = Path(settings.target_dir)
        raw = read_json(Path(settings.target_dir) / "config.json", missing=f"no config.json in {settings.target_dir}",
                        fix="pass the target model's directory")
        limit = limit or raw.get("max_position_embeddings")
    return FrontendConfig(triton_grpc=grpc_url, model=model, served_model_name=served_model_name,
                          tokenizer_dir=tokenizer_dir, chat_template=chat_template,
                          max_context=int(limit) if limit else None, api_keys=tuple(api_keys))


class Deployment:
    """Export (cached) → repository → tritonserver → OpenAI front end, and their supervision.

    ``start()`` brings everything up (``DSparkTrtError`` with one line when something cannot start; what was
    started is stopped again), ``watch()`` supervises until told to stop, ``stop()`` stops everything and
    removes the scratch repository. A context manager: ``start`` on enter, ``stop`` on exit.
    """

    def __init__(self, source: Source, options: ServeOptions | None = None, *, say: Callable[[str], None] = print):
        from .openai_app import Readiness

        self.source, self.options, self.say = source, options or ServeOptions(), say
        self.readiness = Readiness()
        self.export_dir: Path | None = None
        self.reused_export: bool | None = None
        self.repository: Path | None = None
        self.model = MODEL_NAME
        self.server = None
        self.frontend = None
        self.restarts = 0
        self._scratch: Path | None = None
        self._stubs: set[int] = set()

    # -- bring up ----------------------------------------------------------------------------------------
    def prepare(self) -> Path:
        """Export if needed and write the repository; returns the repository."""
        src, opts = self.source, self.options
        if src.kind == "repository":
            if opts.repository_flags:
                raise DSparkTrtError(f"{', '.join(opts.repository_flags)} set(s) how the repository is written, but "
                                     f"{src.path} is a repository already: rewrite it with dspark triton-repo (same "
                                     f"flags), or serve its export directory")
            self.repository = src.path.resolve()
            self.model = _served_model(self.repository, opts.model)
            return self.repository
        if src.kind == "checkpoint":
            from ..export.pipeline import ExportOptions
            from .served_decoder import have_tensorrt
            from .export_cache import cached_export

            options = ExportOptions(topk=opts.topk, dtype=opts.dtype or default_dtype(),
                                    engine="tensorrt" if have_tensorrt() else "none", max_context=opts.max_context)
            cached = cached_export(src.path, target_dir=src.target, options=options, cache_dir=opts.cache_dir)
            self.export_dir, self.reused_export = cached.path, cached.reused
            self.say(f"{'reusing the cached export' if cached.reused else 'exported'} {cached.path}")
        else:
            self.export_dir = src.path.resolve()
        from .repository import write_model_repository

        self._scratch = Path(tempfile.mkdtemp(prefix="dspark-serve-"))
        self.repository = write_model_repository(self._scratch / "repo", export_dir=self.export_dir,
                                                 model_name=MODEL_NAME, **opts.writer_options())
        self.model = MODEL_NAME
        return self.repository

    def start(self) -> "Deployment":
        from .openai_app import OpenAIFrontend
        from .server import TritonServer

        opts = self.options
        try:
            if self.repository is None:
                self.prepare()
            triton_host = triton_host_of(opts)
            self.server = TritonServer(self.repository, http_port=opts.http_port or None,
                                       grpc_port=opts.grpc_port or None, metrics_port=opts.metrics_port or None,
                                       host=triton_host, metrics_host=opts.metrics_host or triton_host,
                                       executable=opts.tritonserver, log_file=opts.log_file,
                                       model_control="explicit", exit_timeout=opts.exit_timeout,
                                       restrict_control=True)
            if opts.openai_port is not None:  # the port first: a busy one fails before the server starts
                config = frontend_config(self.repository, self.model, self.server.endpoints.grpc,
                                         served_model_name=opts.served_model_name, chat_template=opts.chat_template,
                                         api_keys=opts.api_keys)
                self.frontend = OpenAIFrontend(config, host=opts.host, port=opts.openai_port,
                                               readiness=self.readiness, access_log=opts.access_log,
                                               ssl_keyfile=opts.ssl_keyfile, ssl_certfile=opts.ssl_certfile).bind()
            self.server.start(timeout=opts.startup_timeout)
            self._stubs = self._live_stubs()
            if self.frontend is not None:
                self.frontend.start()
        except BaseException:
            self.stop()
            raise
        return self

    # -- supervision -------------------------------------------------------------------------------------
    def _live_stubs(self) -> set[int]:
        return {s.pid for s in self.server.stubs() if s.alive and s.model == self.model}

    def dead_stubs(self) -> list[int]:
        """Stubs of the served model that were alive at the last check and are not now."""
        alive = self._live_stubs()
        return sorted(self._stubs - alive)

    def reload_model(self) -> None:
        """Unload and load the served model through Triton's repository API (a fresh stub per instance)."""
        self.server.unload_model(self.model)
        self.server.load_model(self.model, timeout=self.options.reload_timeout)

    def restart_server(self) -> None:
        """Stop tritonserver at once (a dead stub's model would hold its exit for the whole exit timeout) and
        start it again on the same ports."""
        self.server.stop(timeout=5)
        self.server.start(timeout=self.options.startup_timeout)

    def _restart(self, stop: threading.Event) -> float | None:
        """Reload the model, else restart the server; the seconds it took, None when ``stop`` came first.
        ``DSparkTrtError`` when neither worked."""
        begin = time.perf_counter()
        failure: list[Exception] = []

        def reload():
            try:
                self.reload_model()
            except DSparkTrtError as e:
                failure.append(e)

        died = self.server.process.poll() is not None  # before the reload: ``watch`` said so
        if not died:
            worker = threading.Thread(target=reload, name="dspark-reload", daemon=True)
            worker.start()
            while worker.is_alive():  # an HTTP call to Triton: left behind if the deployment is stopped meanwhile
                if stop.wait(0.2):
                    return None
                if (code := self.server.process.poll()) is not None:  # the call is left behind; the restart ends it
                    self.say(f"tritonserver died (exit code {code}) while the model reloaded; restarting tritonserver")
                    died = True
                    break
            else:
                if failure:
                    self.say(f"reloading the model failed ({failure[0]}); restarting tritonserver")
        if died or failure:
            self.restart_server()
        self._stubs = self._live_stubs()
        self.restarts += 1
        return time.perf_counter() - begin

    def watch(self, stop: threading.Event, *, restart: bool = True, interval: float = 0.5) -> int | None:
        """Supervise until ``stop`` is set (returns None) or the deployment fails (returns an exit status)."""
        while not stop.wait(interval):
            code = self.server.process.poll()
            if code is not None:  # e.g. Triton's Python backend aborts when a stub dies holding its shared-memory lock
                what = f"tritonserver died (exit code {code}); not ready"
                self.readiness.mark_down(f"tritonserver died (exit code {code})")
            else:
                dead = self.dead_stubs()
                if not dead:
                    continue
                pids = ", ".join(map(str, dead))
                what = f"the model {self.model!r} stopped: its Triton Python stub (pid {pids}) died; not ready"
                self.readiness.mark_down(f"the model's process died (pid {pids})")
            if not restart:
                self.say(f"{what}; --no-restart: stopping")
                return 1
            self.say(f"{what}; restarting it")
            try:
                seconds = self._restart(stop)
            except DSparkTrtError as e:
                self.say(f"restarting the model failed ({e}); stopping")
                return 1
            if seconds is None:
                return None
            self.readiness.mark_up()
            deadline = time.monotonic() + 10.0  # the front end sees Triton ready (its poll, a reconnect)
            while self.frontend is not None and not self.readiness.ready and time.monotonic() < deadline:
                if stop.wait(0.1):
                    return None
            self.say(f"the model {self.model!r} is serving again (restarted in {seconds:.1f} s)")
        return None

    # -- drain ---------------------------------------------------------------------------------------------
    def drain(self, timeout: float, cut: threading.Event | None = None, *, interval: float = 0.05) -> int:
        """The graceful part of a stop: readiness false at once (load balancers and Kubernetes stop routing here),
        new requests refused with 503 and Retry-After, and up to ``timeout`` seconds for the requests in flight
        (streams included) to end, or until ``cut`` is set. Returns how many were still in flight (0: drained).
        Without a front end there is nothing to wait for here: tritonserver's own exit drains (--exit-timeout)."""
        self.readiness.start_drain()
        if self.frontend is None:
            return 0
        begin = time.monotonic()
        left = self.frontend.in_flight()
        self.say(f"draining: {left} request(s) in flight get up to {timeout:g} s; new requests are refused (503)")
        while left and time.monotonic() - begin < timeout and not (cut is not None and cut.is_set()):
            time.sleep(interval)
            left = self.frontend.in_flight()
        if left:
            self.say(f"drain ended after {time.monotonic() - begin:.1f} s with {left} request(s) still in flight: "
                     f"they are cut")
        else:
            self.say(f"drained in {time.monotonic() - begin:.1f} s")
        return left

    # -- stop ----------------------------------------------------------------------------------------------
    def stop(self) -> int | None:
        """Stop the front end and the server, remove the scratch repository; returns the server's exit code."""
        code = None
        if self.frontend is not None:
            self.frontend.stop()
            self.frontend = None
        if self.server is not None:
            code = self.server.stop()
            self.server = None
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
        return code

    def __enter__(self) -> "Deployment":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
