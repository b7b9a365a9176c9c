"""Serve a model repository with tritonserver until Ctrl-C.

Uses a `tritonserver` on PATH, else the one bundled with PyTriton (nvidia-pytriton; CPU, Python backend),
run from a managed Python environment built on first use (a few minutes, once; see docs/triton.md).
"""

from __future__ import annotations

import argparse
import signal
import threading


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("repository", metavar="REPO", help="model repository (dspark triton-repo)")
    p.add_argument("--http-port", type=int, default=8000, help="HTTP port (default 8000; 0 = any free port)")
    p.add_argument("--grpc-port", type=int, default=8001, help="gRPC port (default 8001; 0 = any free port)")
    p.add_argument("--metrics-port", type=int, default=8002, help="metrics port (default 8002; 0 = any free port)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for all)")
    p.add_argument("--tritonserver", default=None, metavar="PATH", help="this tritonserver binary")
    p.add_argument("--timeout", type=float, default=600, help="seconds to wait for readiness (default 600)")


def run(args: argparse.Namespace) -> int:
    from ..serving.server import TritonServer

    server = TritonServer(args.repository, http_port=args.http_port or None, grpc_port=args.grpc_port or None,
                          metrics_port=args.metrics_port or None, host=args.host, executable=args.tritonserver)
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        server.start(timeout=args.timeout)
        e = server.endpoints
        print(f"tritonserver ready: HTTP http://{e.http} (generate: http://{e.http}/v2/models/dspark/generate), "
              f"gRPC {e.grpc}, metrics {e.metrics}; Ctrl-C stops it", flush=True)
        while not stop.is_set() and server.process.poll() is None:
            stop.wait(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        code = server.stop()
    print(f"tritonserver stopped (exit code {code})")
    return 0
