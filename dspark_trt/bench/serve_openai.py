"""``dspark bench serve --openai``: the OpenAI front end against Triton's own gRPC endpoint (see bench/serve.py).

The deployment runs in a child process (as ``dspark serve`` would: its own interpreter, so the benchmark's
clients do not share a GIL with the front end); both kinds of client run here on one event loop. At each
concurrency level the OpenAI round and the gRPC round send the same requests, one after the other, the
order alternating between levels so that neither always runs on a warmer machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from .serve_load import percentile
from .serve_load import prompts as load_prompts

__all__ = ["run_openai", "acceptance_from_metrics"]


def acceptance_from_metrics(before: dict, after: dict, model: str = "dspark") -> float | None:
    """``1 + Δaccepted / Δrequest_rounds`` between two scrapes (``client.scrape_metrics``), summed over the
    model's instances; None when no round ran."""
    def total(samples, name):
        return sum(v for (n, labels), v in samples.items() if n == name and dict(labels).get("model") == model)

    rounds = total(after, "dspark_request_rounds_total") - total(before, "dspark_request_rounds_total")
    accepted = total(after, "dspark_accepted_tokens_total") - total(before, "dspark_accepted_tokens_total")
    return 1.0 + accepted / rounds if rounds else None


def _serve_child(source_path, options, endpoints, stop) -> None:
    """Child process: start the deployment, report its endpoints, serve until ``stop`` is set."""
    import signal

    from ..serving.deployment import Deployment, resolve_source

    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and sets stop
    deployment = Deployment(resolve_source(source_path), options, say=lambda line: None)
    try:
        deployment.start()
        e = deployment.server.endpoints
        endpoints.put({"openai": deployment.frontend.url, "grpc": e.grpc, "metrics": e.metrics,
                       "repository": str(deployment.repository), "model": deployment.model})
        stop.wait()
    except BaseException as exc:  # the parent reports it
        endpoints.put({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        deployment.stop()


class _Child:
    """The deployment in a child process (``start`` / ``stop``)."""

    def __init__(self, source_path, options):
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.endpoints, self.stop_event = ctx.Queue(), ctx.Event()
        self.process = ctx.Process(target=_serve_child, args=(str(source_path), options, self.endpoints,
                                                               self.stop_event), daemon=True)

    def start(self, timeout: float) -> dict:
        from ..errors import DSparkTrtError

        self.process.start()
        try:
            info = self.endpoints.get(timeout=timeout)
        except Exception:
            self.stop()
            raise DSparkTrtError(f"the deployment did not start within {timeout:.0f} s") from None
        if "error" in info:
            self.stop()
            raise DSparkTrtError(f"the deployment failed to start: {info['error']}")
        return info

    def stop(self) -> None:
        self.stop_event.set()
        self.process.join(120)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(30)


async def _openai_request(session, url: str, payload: dict) -> dict:
    """One streamed /v1/completions request: time to first text, latency, tokens, text."""
    start = time.perf_counter()
    first = None
    pieces, tokens = [], 0
    async with session.post(f"{url}/completions", json=payload) as r:
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {(await r.text())[:200]}")
        async for raw in r.content:
            line = raw.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[len(b"data: "):]
            if data == b"[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                raise RuntimeError(event["error"]["message"])
            if event.get("choices") and event["choices"][0]["text"]:
                first = first or time.perf_counter()
                pieces.append(event["choices"][0]["text"])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    end = time.perf_counter()
    return {"ttft": (first or end) - start, "latency": end - start, "tokens": tokens, "text": "".join(pieces)}


_CLOSING: set = set()  # streams closing in the background (the front end closes its own the same way)


async def _grpc_request(client, tensors: dict) -> dict:
    start = time.perf_counter()
    first = end = None
    ids = []
    stream = client.generate(tensors)
    async for piece in stream:
        if piece.ids and first is None:
            first = time.perf_counter()
        ids.extend(piece.ids)
        if piece.final is not None:
            end = time.perf_counter()
            break
    closing = asyncio.ensure_future(stream.aclose())  # waits for Triton to end the stream: not the client's wait
    _CLOSING.add(closing)
    closing.add_done_callback(_CLOSING.discard)
    end = end or time.perf_counter()
    return {"ttft": (first or end) - start, "latency": end - start, "tokens": len(ids), "ids": ids}


async def _level(kind: str, clients: int, work: list, send) -> dict:
    """``clients`` workers take the requests in order; wall time over all of them."""
    results = [None] * len(work)
    next_index = iter(range(len(work)))

    async def worker():
        for i in next_index:
            results[i] = await send(work[i])

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    wall = time.perf_counter() - start
    tokens = sum(r["tokens"] for r in results)
    ttft = [r["ttft"] for r in results]
    latency = [r["latency"] for r in results]
    return {"clients": clients, "path": kind, "requests": len(work), "tokens": tokens, "seconds": wall,
            "tokens_per_second": tokens / wall, "ttft_p50_ms": 1000 * statistics.median(ttft),
            "ttft_p99_ms": 1000 * percentile(ttft, 0.99), "latency_p50_s": statistics.median(latency),
            "results": results}


async def _benchmark(info: dict, prompts: list[str], prompt_ids: list[list[int]], args, metrics: list) -> list[dict]:
    """Both paths at every level; ``metrics`` gets the scrapes before and after the measured rounds."""
    import aiohttp

    from ..serving.client import scrape_metrics
    from ..serving.triton_stream import TritonStreamClient, generate_inputs

    name = info["model"]
    payloads = [{"model": name, "prompt": p, "max_tokens": args.max_tokens, "temperature": args.temperature,
                 "seed": 0, "stream": True, "stream_options": {"include_usage": True}} for p in prompts]
    tensors = [generate_inputs(ids, args.max_tokens, temperature=args.temperature, seed=0) for ids in prompt_ids]
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    rows = []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        grpc = TritonStreamClient(info["grpc"], name)
        try:
            openai = lambda p: _openai_request(session, info["openai"], p)  # noqa: E731
            direct = lambda t: _grpc_request(grpc, t)  # noqa: E731
            await _level("openai", 2, payloads[:2], openai)  # warm-up, both paths
            await _level("grpc", 2, tensors[:2], direct)
            metrics[0] = scrape_metrics(info["metrics"], "dspark_")  # after the warm-up: the run repeats one set
            for k, clients in enumerate(args.concurrency):
                order = [("openai", payloads, openai), ("grpc", tensors, direct)]
                for kind, work, send in (order if k % 2 == 0 else order[::-1]):
                    rows.append(await _level(kind, clients, work, send))
        finally:
            if _CLOSING:
                await asyncio.gather(*_CLOSING, return_exceptions=True)
            await grpc.close()
    metrics[1] = scrape_metrics(info["metrics"], "dspark_")
    return rows


def _in_process(repository: str, model: str, prompts: list[str], args) -> tuple[list[str], float]:
    """The same requests in-process with the served model's settings: texts and the mean acceptance length."""
    from pathlib import Path

    from ..serving.repository import read_model_config
    from ..serving.served_decoder import load_decoder
    from ..serving.settings import ModelSettings

    model_dir = Path(repository) / model
    config = read_model_config(model_dir / "config.pbtxt")
    settings = ModelSettings.from_parameters({k: v.string_value for k, v in config.parameters.items()})
    settings = settings.resolved(model_dir / "1")
    decoder = load_decoder(settings)
    out = decoder.generate(prompts, args.max_tokens, temperature=args.temperature, seed=0, topk=settings.topk,
                           confidence_threshold=settings.confidence_threshold, verify_drafts=settings.verify_drafts)
    return out.texts, out.stats.mean_acceptance_length


def run_openai(args: argparse.Namespace) -> int:
    from ..errors import DSparkTrtError
    from ..serving.deployment import resolve_source
    from ..serving.settings import ServeOptions

    concurrency = args.concurrency or [1, 4, 16, 64]
    args.concurrency = concurrency
    requests = args.requests or 64
    source = args.repository
    if source is None:
        from ..demo.pair import embedded_pair

        pair = embedded_pair()
        source = pair.drafter
        resolved = resolve_source(pair.drafter, target=pair.target)
    else:
        resolved = resolve_source(source)
    if args.http is not None:
        raise DSparkTrtError("--http does not go with --openai: the benchmark starts its own deployment")
    options = ServeOptions(threads=args.threads, http_port=0, grpc_port=0, metrics_port=0, openai_port=0,
                           max_batch_size=max(64, max(concurrency)))
    child_source = resolved.path
    if resolved.kind == "checkpoint":  # the child resolves the path again: export it here, hand over the export
        from ..export.pipeline import ExportOptions
        from ..serving.deployment import default_dtype
        from ..serving.served_decoder import have_tensorrt
        from ..serving.export_cache import cached_export

        cached = cached_export(resolved.path, target_dir=resolved.target, options=ExportOptions(
            dtype=default_dtype(), engine="tensorrt" if have_tensorrt() else "none"))
        child_source = cached.path
    prompts = load_prompts(requests)
    child = _Child(child_source, options)
    info = child.start(timeout=900)
    try:
        from ..runtime.decoder import load_tokenizer
        from ..serving.deployment import frontend_config

        config = frontend_config(info["repository"], info["model"], info["grpc"])
        tokenizer = load_tokenizer(config.tokenizer_dir) if config.tokenizer_dir else None
        if tokenizer is None:
            raise DSparkTrtError("the served model has no tokenizer; the OpenAI benchmark sends text prompts")
        prompt_ids = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
        metrics = [{}, {}]
        rows = asyncio.run(_benchmark(info, prompts, prompt_ids, args, metrics))
        before, after = metrics
        texts, in_process_acceptance = _in_process(info["repository"], info["model"], prompts, args)
    finally:
        child.stop()
    # every level and path sends the same requests: the acceptance over the run is that of one set of them
    served_acceptance = acceptance_from_metrics(before, after, info["model"])
    served = [(r["text"] if row["path"] == "openai" else tokenizer.decode(r["ids"], skip_special_tokens=False), i)
              for row in rows for i, r in enumerate(row["results"])]
    equal = sum(text == texts[i] for text, i in served)
    by = {(r["clients"], r["path"]): r for r in rows}
    ratios = {c: by[(c, "openai")]["tokens_per_second"] / by[(c, "grpc")]["tokens_per_second"] for c in concurrency}
    for r in rows:
        r.pop("results")
    report = {"source": str(source), "max_tokens": args.max_tokens, "temperature": args.temperature,
              "requests": requests, "rows": rows, "openai_over_grpc": ratios,
              "acceptance_metrics": served_acceptance, "acceptance_in_process": in_process_acceptance,
              "served_equal_to_in_process": [equal, len(served)]}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{requests} requests × max_tokens {args.max_tokens}, temperature {args.temperature}, source {source}")
    print("| clients | path | tokens | wall s | tokens/s | TTFT p50 ms | TTFT p99 ms | latency p50 s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['clients']} | {r['path']} | {r['tokens']} | {r['seconds']:.2f} | {r['tokens_per_second']:.1f} | "
              f"{r['ttft_p50_ms']:.0f} | {r['ttft_p99_ms']:.0f} | {r['latency_p50_s']:.3f} |")
    print("OpenAI front end / Triton gRPC tokens/s: " + ", ".join(f"{c} clients {v:.2f}x" for c, v in ratios.items()))
    accept = "n/a (no dspark metrics)" if served_acceptance is None else f"{served_acceptance:.4f}"
    print(f"acceptance length: metrics endpoint {accept}, in-process {in_process_acceptance:.4f}")
    print(f"served answers equal to in-process generate (one batch of the same requests): {equal} of {len(served)}"
          + ("" if equal == len(served) else " (fp32 rounding differs with the batch's shape: a near-tie can flip a "
                                             "greedy token)"))
    return 0
