"""Serve a drafter checkpoint, an export or a Triton model repository: tritonserver + an OpenAI-compatible API.

  dspark serve                                  the embedded demo pair (exported once, then cached; chat through
                                                dspark-trt's plain template, serving/plain_chat.jinja)
  dspark serve DRAFTER [--target DIR]           a checkpoint: exported on first use, cached by content digest
  dspark serve OUT                              an export directory (dspark-export -o OUT)
  dspark serve REPO                             a model repository (dspark triton-repo)

Prints the endpoints (OpenAI API on --openai-port, default 9000; Triton's HTTP/gRPC/metrics on 8000/8001/8002)
and serves until Ctrl-C (exit 130) or SIGTERM (exit 0: a graceful drain first, readiness false and new requests
refused with 503 while those in flight finish, up to --drain-timeout); everything it started stops with it. When the model's
process (or tritonserver itself) dies, it says so and restarts it (--no-restart: exits 1). Uses a `tritonserver`
on PATH, else the one bundled with PyTriton, run from a managed Python environment built on first use (see
docs/serving.md).
"""

from __future__ import annotations

import argparse
import os
import signal
import threading

from ..serving.settings import RepositorySettings, ServeOptions
from .settings_args import add_settings, changed_flags, settings_values

#: dspark serve's help groups (a setting's group → title); the export's settings join the model's
GROUPS = {"endpoints": "endpoints", "model": "model (a checkpoint or an export; a REPO has these in its config.pbtxt)",
          "export": "model (a checkpoint or an export; a REPO has these in its config.pbtxt)",
          "security": "security (docs/serving.md, Security)", "server": "server"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", metavar="SOURCE", nargs="?", default=None,
                   help="drafter checkpoint, export directory or model repository (default: the embedded demo pair)")
    p.add_argument("--target", metavar="DIR", default=None,
                   help="the target model of a drafter checkpoint (default: the one the checkpoint records)")
    # a checkpoint is exported and served as an export: never runtime torch (a checkpoint pair's)
    add_settings(p, ServeOptions, groups=GROUPS, choices={"runtime": ("tensorrt", "onnxruntime")})


class _Stopped(BaseException):
    """Raised by the signal handlers while starting (an export or a server start is interrupted)."""

    def __init__(self, code: int):
        self.code = code


def _options(args: argparse.Namespace) -> ServeOptions:
    from pathlib import Path

    from ..errors import DSparkTrtError

    from ..serving.auth import api_keys

    values = settings_values(ServeOptions, args)
    # --api-key, --api-key-file and DSPARK_API_KEY together (the keys are never printed)
    values["api_keys"] = api_keys(args.api_keys, args.api_key_file, os.environ)
    if (args.ssl_keyfile is None) != (args.ssl_certfile is None):
        raise DSparkTrtError("HTTPS needs both --ssl-keyfile and --ssl-certfile (the private key and its "
                             "certificate); pass both, or neither for plain HTTP")
    if args.chat_template is not None:  # the flag names a file; the options hold its text
        try:
            values["chat_template"] = Path(args.chat_template).read_text()
        except OSError as e:
            raise DSparkTrtError(f"cannot read the chat template {args.chat_template}: {e.strerror}") from None
    if args.instances < 1:
        raise DSparkTrtError(f"--instances must be >= 1, got {args.instances}")
    if args.max_queue is not None and args.max_queue < 0:
        raise DSparkTrtError(f"--max-queue must be >= 0, got {args.max_queue}")
    return ServeOptions(**values, repository_flags=changed_flags(RepositorySettings, args))


def _chat_note(frontend) -> str:
    """The ready line's word on chat: served or not, and with which template."""
    from ..serving.chat_template import PLAIN_CHAT_TEMPLATE, plain_chat_template

    if not frontend.chat_available:
        return f"chat: no (the tokenizer has no chat template; --chat-template {PLAIN_CHAT_TEMPLATE} serves it)"
    if frontend.config.chat_template == plain_chat_template():
        return "chat: yes, dspark-trt's plain User/Assistant template"
    return "chat: yes"


