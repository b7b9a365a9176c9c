"""Serve a drafter checkpoint, an export or a Triton model repository: tritonserver + an OpenAI-compatible API.

  dspark serve                                  the embedded demo pair (exported once, then cached)
  dspark serve DRAFTER [--target DIR]           a checkpoint: exported on first use, cached by content digest
  dspark serve OUT                              an export directory (dspark-export -o OUT)
  dspark serve REPO                             a model repository (dspark triton-repo)

Prints the endpoints (OpenAI API on --openai-port, default 9000; Triton's HTTP/gRPC/metrics on 8000/8001/8002)
and serves until Ctrl-C (exit 130) or SIGTERM (exit 0); everything it started stops with it. When the model's
process (or tritonserver itself) dies, it says so and restarts it (--no-restart: exits 1). Uses a `tritonserver`
on PATH, else the one bundled with PyTriton, run from a managed Python environment built on first use (see
docs/serving.md).
"""

from __future__ import annotations

import argparse
import os
import signal
import threading

from .common import verify_length

#: flags that change how the repository is written (refused with a ready-made REPO)
REPOSITORY_FLAGS = {"runtime": "--runtime", "device": "--device", "topk": "--topk",
                    "confidence_threshold": "--confidence-threshold", "verify_drafts": "--verify-drafts",
                    "max_batch_size": "--max-batch-size", "max_context": "--max-context", "threads": "--threads",
                    "instances": "--instances", "gpus": "--gpus", "max_queue": "--max-queue"}


def _gpus(text: str) -> list[int]:
    return [int(g) for g in text.split(",") if g.strip()]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", metavar="SOURCE", nargs="?", default=None,
                   help="drafter checkpoint, export directory or model repository (default: the embedded demo pair)")
    p.add_argument("--target", metavar="DIR", default=None,
                   help="the target model of a drafter checkpoint (default: the one the checkpoint records)")
    s = p.add_argument_group("endpoints")
    s.add_argument("--openai-port", type=int, default=9000, help="OpenAI-compatible API port (default 9000; 0 = any "
                   "free port)")
    s.add_argument("--no-openai", action="store_true", help="no OpenAI front end: Triton's endpoints only")
    s.add_argument("--http-port", type=int, default=8000, help="Triton HTTP port (default 8000; 0 = any free port)")
    s.add_argument("--grpc-port", type=int, default=8001, help="Triton gRPC port (default 8001; 0 = any free port)")
    s.add_argument("--metrics-port", type=int, default=8002, help="Triton metrics port (default 8002; 0 = any free "
                   "port)")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for all)")
    s.add_argument("--served-model-name", default=None, metavar="NAME",
                   help="the model name clients send to the OpenAI API (default: the Triton model's, dspark)")
    s.add_argument("--model", default=None, metavar="NAME", help="with a REPO: the model the OpenAI API serves")
    s.add_argument("--chat-template", default=None, metavar="FILE",
                   help="a Jinja chat template for /v1/chat/completions (default: the tokenizer's own)")
    s.add_argument("--access-log", action="store_true", help="log every OpenAI API request")
    m = p.add_argument_group("model (a checkpoint or an export; a REPO has these in its config.pbtxt)")
    m.add_argument("--topk", default=None, metavar="K|off", help="draft top-k (default: the "
                   "checkpoint's)")
    m.add_argument("--dtype", default=None, choices=("fp32", "fp16", "bf16"),
                   help="export dtype of a checkpoint (default: bf16 with TensorRT, fp32 on a CPU host)")
    m.add_argument("--max-context", type=int, default=None, help="prompt + max_tokens limit (default: the target's)")
    m.add_argument("--runtime", choices=("tensorrt", "onnxruntime"), default=None,
                   help="force the runtime (default: tensorrt where importable and the export has engines)")
    m.add_argument("--device", default=None, help="cpu or cuda (default: cuda for tensorrt, else cpu)")
    m.add_argument("--confidence-threshold", type=float, default=None,
                   help="verify only drafts whose confidence is at least this")
    m.add_argument("--verify-drafts", type=verify_length, default=None, metavar="L|auto",
                   help="verify at most L drafts per round ('auto': chosen each round)")
    m.add_argument("--max-batch-size", type=int, default=64, help="requests decoded together (default 64)")
    m.add_argument("--max-queue", type=int, default=None, metavar="N",
                   help="requests allowed to wait for a batch slot; more are refused (HTTP 503; default: no bound)")
    m.add_argument("--instances", type=int, default=1, metavar="N", help="model instances, each its own batch "
                   "(default 1)")
    m.add_argument("--gpus", type=_gpus, default=None, metavar="0,1", help="GPUs the instances are spread over "
                   "(GPU hosts)")
    m.add_argument("--threads", type=int, default=0, help="CPU threads of each model instance (default: library "
                   "default)")
    m.add_argument("--cache-dir", default=None, metavar="DIR",
                   help="where checkpoint exports are cached (default ~/.cache/dspark-trt/serve)")
    r = p.add_argument_group("server")
    r.add_argument("--no-restart", action="store_true", help="exit 1 when the model's process or tritonserver "
                   "dies instead of restarting it")
    r.add_argument("--tritonserver", default=None, metavar="PATH", help="this tritonserver binary")
    r.add_argument("--log-file", default=None, metavar="FILE", help="tritonserver's log (default: this terminal)")
    r.add_argument("--exit-timeout", type=int, default=30, help="seconds tritonserver drains requests when stopped "
                   "(default 30)")
    r.add_argument("--timeout", type=float, default=900, help="seconds to wait for readiness (default 900)")


