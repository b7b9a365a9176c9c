"""Triton serving: tokens/s and latency at 1, 4, 16 concurrent clients, against in-process generate; with
``--openai``, the OpenAI front end against Triton's own gRPC endpoint at 1, 4, 16, 64 clients.

Default (``dspark bench serve REPO``): starts tritonserver on a repository written by ``dspark triton-repo``
(or uses a running one with --http), sends the same R requests (R = --requests, default 16) at each
concurrency level (C clients, each sending its share one after another over HTTP generate), and runs the
same requests in-process with the model's own settings: one at a time (``generate`` per request) and as one
batch. Reported, never asserted:

    batching gain = served tokens/s at 16 clients / served tokens/s at 1 client

``--openai`` (``dspark bench serve [SOURCE] --openai``; SOURCE as for ``dspark serve``, default the embedded
demo pair): starts the deployment of ``dspark serve`` in a child process (tritonserver + the front end, as a
user runs it), then at each level C sends the same R requests (default 64) from C concurrent streaming
clients through the OpenAI front end (``/v1/completions``, server-sent events) and straight to Triton's gRPC
endpoint (the front end's own client, token ids in), in --rounds interleaved rounds (default 3, the first path
alternating). Reported per round: tokens/s, time to first token (p50), latency (p50), the model's mean batch,
connections opened, CPU ms per request of the clients, the front end and the model; per level the ratio
front end / gRPC, the median over rounds (the goal: >= 0.9 at 16 clients);
the acceptance length from the metrics endpoint (``1 + Δaccepted / Δrequest_rounds`` over the run) against
the in-process figure for the same requests; whether the served text equals in-process ``generate``.

``--openai --secure``: a second deployment with an API key and HTTPS (a self-signed certificate made for the
run) in place of the gRPC path; per level the ratio secured / plain tokens/s (issue 45's goal: >= 0.95 at 16
clients), peak memory of both deployments, whether the two front ends' answers are equal, and that the secured
one refuses a request without the key, with a wrong one, and plain HTTP.

  dspark bench serve REPO
  dspark bench serve REPO --max-tokens 64 --concurrency 1 4 16 --json
  dspark bench serve --openai --threads 1
  dspark bench serve --openai --secure --concurrency 1 4 16
  dspark bench serve OUT --openai --concurrency 1 4 16 64 --requests 64 --max-tokens 32 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

from .serve_load import percentile, prompts


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("repository", metavar="REPO", nargs="?", default=None,
                   help="model repository (dspark triton-repo); with --openai: SOURCE as for dspark serve (a "
                        "checkpoint, an export or a repository; default: the embedded demo pair)")
    p.add_argument("--model", default="dspark", help="model name in the repository (default dspark)")
    p.add_argument("--http", default=None, metavar="HOST:PORT", help="a running server (default: start one)")
    p.add_argument("--openai", action="store_true",
                   help="the OpenAI front end against Triton's gRPC endpoint, TTFT, acceptance from the metrics")
    p.add_argument("--secure", action="store_true",
                   help="with --openai: the front end plain against a second deployment with an API key and HTTPS "
                        "(a self-signed certificate made for the run), instead of Triton's gRPC")
    p.add_argument("--threads", type=int, default=0, help="--openai: CPU threads of the model (default: library "
                   "default)")
    p.add_argument("--concurrency", type=int, nargs="+", default=None,
                   help="clients (default 1 4 16; with --openai 1 4 16 64)")
    p.add_argument("--requests", type=int, default=None, help="requests per level (default 16; with --openai 64)")
    p.add_argument("--rounds", type=int, default=None,
                   help="with --openai: rounds of both paths per level, interleaved (the first path alternating); "
                        "ratios are the median over rounds (default 3)")
    p.add_argument("--max-tokens", type=int, default=32, help="max_tokens per request (default 32)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _served(url: str, model: str, payloads: list[dict], clients: int) -> dict:
    from ..serving.client import http_generate

    answers = [None] * len(payloads)
    shares = [list(range(c, len(payloads), clients)) for c in range(clients)]

    def client(indices):
        for i in indices:
            answers[i] = http_generate(url, model, payloads[i])

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(s,)) for s in shares]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    tokens = sum(len(a.ids) for a in answers)
    lat = [a.seconds for a in answers]
    return {"clients": clients, "requests": len(payloads), "tokens": tokens, "seconds": wall,
            "tokens_per_second": tokens / wall, "p50_s": statistics.median(lat), "p99_s": percentile(lat, 0.99),
            "max_batch": max(a.batch_size or 0 for a in answers), "ids": [a.ids for a in answers]}


def _in_process(settings, payloads: list[dict]) -> list[dict]:
    from ..serving.served_decoder import load_decoder

    dec = load_decoder(settings)
    kwargs = lambda p: dict(temperature=p["temperature"], seed=p["seed"], topk=settings.topk,  # noqa: E731
                            confidence_threshold=settings.confidence_threshold)
    dec.generate(payloads[0]["text_input"], 4, **kwargs(payloads[0]))  # warm-up
    lat, ids = [], []
    start = time.perf_counter()
    for p in payloads:
        t = time.perf_counter()
        ids.append(dec.generate(p["text_input"], p["max_tokens"], **kwargs(p)).tokens[0])
        lat.append(time.perf_counter() - t)
    wall = time.perf_counter() - start
    tokens = sum(len(i) for i in ids)
    rows = [{"clients": "in-process, one at a time", "requests": len(payloads), "tokens": tokens, "seconds": wall,
             "tokens_per_second": tokens / wall, "p50_s": statistics.median(lat), "p99_s": percentile(lat, 0.99),
             "ids": ids}]
    same = {(p["temperature"], p["seed"], p["max_tokens"]) for p in payloads}
    if len(same) == 1:  # one batch needs shared settings (true for this benchmark's requests)
        start = time.perf_counter()
        out = dec.generate([p["text_input"] for p in payloads], payloads[0]["max_tokens"], **kwargs(payloads[0]))
        wall = time.perf_counter() - start
        tokens = sum(len(t) for t in out.tokens)
        rows.append({"clients": f"in-process, one batch of {len(payloads)}", "requests": len(payloads),
                     "tokens": tokens, "seconds": wall, "tokens_per_second": tokens / wall, "p50_s": wall,
                     "p99_s": wall, "ids": out.tokens})
    return rows


def run(args: argparse.Namespace) -> int:
    if getattr(args, "secure", False) and not args.openai:
        from ..errors import DSparkTrtError

        raise DSparkTrtError("--secure goes with --openai: dspark bench serve --openai --secure")
    if args.openai:
        from .serve_openai import run_openai

        return run_openai(args)
    from pathlib import Path

    from ..errors import DSparkTrtError

    if args.repository is None:
        raise DSparkTrtError("dspark bench serve needs REPO (a model repository), or --openai")
    args.concurrency = args.concurrency or [1, 4, 16]
    args.requests = args.requests or 16

    from ..serving.repository import read_model_config
    from ..serving.server import TritonServer
    from ..serving.settings import ModelSettings

    config_path = Path(args.repository) / args.model / "config.pbtxt"
    if not config_path.is_file():
        raise DSparkTrtError(f"no {config_path}: pass a repository written by dspark triton-repo (and --model)")
    config = read_model_config(config_path)
    settings = ModelSettings.from_parameters({k: v.string_value for k, v in config.parameters.items()})
    payloads = [{"text_input": p, "max_tokens": args.max_tokens, "temperature": args.temperature, "seed": i if
                 args.temperature else 0} for i, p in enumerate(prompts(args.requests))]
    if args.temperature:
        for p in payloads:
            p["seed"] = 0  # one batch in-process needs one seed; the requests still differ by prompt
    server = None
    if args.http is None:
        server = TritonServer(args.repository, log_file=Path(args.repository).resolve().parent / "bench-serve.log")
        server.start(timeout=900)
    url = args.http or server.endpoints.http
    try:
        _served(url, args.model, payloads[:2], 2)  # warm-up
        rows = [_served(url, args.model, payloads, c) for c in args.concurrency]
    finally:
        if server is not None:
            server.stop()
    rows += _in_process(settings, payloads)
    same = all(r["ids"] == rows[0]["ids"] for r in rows)
    by_clients = {r["clients"]: r for r in rows}
    gain = (by_clients[16]["tokens_per_second"] / by_clients[1]["tokens_per_second"]
            if 1 in by_clients and 16 in by_clients else None)
    for r in rows:
        r.pop("ids")
    report = {"model": args.model, "runtime": settings.runtime, "max_tokens": args.max_tokens,
              "temperature": args.temperature, "rows": rows, "batching_gain_16_vs_1": gain, "same_tokens": same}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"model {args.model} ({settings.runtime}), {args.requests} requests × max_tokens {args.max_tokens}, "
          f"temperature {args.temperature}")
    print("| clients | tokens | wall s | tokens/s | p50 latency s | p99 latency s | max batch |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['clients']} | {r['tokens']} | {r['seconds']:.2f} | {r['tokens_per_second']:.1f} | "
              f"{r['p50_s']:.3f} | {r['p99_s']:.3f} | {r.get('max_batch', '-')} |")
    if gain is not None:
        print(f"batching gain (16 concurrent vs 1 client, same 16 requests): {gain:.2f}x")
    print(f"same tokens served and in-process: {same}")
    return 0
