"""``dspark bench serve --openai``: the OpenAI front end against Triton's own gRPC endpoint (see bench/serve.py).

The deployment runs in a child process (as ``dspark serve`` would: its own interpreter, so the benchmark's
clients do not share a GIL with the front end); both kinds of client run here on one event loop. At each
concurrency level the OpenAI round and the gRPC round send the same requests, one after the other, ``--rounds``
times (default 3), the path that goes first alternating round by round (ABBA), so that neither always runs on
a warmer machine; a ratio is the median of its rounds' ratios. The OpenAI clients keep their connections
(one pool, keep-alive: each response is read to its end) as an SDK client does, and every round starts with
one open per client (``_measured``): a round measures serving, not connection set-up.

What each round cost, per request (Linux ``/proc``): CPU ms of this process (the load generator: every
client's HTTP, TLS and JSON work is counted here, on the same cores as the server), of the deployment's child
(supervisor + front end) and of its descendants (tritonserver + the model's stub); the model's mean batch
(its ``dspark_batch_size`` metric) and the connections the clients opened.

``--secure``: a second deployment child with an API key and HTTPS (a self-signed certificate made for the run);
the rounds then compare the two front ends, plain and secured, on the same requests (issue 45's goal: the key
check and TLS cost at most 5 % of tokens/s at 16 clients); the CPU shares say where a difference comes from.
The run also checks that the secured front end refuses a request without the key, one with a wrong key, and
plain HTTP.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

from .serve_load import percentile
from .serve_load import prompts as load_prompts

__all__ = ["run_openai", "acceptance_from_metrics", "self_signed_certificate"]


def _delta(before: dict, after: dict, name: str, model: str) -> float:
    """The change of metric ``name`` between two scrapes (``client.scrape_metrics``), summed over the model's
    instances."""
    def total(samples):
        return sum(v for (n, labels), v in samples.items() if n == name and dict(labels).get("model") == model)

    return total(after) - total(before)


def acceptance_from_metrics(before: dict, after: dict, model: str = "dspark") -> float | None:
    """``1 + Δaccepted / Δrequest_rounds`` between two scrapes (``client.scrape_metrics``), summed over the
    model's instances; None when no round ran."""
    rounds = _delta(before, after, "dspark_request_rounds_total", model)
    accepted = _delta(before, after, "dspark_accepted_tokens_total", model)
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


