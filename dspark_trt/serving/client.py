"""Small clients of the served model (tests, ``dspark bench serve``, examples): gRPC streams via tritonclient,
HTTP ``generate`` / ``generate_stream`` via the standard library, and a scrape of the metrics endpoint.

A decoupled model refuses plain (non-streaming) inference calls, so gRPC always goes through a stream
(one response per request with ``stream=false``, one per round with ``stream=true``; the one carrying
``finish_reason`` is the last). HTTP ``generate`` answers one JSON object per request, ``generate_stream``
one server-sent event per response.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Answer", "ServerError", "grpc_generate", "http_generate", "http_generate_stream", "request_inputs",
           "scrape_metrics"]


class ServerError(Exception):
    """An error response: ``status`` is the HTTP code (None for gRPC), ``message`` the server's text."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.message, self.status = message, status


@dataclass
class Answer:
    """One request's responses, merged: ``ids``/``text`` concatenated over ``chunks`` (streaming)."""

    chunks: list[list[int]] = field(default_factory=list)  # output_ids of each response, in arrival order
    texts: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    mean_acceptance_length: float | None = None
    drafted: int | None = None
    accepted: int | None = None
    batch_size: int | None = None
    prompt_tokens: int | None = None
    rounds: int | None = None
    seconds: float = 0.0  # from sending to the final response

    @property
    def ids(self) -> list[int]:
        return [t for c in self.chunks for t in c]

    @property
    def text(self) -> str:
        return "".join(self.texts)

    def add(self, outputs: dict) -> None:
        ids = outputs.get("output_ids", [])
        self.chunks.append([int(ids)] if np.isscalar(ids) else [int(t) for t in np.asarray(ids).reshape(-1)])
        text = outputs.get("text_output", "")
        text = np.asarray(text, dtype=object).reshape(-1)[0] if not isinstance(text, str) else text
        self.texts.append(text.decode("utf-8") if isinstance(text, bytes) else str(text))
        if "finish_reason" in outputs:
            reason = np.asarray(outputs["finish_reason"], dtype=object).reshape(-1)[0]
            self.finish_reason = reason.decode() if isinstance(reason, bytes) else str(reason)
            for key, kind in (("mean_acceptance_length", float), ("drafted", int), ("accepted", int),
                              ("batch_size", int), ("prompt_tokens", int), ("rounds", int)):
                if key in outputs:
                    setattr(self, key, kind(np.asarray(outputs[key]).reshape(-1)[0]))


def request_inputs(prompt, max_tokens: int, *, temperature: float | None = None, seed: int | None = None,
                   stream: bool | None = None, end_id=None, stop: list[str] | None = None,
                   top_p: float | None = None, top_k: int | None = None) -> dict[str, np.ndarray]:
    """The input tensors of one request (``prompt``: text or token ids)."""
    tensors = {"max_tokens": np.array([max_tokens], dtype=np.int32)}
    if isinstance(prompt, str):
        tensors["text_input"] = np.array([prompt.encode("utf-8")], dtype=np.object_)
    else:
        tensors["input_ids"] = np.asarray(prompt, dtype=np.int64).reshape(-1)
    if temperature is not None:
        tensors["temperature"] = np.array([temperature], dtype=np.float32)
    if seed is not None:
        tensors["seed"] = np.array([seed], dtype=np.int64)
    if stream is not None:
        tensors["stream"] = np.array([stream], dtype=np.bool_)
    if end_id is not None:
        tensors["end_id"] = np.asarray(end_id, dtype=np.int64).reshape(-1)
    if stop is not None:
        tensors["stop"] = np.array([s.encode("utf-8") for s in stop], dtype=np.object_)
    if top_p is not None:
        tensors["top_p"] = np.array([top_p], dtype=np.float32)
    if top_k is not None:
        tensors["top_k"] = np.array([top_k], dtype=np.int32)
    return tensors


_NP_TO_TRITON = {np.dtype(np.int32): "INT32", np.dtype(np.int64): "INT64", np.dtype(np.float32): "FP32",
                 np.dtype(np.float64): "FP64", np.dtype(np.bool_): "BOOL", np.dtype(np.object_): "BYTES"}