class _Stopped(BaseException):
    """Raised by the signal handlers while starting (an export or a server start is interrupted)."""

    def __init__(self, code: int):
        self.code = code


def _options(args: argparse.Namespace):
    from pathlib import Path

    from ..errors import DSparkTrtError
    from ..serving.deployment import ServeOptions
    from ..topk import DEFAULT_TOPK, parse_topk

    defaults = {"max_batch_size": 64, "threads": 0, "instances": 1}
    flags = [flag for key, flag in REPOSITORY_FLAGS.items() if getattr(args, key) not in (None, defaults.get(key))]
    template = None
    if args.chat_template is not None:
        try:
            template = Path(args.chat_template).read_text()
        except OSError as e:
            raise DSparkTrtError(f"cannot read the chat template {args.chat_template}: {e.strerror}") from None
    if args.instances < 1:
        raise DSparkTrtError(f"--instances must be >= 1, got {args.instances}")
    if args.max_queue is not None and args.max_queue < 0:
        raise DSparkTrtError(f"--max-queue must be >= 0, got {args.max_queue}")
    topk = DEFAULT_TOPK if args.topk is None else parse_topk(args.topk, zero_is_off=True)
    return ServeOptions(topk=topk, dtype=args.dtype, max_context=args.max_context, cache_dir=args.cache_dir,
                        runtime=args.runtime, device=args.device, confidence_threshold=args.confidence_threshold,
                        verify_drafts=args.verify_drafts, max_batch_size=args.max_batch_size, threads=args.threads,
                        instances=args.instances, gpus=args.gpus, max_queue=args.max_queue, host=args.host,
                        http_port=args.http_port, grpc_port=args.grpc_port, metrics_port=args.metrics_port,
                        openai_port=None if args.no_openai else args.openai_port, tritonserver=args.tritonserver,
                        log_file=args.log_file, exit_timeout=args.exit_timeout, startup_timeout=args.timeout,
                        model=args.model, served_model_name=args.served_model_name, chat_template=template,
                        access_log=args.access_log, repository_flags=flags)


def _announce(d) -> None:
    e, name = d.server.endpoints, d.model
    print(f"tritonserver ready: HTTP http://{e.http} (generate: http://{e.http}/v2/models/{name}/generate), "
          f"gRPC {e.grpc}, metrics {e.metrics}", flush=True)
    if d.frontend is not None:
        c = d.frontend.config
        chat = "chat: yes" if d.frontend.chat_available else "chat: no (no tokenizer chat template; --chat-template)"
        print(f"OpenAI API ready: {d.frontend.url} (model {c.name!r}, context {c.max_context}, {chat})", flush=True)
    print("serving; Ctrl-C stops everything", flush=True)


def run(args: argparse.Namespace) -> int:
    from ..serving.deployment import Deployment, resolve_source

    options = _options(args)
    if args.source is None:
        if args.target is not None:
            from ..errors import DSparkTrtError

            raise DSparkTrtError("--target needs a drafter checkpoint SOURCE")
        from ..testing.embedded import embedded_pair

        drafter, target = embedded_pair()
        source = resolve_source(drafter, target=target)
    else:
        source = resolve_source(args.source, target=args.target)
    if source.kind != "checkpoint" and (args.dtype or args.cache_dir):
        from ..errors import DSparkTrtError

        raise DSparkTrtError(f"--dtype and --cache-dir apply to exporting a checkpoint; {args.source} is an "
                             f"{source.kind} directory")

    deployment = Deployment(source, options)
    stop = threading.Event()
    state = {"serving": False, "code": 0, "stopping": False}

    def on_signal(signum, frame):
        code = 130 if signum == signal.SIGINT else 0
        if state["stopping"]:  # a second signal while stopping: do not wait for the drain
            server = deployment.server
            if server is not None and server.process is not None and server.process.poll() is None:
                os.killpg(server.process.pid, signal.SIGKILL)
            return
        state["code"] = code
        if state["serving"]:
            stop.set()
        else:
            raise _Stopped(code)

    # our own handlers: a SIGINT ignored by the parent (a script's background job) must still stop us
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    status = None
    try:
        try:
            deployment.start()
            _announce(deployment)
            state["serving"] = True
            status = deployment.watch(stop, restart=not args.no_restart)
        except _Stopped as e:
            state["code"] = e.code
        finally:
            state["stopping"] = True
            code = deployment.stop()
        if code is not None:
            print(f"tritonserver stopped (exit code {code})", flush=True)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return status if status is not None else state["code"]