def self_signed_certificate(directory: Path) -> tuple[str, str]:
    """A private key and a self-signed certificate for 127.0.0.1 and localhost, as PEM files in ``directory``."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dspark bench serve --secure")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    key_file, cert_file = directory / "key.pem", directory / "cert.pem"
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(key_file), str(cert_file)


def _process_tree(pid: int) -> set[int] | None:
    """``pid`` and all its descendants now (Linux ``/proc``); None off Linux or when ``pid`` is gone."""
    proc = Path("/proc")
    if not (proc / str(pid)).is_dir():
        return None
    parent = {}
    for d in proc.iterdir():
        try:
            if d.name.isdigit():  # /proc/PID/stat: "pid (comm) state ppid ..."; comm may hold spaces
                parent[int(d.name)] = int((d / "stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            pass
    tree, frontier = {pid}, [pid]
    while frontier:
        frontier = [p for p, pp in parent.items() if pp in frontier and p not in tree]
        tree.update(frontier)
    return tree


def _cpu_seconds(pid: int) -> tuple[float, float] | None:
    """CPU seconds (user + system, all threads) of process ``pid`` (the deployment child: supervisor + front end)
    and summed over its descendants (tritonserver, the model's stub); None off Linux."""
    import os

    tree = _process_tree(pid)
    if tree is None:
        return None
    tick = os.sysconf("SC_CLK_TCK")

    def cpu(p):
        try:  # /proc/PID/stat after "(comm)": state ppid ... utime (14th field) stime (15th)
            fields = (Path("/proc") / str(p) / "stat").read_text().rpartition(")")[2].split()
            return (int(fields[11]) + int(fields[12])) / tick
        except (OSError, ValueError, IndexError):
            return 0.0

    return cpu(pid), sum(cpu(p) for p in tree - {pid})


def _peak_memory_mib(pid: int) -> dict | None:
    """Peak resident memory (VmHWM, MiB) of process ``pid`` (the deployment child: supervisor + front end) and
    the sum of its and all its descendants' peaks (tritonserver, the model's stub); None off Linux."""
    proc = Path("/proc")
    tree = _process_tree(pid)
    if tree is None:
        return None

    def hwm(p):
        try:
            line = next(x for x in (proc / str(p) / "status").read_text().splitlines() if x.startswith("VmHWM:"))
            return int(line.split()[1]) / 1024
        except (OSError, StopIteration, ValueError):
            return 0.0

    return {"child_mib": round(hwm(pid), 1), "tree_sum_mib": round(sum(hwm(p) for p in tree), 1),
            "processes": len(tree)}


async def _openai_request(session, url: str, payload: dict, headers: dict | None = None, ssl=True) -> dict:
    """One streamed /v1/completions request: time to first text, latency, tokens, text (``headers``: e.g. the
    API key; ``ssl``: the context that trusts an HTTPS front end's certificate)."""
    start = time.perf_counter()
    first = end = None
    pieces, tokens = [], 0
    async with session.post(f"{url}/completions", json=payload, headers=headers, ssl=ssl) as r:
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {(await r.text())[:200]}")
        async for raw in r.content:  # to the body's end, past [DONE]: a response read to its end lets the
            line = raw.strip()       # connection go back to the pool (keep-alive), as the openai client does
            if end is not None or not line.startswith(b"data: "):
                continue
            data = line[len(b"data: "):]
            if data == b"[DONE]":
                end = time.perf_counter()
                continue
            event = json.loads(data)
            if "error" in event:
                raise RuntimeError(event["error"]["message"])
            if event.get("choices") and event["choices"][0]["text"]:
                first = first or time.perf_counter()
                pieces.append(event["choices"][0]["text"])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    end = end or time.perf_counter()
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


async def _refusals(session, secure: dict, payload: dict) -> dict:
    """What the secured front end answers without the key, with a wrong key, and to plain HTTP."""
    import aiohttp

    async def status(url, headers, ssl):
        try:
            async with session.post(f"{url}/completions", json=payload, headers=headers, ssl=ssl) as r:
                return r.status
        except aiohttp.ClientError as e:
            return f"refused ({type(e).__name__})"

    url = secure["openai"]
    return {"url": url, "without_key": await status(url, None, secure["tls"]),
            "wrong_key": await status(url, {"Authorization": "Bearer not-the-key"}, secure["tls"]),
            "plain_http": await status(url.replace("https://", "http://", 1), None, True)}


async def _measured(kind: str, clients: int, work: list, warm: list, send, deployment: dict, model: str,
                    opened: list, counts: dict) -> dict:
    """``_level`` and what it cost, per request: CPU ms of this process (the clients), of the deployment's child
    (supervisor + front end: ``deployment["pid"]``) and of its descendants (tritonserver + the model's stub);
    from the model's metrics its mean batch and acceptance length (``counts`` sums the request-rounds and the
    accepted drafts); the connections the clients opened (``opened[0]`` counts them).

    First, unmeasured, ``clients`` one-token requests (``warm``) at once: every client has its connection open
    (a pool's idle ones close after 15 s, while the other path's rounds run), so that the round measures
    serving over kept connections, not their set-up (``connections_opened`` shows any that still happen)."""
    from ..serving.client import scrape_metrics

    await _level(kind, clients, warm[:clients], send)
    m0 = scrape_metrics(deployment["metrics"], "dspark_")  # outside the CPU window: Triton answers it
    cpu0, own0, opened0 = _cpu_seconds(deployment["pid"]), time.process_time(), opened[0]
    row = await _level(kind, clients, work, send)
    cpu1, own1 = _cpu_seconds(deployment["pid"]), time.process_time()
    m1 = scrape_metrics(deployment["metrics"], "dspark_")
    n = row["requests"]
    rounds = _delta(m0, m1, "dspark_batch_size_count", model)
    row["batch_mean"] = _delta(m0, m1, "dspark_batch_size_sum", model) / rounds if rounds else None
    row["acceptance"] = acceptance_from_metrics(m0, m1, model)
    counts["request_rounds"] += _delta(m0, m1, "dspark_request_rounds_total", model)
    counts["accepted"] += _delta(m0, m1, "dspark_accepted_tokens_total", model)
    row["connections_opened"] = opened[0] - opened0
    row["cpu_ms_per_request"] = {"clients": 1000 * (own1 - own0) / n}
    if cpu0 is not None and cpu1 is not None:
        row["cpu_ms_per_request"].update(front_end=1000 * (cpu1[0] - cpu0[0]) / n,
                                         model=1000 * (cpu1[1] - cpu0[1]) / n)
    return row


async def _benchmark(info: dict, prompts: list[str], prompt_ids: list[list[int]], args, counts: dict,
                     secure: dict | None = None) -> list[dict]:
    """Both paths at every level, ``args.rounds`` times, interleaved (the OpenAI front end and Triton's gRPC, or
    with ``secure`` the plain and the secured front ends); ``counts`` sums the measured rounds' request-rounds
    and accepted drafts (both deployments')."""
    import aiohttp

    from ..serving.triton_stream import TritonStreamClient, generate_inputs

    name = info["model"]
    payloads = [{"model": name, "prompt": p, "max_tokens": args.max_tokens, "temperature": args.temperature,
                 "seed": 0, "stream": True, "stream_options": {"include_usage": True}} for p in prompts]
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    opened = [0]  # connections the OpenAI clients opened (each a TCP + for HTTPS a TLS handshake)

    async def count(*_):
        opened[0] += 1

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(count)
    plain = {"pid": info["pid"], "metrics": info["metrics"]}
    rows = []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, trace_configs=[trace]) as session:
        grpc = None if secure else TritonStreamClient(info["grpc"], name)
        try:
            warm = [{**p, "max_tokens": 1} for p in payloads]
            paths = {"openai": (payloads, warm, lambda p: _openai_request(session, info["openai"], p), plain)}
            if secure:
                key = {"Authorization": f"Bearer {secure['key']}"}
                paths["openai_secure"] = (payloads, warm, lambda p: _openai_request(
                    session, secure["openai"], p, key, secure["tls"]), secure["deployment"])
            else:
                tensors = [generate_inputs(ids, args.max_tokens, temperature=args.temperature, seed=0)
                           for ids in prompt_ids]
                warm_tensors = [generate_inputs(ids, 1, temperature=args.temperature, seed=0) for ids in prompt_ids]
                paths["grpc"] = (tensors, warm_tensors, lambda t: _grpc_request(grpc, t), plain)
            for kind, (work, _, send, _) in paths.items():  # warm-up, every path
                await _level(kind, 2, work[:2], send)
            order = list(paths.items())
            for k, clients in enumerate(args.concurrency):
                for r in range(args.rounds):  # ABBA: the path that goes first alternates round by round
                    for kind, (work, warm, send, deployment) in (order if (k + r) % 2 == 0 else order[::-1]):
                        row = await _measured(kind, clients, work, warm, send, deployment, name, opened, counts)
                        rows.append({"round": r, **row})
            if secure:
                secure["refusals"] = await _refusals(session, secure, payloads[0])
        finally:
            if _CLOSING:
                await asyncio.gather(*_CLOSING, return_exceptions=True)
            if grpc is not None:
                await grpc.close()
    return rows


