"""One generation request to the served model over its own gRPC stream (asyncio, ``tritonclient.grpc.aio``).

The OpenAI front end and ``dspark bench serve`` talk to Triton through this module and nothing else. Each
request opens one bidirectional ``ModelStreamInfer`` call, sends one request with ``stream=true`` and reads
one response per decoding round until the response that carries ``finish_reason``; closing the call early
(the caller stops iterating, or its task is cancelled) cancels the request in Triton, which the model sees
as ``is_cancelled()`` at the next round boundary.

A streamed error carries only a message (Triton's stream protocol has no status code), so
``http_status`` reads the status from the model's wording: "server busy" and an unhealthy stub → 503,
the model's "internal error" / "decoding failed" → 500, anything else the model refused → 400.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import AsyncIterator

import numpy as np

__all__ = ["Final", "Piece", "TritonRequestError", "TritonStreamClient", "http_status", "generate_inputs"]

#: final-response outputs → Python type (the model's contract; each is optional in what comes back)
FINAL_FIELDS = {"finish_reason": str, "prompt_tokens": int, "rounds": int, "mean_acceptance_length": float,
                "drafted": int, "accepted": int, "batch_size": int}
_NP_TO_TRITON = {np.dtype(np.int32): "INT32", np.dtype(np.int64): "INT64", np.dtype(np.float32): "FP32",
                 np.dtype(np.bool_): "BOOL", np.dtype(np.object_): "BYTES"}


@dataclass
class Final:
    """What the last response of a request reports (None: the model did not send that output)."""

    finish_reason: str
    prompt_tokens: int | None = None
    rounds: int | None = None
    mean_acceptance_length: float | None = None
    drafted: int | None = None
    accepted: int | None = None
    batch_size: int | None = None


@dataclass
class Piece:
    """One response: this round's committed text and token ids; ``final`` on the last one."""

    text: str
    ids: list[int] = field(default_factory=list)
    final: Final | None = None


class TritonRequestError(Exception):
    """A request Triton (or the model) refused or failed; ``status`` is the HTTP status it maps to."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.message, self.status = message, status


#: wording of the model's and Triton's errors → HTTP status, first match wins (lower-case substrings)
STATUS_BY_WORDING = (
    ("server busy", 503),
    ("not healthy", 503),  # "Stub process 'dspark_0_0' is not healthy."
    ("is not ready", 503),
    ("unavailable", 503),
    ("request for unknown model", 503),  # the model is unloaded (a reload in progress)
    ("internal error", 500),
    ("decoding failed", 500),
)


def http_status(message: str) -> int:
    """The HTTP status for a Triton error message (see the module docstring)."""
    low = message.lower()
    return next((status for wording, status in STATUS_BY_WORDING if wording in low), 400)


def generate_inputs(prompt_ids: list[int], max_tokens: int, *, temperature: float = 0.0, seed: int = 0,
                    stop: list[str] | None = None, top_p: float | None = None, top_k: int | None = None
                    ) -> dict[str, np.ndarray]:
    """The model's input tensors for one streamed request (the optional ones only when they are set)."""
    tensors = {"input_ids": np.asarray(prompt_ids, dtype=np.int64).reshape(-1),  # [T] int64
               "max_tokens": np.array([max_tokens], dtype=np.int32),
               "temperature": np.array([temperature], dtype=np.float32),
               "seed": np.array([seed], dtype=np.int64),
               "stream": np.array([True], dtype=np.bool_)}
    if stop:
        tensors["stop"] = np.array([s.encode("utf-8") for s in stop], dtype=np.object_)  # [S] bytes
    if top_p is not None and top_p < 1.0:
        tensors["top_p"] = np.array([top_p], dtype=np.float32)
    if top_k:
        tensors["top_k"] = np.array([top_k], dtype=np.int32)
    return tensors


def _scalar(result, name: str, kind):
    value = np.asarray(result.as_numpy(name)).reshape(-1)[0]
    if kind is str:
        return value.decode("utf-8") if isinstance(value, bytes) else str(value)
    return kind(value)