def grpc_generate(url: str, model: str, requests: list[dict[str, np.ndarray]], *, timeout: float = 300.0
                  ) -> list[Answer | ServerError]:
    """Send every request on one gRPC stream at once; wait for all final responses (or errors)."""
    import tritonclient.grpc as grpcclient

    answers: list[Answer | ServerError] = [Answer() for _ in requests]
    done = [threading.Event() for _ in requests]
    errors: queue.Queue = queue.Queue()
    starts = [0.0] * len(requests)

    def callback(result, error):
        if error is not None:
            errors.put(str(error))
            return
        i = int(result.get_response().id)
        outputs = {o.name: result.as_numpy(o.name) for o in result.get_response().outputs}
        answers[i].add(outputs)
        if answers[i].finish_reason is not None:
            answers[i].seconds = time.perf_counter() - starts[i]
            done[i].set()

    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=callback)
    try:
        for i, tensors in enumerate(requests):
            inputs = []
            for name, value in tensors.items():
                t = grpcclient.InferInput(name, list(value.shape), _NP_TO_TRITON[value.dtype])
                t.set_data_from_numpy(value)
                inputs.append(t)
            starts[i] = time.perf_counter()
            client.async_stream_infer(model, inputs, request_id=str(i))
        deadline = time.monotonic() + timeout
        pending = set(range(len(requests)))
        while pending and time.monotonic() < deadline:
            pending = {i for i in pending if not done[i].is_set()}
            # errors carry no request id: with several requests in flight they are matched in order
            while not errors.empty() and pending:
                i = min(pending)
                answers[i] = ServerError(errors.get())
                done[i].set()
                pending.discard(i)
            time.sleep(0.01)
        if pending:
            raise TimeoutError(f"no final response for {len(pending)} gRPC request(s) after {timeout:.0f} s")
    finally:
        client.stop_stream()
        client.close()
    return answers


def _post(url: str, payload: dict, timeout: float):
    data = json.dumps(payload).encode()
    return urllib.request.urlopen(urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}),
                                  timeout=timeout)


def http_generate(url: str, model: str, payload: dict, *, timeout: float = 300.0) -> Answer:
    """POST /v2/models/<model>/generate; ``ServerError`` (with the HTTP status) for an error answer."""
    start = time.perf_counter()
    try:
        with _post(f"http://{url}/v2/models/{model}/generate", payload, timeout) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise ServerError(_error_text(e.read()), e.code) from None
    if "error" in body:
        raise ServerError(body["error"], 200)
    answer = Answer()
    answer.add(body)
    answer.seconds = time.perf_counter() - start
    return answer


def http_generate_stream(url: str, model: str, payload: dict, *, timeout: float = 300.0,
                         stop_after: int | None = None) -> Answer:
    """POST /v2/models/<model>/generate_stream (server-sent events); ``stop_after`` n events: hang up early."""
    start = time.perf_counter()
    answer = Answer()
    try:
        response = _post(f"http://{url}/v2/models/{model}/generate_stream", payload, timeout)
    except urllib.error.HTTPError as e:
        raise ServerError(_error_text(e.read()), e.code) from None
    with response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            event = json.loads(line[len("data:"):])
            if "error" in event:
                raise ServerError(event["error"], 200)
            answer.add(event)
            if stop_after is not None and len(answer.chunks) >= stop_after:
                break  # closing the connection cancels the request on the server
    answer.seconds = time.perf_counter() - start
    return answer


def _error_text(body: bytes) -> str:
    try:
        return json.loads(body).get("error", body.decode())
    except ValueError:
        return body.decode(errors="replace")


def scrape_metrics(url: str, prefix: str = "", *, timeout: float = 10.0) -> dict[tuple[str, frozenset], float]:
    """Samples of a Prometheus endpoint (``TritonServer.endpoints.metrics``) whose name starts with ``prefix``:
    ``{(name, frozenset(labels.items())): value}`` (histograms as their ``_bucket`` / ``_sum`` / ``_count``)."""
    from ..optional import require

    require("prometheus_client", "reading Prometheus metrics")
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=timeout) as r:
        text = r.read().decode()
    return {(s.name, frozenset(s.labels.items())): float(s.value)
            for family in text_string_to_metric_families(text) for s in family.samples if s.name.startswith(prefix)}