def _pairs(rows: list[dict], base: str, other: str) -> dict:
    """``{clients: [(base row, other row) for each round]}``: the two paths' rows of one level and round."""
    by = {(r["clients"], r["round"], r["path"]): r for r in rows}
    out: dict = {}
    for (clients, round_, path), row in by.items():
        if path == base:
            out.setdefault(clients, []).append((row, by[(clients, round_, other)]))
    return out


def _median_cost(rows: list[dict]) -> dict:
    """Median over rounds of each CPU share (ms per request)."""
    keys = rows[0]["cpu_ms_per_request"]
    return {k: statistics.median(r["cpu_ms_per_request"][k] for r in rows) for k in keys}


def _in_process(repository: str, model: str, prompts: list[str], args) -> tuple[list[str], float]:
    """The same requests in-process with the served model's settings: texts and the mean acceptance length."""
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
    import dataclasses
    import secrets
    import ssl
    import tempfile

    from ..errors import DSparkTrtError
    from ..optional import require
    from ..serving.deployment import resolve_source
    from ..serving.settings import ServeOptions

    concurrency = args.concurrency or [1, 4, 16, 64]
    args.concurrency = concurrency
    args.rounds = getattr(args, "rounds", None) or 3
    if args.rounds < 1:
        raise DSparkTrtError(f"--rounds must be at least 1, got {args.rounds}")
    requests = args.requests or 64
    secure_run = getattr(args, "secure", False)
    if secure_run:
        require("cryptography", "dspark bench serve --secure (its self-signed certificate)")
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
    scratch = tempfile.TemporaryDirectory(prefix="dspark-bench-secure-")
    children, secure = [], None
    try:
        child = _Child(child_source, options)
        children.append(child)
        info = child.start(timeout=900)
        info["pid"] = child.process.pid
        if secure_run:  # the same deployment with a key (handed to the child in memory, not argv) and HTTPS
            key_file, cert_file = self_signed_certificate(Path(scratch.name))
            secure = {"key": secrets.token_urlsafe(24), "tls": ssl.create_default_context(cafile=cert_file)}
            children.append(_Child(child_source, dataclasses.replace(
                options, api_keys=(secure["key"],), ssl_keyfile=key_file, ssl_certfile=cert_file)))
            started = children[1].start(timeout=900)
            secure["openai"] = started["openai"]
            secure["deployment"] = {"pid": children[1].process.pid, "metrics": started["metrics"]}
        from ..runtime.decoder import load_tokenizer
        from ..serving.deployment import frontend_config

        config = frontend_config(info["repository"], info["model"], info["grpc"])
        tokenizer = load_tokenizer(config.tokenizer_dir) if config.tokenizer_dir else None
        if tokenizer is None:
            raise DSparkTrtError("the served model has no tokenizer; the OpenAI benchmark sends text prompts")
        prompt_ids = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
        counts = {"request_rounds": 0.0, "accepted": 0.0}
        rows = asyncio.run(_benchmark(info, prompts, prompt_ids, args, counts, secure))
        memory = {name: _peak_memory_mib(c.process.pid) for name, c in zip(("openai", "openai_secure"), children)}
        texts, in_process_acceptance = _in_process(info["repository"], info["model"], prompts, args)
    finally:
        for c in children:
            c.stop()
        scratch.cleanup()
    # every level and path sends the same requests: the acceptance over the run is that of one set of them
    served_acceptance = 1.0 + counts["accepted"] / counts["request_rounds"] if counts["request_rounds"] else None
    served = [(r["text"] if "text" in r else tokenizer.decode(r["ids"], skip_special_tokens=False), i)
              for row in rows for i, r in enumerate(row["results"])]
    equal = sum(text == texts[i] for text, i in served)
    other = "openai_secure" if secure else "grpc"
    base, over = ("openai", other) if secure else (other, "openai")  # the ratio: over / base tokens/s
    pairs = _pairs(rows, base, over)
    per_round = {c: [o["tokens_per_second"] / b["tokens_per_second"] for b, o in pairs[c]] for c in concurrency}
    ratios = {c: statistics.median(v) for c, v in per_round.items()}
    cost = {c: {path: _median_cost([r for r in rows if r["clients"] == c and r["path"] == path])
                for path in ("openai", other)} for c in concurrency}
    if secure:  # the answers of the two front ends, level by level, over all rounds
        same = {c: [sum(a["text"] == b["text"] for bb, oo in pairs[c] for a, b in zip(bb["results"], oo["results"])),
                    requests * args.rounds] for c in concurrency}
    for r in rows:
        r.pop("results")
    key = "secure_over_plain" if secure else "openai_over_grpc"
    report = {"source": str(source), "max_tokens": args.max_tokens, "temperature": args.temperature,
              "requests": requests, "rounds": args.rounds, "rows": rows, key: ratios, f"{key}_rounds": per_round,
              "cpu_ms_per_request": cost, "acceptance_metrics": served_acceptance,
              "acceptance_in_process": in_process_acceptance, "served_equal_to_in_process": [equal, len(served)],
              "peak_memory": memory}
    if secure:
        report["secure_equal_to_plain"] = same
        report["secure_refusals"] = secure["refusals"]
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{requests} requests × max_tokens {args.max_tokens}, temperature {args.temperature}, {args.rounds} "
          f"interleaved round(s) per level, source {source}")
    print("| clients | round | path | wall s | tokens/s | TTFT p50 ms | TTFT p99 ms | latency p50 s | mean batch | "
          "connections opened | CPU ms/request: clients, front end, model |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        c = r["cpu_ms_per_request"]
        batch = "n/a" if r["batch_mean"] is None else f"{r['batch_mean']:.1f}"
        print(f"| {r['clients']} | {r['round']} | {r['path']} | {r['seconds']:.2f} | {r['tokens_per_second']:.1f} | "
              f"{r['ttft_p50_ms']:.0f} | {r['ttft_p99_ms']:.0f} | {r['latency_p50_s']:.3f} | {batch} | "
              f"{r['connections_opened']} | " + ", ".join(f"{v:.2f}" for v in c.values()) + " |")
    title = "secured (API key + HTTPS) / plain front end" if secure else "OpenAI front end / Triton gRPC"
    print(f"{title} tokens/s, median over rounds: " + ", ".join(
        f"{c} clients {v:.2f}x ({' '.join(f'{x:.2f}' for x in per_round[c])})" for c, v in ratios.items()))
    for c, paths in cost.items():
        print(f"CPU ms per request at {c} clients (median over rounds): " + "; ".join(
            f"{path} " + ", ".join(f"{k.replace('_', ' ')} {v:.2f}" for k, v in shares.items())
            for path, shares in paths.items()))
    for name, m in memory.items():
        if m:
            print(f"peak memory, {name} deployment: {m['child_mib']:.0f} MiB front end + supervisor, "
                  f"{m['tree_sum_mib']:.0f} MiB summed over its {m['processes']} processes")
    if secure:
        print("secured answers equal to plain: " + ", ".join(f"{c} clients {e} of {n}" for c, (e, n) in same.items()))
        print("secured front end ({url}): without a key {without_key}, wrong key {wrong_key}, plain HTTP "
              "{plain_http}".format(**secure["refusals"]))
    accept = "n/a (no dspark metrics)" if served_acceptance is None else f"{served_acceptance:.4f}"
    print(f"acceptance length: metrics endpoint {accept}, in-process {in_process_acceptance:.4f}")
    print(f"served answers equal to in-process generate (one batch of the same requests): {equal} of {len(served)}"
          + ("" if equal == len(served) else " (fp32 rounding differs with the batch's shape: a near-tie can flip a "
                                             "greedy token)"))
    return 0