def _piece(result) -> Piece:
    names = {o.name for o in result.get_response().outputs}
    text = _scalar(result, "text_output", str) if "text_output" in names else ""
    ids = [int(t) for t in np.asarray(result.as_numpy("output_ids")).reshape(-1)] if "output_ids" in names else []
    final = None
    if "finish_reason" in names:
        values = {k: _scalar(result, k, kind) for k, kind in FINAL_FIELDS.items() if k in names}
        final = Final(**values)
    return Piece(text, ids, final)


async def _drain(call, timeout: float = 10.0) -> None:
    """Wait for Triton to close a finished stream itself (the request side is already closed).

    Cancelling a stream whose final response has arrived races with Triton's own completion of it, and
    tritonserver 2.51 then sometimes keeps the model referenced: it never unloads, and a stop waits for the
    whole exit timeout. Closing cleanly costs nothing: the server ends the stream right after the final
    response (measured: ~20 ms)."""
    try:
        await asyncio.wait_for(_until_end(call), timeout)
    except (asyncio.TimeoutError, Exception):
        call.cancel()


async def _until_end(call) -> None:
    async for _ in call:
        pass


class TritonStreamClient:
    """Streams requests to one model of a Triton server (``url``: host:port of its gRPC endpoint).

    Create and use it inside one event loop (the gRPC channel belongs to it); ``close()`` when done.
    """

    def __init__(self, url: str, model: str):
        import tritonclient.grpc as grpcclient
        import tritonclient.grpc.aio as grpcaio

        self.url, self.model = url, model
        keepalive = grpcclient.KeepAliveOptions()
        options = [  # tritonclient's defaults, plus a short reconnect backoff: the front end may start before
            # Triton (or see it restart), and gRPC's default backoff grows to two minutes
            ("grpc.max_send_message_length", grpcclient.MAX_GRPC_MESSAGE_SIZE),
            ("grpc.max_receive_message_length", grpcclient.MAX_GRPC_MESSAGE_SIZE),
            ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
            ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
            ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
            ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
        ]
        self._client = grpcaio.InferenceServerClient(url, channel_args=options)

    async def generate(self, tensors: dict[str, np.ndarray], request_id: str = "") -> AsyncIterator[Piece]:
        """Yield the request's responses in order, ending with the one whose ``final`` is set.

        Raises ``TritonRequestError`` for an error response or an unreachable server. Leaving the loop early
        (or cancelling the task) closes the stream, which cancels the request in Triton.
        """
        import grpc
        import tritonclient.grpc as grpcclient

        inputs = []
        for name, value in tensors.items():
            t = grpcclient.InferInput(name, list(value.shape), _NP_TO_TRITON[value.dtype])
            t.set_data_from_numpy(value)
            inputs.append(t)

        async def one_request():
            yield {"model_name": self.model, "inputs": inputs, "request_id": request_id}

        call = self._client.stream_infer(one_request())
        finished = False
        try:
            async for result, error in call:
                if error is not None:
                    finished = True  # an error response is final
                    message = error.message() or str(error)
                    raise TritonRequestError(message, http_status(message))
                piece = _piece(result)
                finished = piece.final is not None
                yield piece
                if finished:
                    return
            raise TritonRequestError("the Triton stream closed before the final response (the server stopped or "
                                     "the model was unloaded)", 503)
        except grpc.RpcError as e:
            detail = e.details() if callable(getattr(e, "details", None)) else str(e)
            raise TritonRequestError(f"Triton is unreachable at {self.url}: {detail}", 503) from None
        finally:
            if not finished:
                call.cancel()  # cancels the request in Triton
            else:
                await _drain(call)

    async def model_ready(self, timeout: float = 2.0) -> bool:
        """Triton's readiness for the model (False when the server does not answer)."""
        try:
            return bool(await self._client.is_model_ready(self.model, client_timeout=timeout))
        except Exception:
            return False

    async def close(self) -> None:
        await self._client.close()