def demo_options(options: ServeOptions) -> ServeOptions:
    """The embedded demo pair's serving options: its byte tokenizer has no chat template, so chat is served with
    dspark-trt's plain one (``serving/plain_chat.jinja``) unless ``--chat-template`` gives another."""
    import dataclasses

    from ..serving.chat_template import plain_chat_template

    if options.chat_template is not None:
        return options
    return dataclasses.replace(options, chat_template=plain_chat_template())


def _announce(d) -> None:
    from ..serving.addresses import bind_note, is_loopback, listens_everywhere

    e, name = d.server.endpoints, d.model
    print(f"tritonserver ready: HTTP http://{e.http} (generate: http://{e.http}/v2/models/{name}/generate), "
          f"gRPC {e.grpc}, metrics {e.metrics}", flush=True)
    if d.frontend is not None:
        c = d.frontend.config
        chat = _chat_note(d.frontend)
        keys = f"API key: required ({len(c.api_keys)} accepted)" if c.api_keys else "API key: none"
        print(f"OpenAI API ready: {d.frontend.url} (model {c.name!r}, context {c.max_context}, {chat}, {keys})",
              flush=True)
    hosts = ([d.frontend.host] if d.frontend is not None else []) + [e.host, e.metrics_host]
    notes = list(dict.fromkeys(bind_note(h) for h in hosts))  # the URLs shown are this machine's
    if not is_loopback(e.host):
        notes.append(f"Triton's HTTP and gRPC endpoints are published on {e.host or '0.0.0.0'}: inference there "
                     f"needs no API key; loading, unloading and configuring models answer only dspark serve")
        if listens_everywhere(e.host):
            notes.append("(Triton's gRPC endpoint binds a wildcard address as gRPC does: IPv4 and IPv6 together)")
    elif not is_loopback(e.metrics_host):
        notes.append(f"Triton's metrics endpoint is published on {e.metrics_host or '0.0.0.0'}")
    if d.frontend is not None and d.frontend.config.api_keys and not d.frontend.ssl_certfile \
            and not is_loopback(d.frontend.host):
        notes.append("the API key crosses the network in clear text: add --ssl-keyfile and --ssl-certfile (or put a "
                     "TLS proxy in front)")
    for note in notes:
        if note:
            print(note, flush=True)
    print("serving; Ctrl-C stops everything", flush=True)


def run(args: argparse.Namespace) -> int:
    from ..serving.deployment import Deployment, resolve_source

    options = _options(args)
    if args.source is None:
        if args.target is not None:
            from ..errors import DSparkTrtError

            raise DSparkTrtError("--target needs a drafter checkpoint SOURCE")
        from ..demo.pair import embedded_pair

        drafter, target = embedded_pair()
        source = resolve_source(drafter, target=target)
        options = demo_options(options)
    else:
        source = resolve_source(args.source, target=args.target)
    if source.kind != "checkpoint" and (args.dtype or args.cache_dir):
        from ..errors import DSparkTrtError

        raise DSparkTrtError(f"--dtype and --cache-dir apply to exporting a checkpoint; {args.source} is an "
                             f"{source.kind} directory")

    deployment = Deployment(source, options)
    stop, cut = threading.Event(), threading.Event()
    state = {"serving": False, "code": 0, "stopping": False, "drain": False}

    def on_signal(signum, frame):
        code = 130 if signum == signal.SIGINT else 0
        if state["drain"] and not cut.is_set():  # a second signal while draining: end the drain now
            cut.set()
            return
        if state["stopping"]:  # a second signal while stopping: do not wait for the drain
            server = deployment.server
            if server is not None and server.process is not None and server.process.poll() is None:
                os.killpg(server.process.pid, signal.SIGKILL)
            return
        state["code"] = code
        if state["serving"]:
            state["drain"] = signum == signal.SIGTERM  # SIGTERM drains; Ctrl-C stops at once, as always
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
            status = deployment.watch(stop, restart=options.restart)
            if status is None and state["drain"]:
                deployment.drain(options.drain_timeout, cut)
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
