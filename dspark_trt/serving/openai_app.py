"""The OpenAI-compatible front end: a small ASGI app (Starlette, served by uvicorn) in front of Triton.

It holds no decoding logic. Each request is checked (``openai_protocol``), its prompt tokenized with the
target's tokenizer (chat: the tokenizer's chat template, ``add_generation_prompt=True``), and sent to the
Triton model over its own gRPC stream (``triton_stream``) as token ids; the model's streamed text pieces
become the answer (``stream: true``: server-sent events, one per decoding round, ending in
``data: [DONE]``; events ready at the same moment share one write). The answer's text never includes the
prompt (``echo: true`` on /v1/completions prepends it).

    GET  /health/live           200 while the process and its front end run (a restarting model included)
    GET  /health/ready          200 when the model is ready and the server is not draining, else 503 (the reason)
    GET  /health                the same as /health/ready (no key needed on any of the three)
    GET  /v1/models             the served model while it is ready, else an empty list
    POST /v1/completions        one prompt (text or token ids)
    POST /v1/chat/completions   messages (text content)
    GET  /openapi.json          the API described (OpenAPI 3.1; schemas: ``openai_protocol``'s models); no key needed

With API keys (``FrontendConfig.api_keys``), every other path needs ``Authorization: Bearer KEY``
(``auth.BearerAuth``: a 401 in OpenAI's error shape otherwise). ``OpenAIFrontend`` serves HTTPS when given a
key and certificate.

The drain (``dspark serve`` on SIGTERM, ``Readiness.start_drain``): readiness turns false at once, every new
request is refused with 503 and ``Retry-After``, and requests in flight, streams included, go on to their end;
``OpenAIFrontend.in_flight`` tells the supervisor when none is left.

A client that disconnects closes the request's gRPC stream, which cancels it in Triton. Readiness combines
Triton's own model readiness (polled) with a ``Readiness`` object the supervisor of ``dspark serve`` marks
down when the model's stub dies (Triton keeps answering ready then); requests in flight at that moment are
answered 503 at once instead of waiting forever for a final response.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DSparkTrtError
from .addresses import client_address
from .chat_template import no_template_message
from . import openai_protocol as oa
from .triton_stream import Final, Piece, TritonRequestError, TritonStreamClient, generate_inputs

__all__ = ["FrontendConfig", "Readiness", "create_app", "OpenAIFrontend", "MAX_PROMPT_BYTES", "DRAINING"]

log = logging.getLogger("dspark")

#: readiness's reason while draining, and the refusal's message
DRAINING = "the server is draining (shutting down): retry on another replica"

MAX_PROMPT_BYTES = 256 * 1024  # prompt text per request (the model's own limit on text_input)
MAX_BODY_BYTES = 4 * 1024 * 1024  # request body
DEFAULT_COMPLETION_TOKENS = 16  # /v1/completions without max_tokens (the API's default)
DEFAULT_CHAT_TOKENS = 512  # /v1/chat/completions without a limit, when the context limit is unknown
SMALL_PROMPT_CHARS = 8192  # shorter prompts are tokenized on the event loop, longer ones on a thread


@dataclass
class FrontendConfig:
    """What the front end serves.

    Args:
        triton_grpc: host:port of Triton's gRPC endpoint.
        model: the Triton model's name.
        served_model_name (*optional*): the ``model`` clients send (default: ``model``).
        tokenizer_dir (*optional*): the target's tokenizer (an export's ``tokenizer/``); without one, prompts
            must be token ids and chat is refused.
        chat_template (*optional*): a Jinja chat template replacing the tokenizer's.
        max_context (*optional*): prompt + max_tokens limit (checked here before Triton is asked).
        api_keys (*optional*): keys clients must send (``Authorization: Bearer KEY``); empty: none needed.
    """

    triton_grpc: str
    model: str = "dspark"
    served_model_name: str | None = None
    tokenizer_dir: str | Path | None = None
    chat_template: str | None = None
    max_context: int | None = None
    max_prompt_bytes: int = MAX_PROMPT_BYTES
    ready_poll_seconds: float = 1.0
    api_keys: tuple[str, ...] = field(default=(), repr=False)

    @property
    def name(self) -> str:
        return self.served_model_name or self.model


class Readiness:
    """Whether the model can serve, shared between the supervisor's thread and the app's event loop."""

    def __init__(self):
        self._lock = threading.Lock()
        self._triton_ready = False
        self._down: str | None = None
        self._draining = False
        self._listeners = []

    @property
    def ready(self) -> bool:
        with self._lock:
            return self._triton_ready and self._down is None and not self._draining

    @property
    def reason(self) -> str:
        with self._lock:
            if self._draining:
                return DRAINING
            if self._down is not None:
                return self._down
            return "" if self._triton_ready else "the Triton model is not ready"

    @property
    def draining(self) -> bool:
        with self._lock:
            return self._draining

    def start_drain(self) -> None:
        """Not ready from now on, for good: new requests are refused (503), those in flight go on."""
        with self._lock:
            self._draining = True

    @property
    def marked_down(self) -> bool:
        with self._lock:
            return self._down is not None

    def set_triton_ready(self, ready: bool) -> None:
        with self._lock:
            self._triton_ready = ready

    def mark_down(self, reason: str) -> None:
        """Not ready until ``mark_up``; requests in flight fail with ``reason`` (HTTP 503)."""
        with self._lock:
            self._down = reason
            listeners = list(self._listeners)
        for fn in listeners:
            fn(reason)

    def mark_up(self) -> None:
        with self._lock:
            self._down = None

    def subscribe(self, fn) -> None:
        with self._lock:
            self._listeners.append(fn)


def _error(e: oa.OpenAIError):
    from starlette.responses import JSONResponse

    headers = {"Retry-After": "1"} if e.status == 503 else None
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


def _from_triton(e: TritonRequestError) -> oa.OpenAIError:
    return oa.OpenAIError(e.message, status=e.status)


class _Job:
    """One request in flight: a task streaming from Triton into a queue the handler reads."""

    def __init__(self, app: "_App", tensors, request_id: str):
        self.queue: asyncio.Queue = asyncio.Queue()
        self.app = app
        self.finished = False  # the final response (or an error) arrived: Triton is done with the request
        self.streaming = False  # handed to a server-sent-events response: counted in ``app.streams``
        self.task = asyncio.create_task(self._produce(tensors, request_id))
        app.jobs.add(self)

    async def _produce(self, tensors, request_id: str) -> None:
        try:
            async for piece in self.app.triton.generate(tensors, request_id):
                self.finished = piece.final is not None
                self.queue.put_nowait(piece)
        except TritonRequestError as e:
            self.finished = True
            self.queue.put_nowait(e)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # never leave the handler waiting
            log.exception("request %s failed in the front end", request_id)
            self.queue.put_nowait(TritonRequestError(f"internal error in the front end: {type(e).__name__}: {e}",
                                                     500))

    def abort(self, reason: str) -> None:
        self.queue.put_nowait(TritonRequestError(reason, 503))
        self.task.cancel()

    async def next(self) -> Piece:
        item = await self.queue.get()
        if isinstance(item, TritonRequestError):
            raise item
        return item

    def close(self) -> None:
        if not self.finished:
            self.task.cancel()  # closes the gRPC stream: Triton cancels the request
        if self in self.app.jobs:  # a finished one closes its stream cleanly by itself (triton_stream._drain)
            self.app.jobs.discard(self)
            if self.streaming:
                self.app.streams -= 1


class _App:
    """State and handlers of one front end (see the module docstring)."""

    def __init__(self, config: FrontendConfig, readiness: Readiness):
        self.config, self.readiness = config, readiness
        self.tokenizer = None
        if config.tokenizer_dir is not None:
            from ..runtime.decoder import load_tokenizer

            self.tokenizer = load_tokenizer(config.tokenizer_dir)
        self.chat_template = config.chat_template or getattr(self.tokenizer, "chat_template", None)
        self.triton: TritonStreamClient | None = None
        self.jobs: set[_Job] = set()
        self.entering = 0  # requests inside their handler (a non-streamed one until its answer)
        self.streams = 0  # streamed answers after their handler returned, until their end
        self.created = int(time.time())
        self._poller: asyncio.Task | None = None
        self._openapi: dict | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def startup(self) -> None:
        self.triton = TritonStreamClient(self.config.triton_grpc, self.config.model)
        loop = asyncio.get_running_loop()
        self.readiness.subscribe(lambda reason: loop.call_soon_threadsafe(self._abort_all, reason))
        self.readiness.set_triton_ready(await self.triton.model_ready())
        self._poller = asyncio.create_task(self._poll_readiness())

    async def shutdown(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        for job in list(self.jobs):
            job.close()
        if self.triton is not None:
            await self.triton.close()

    async def _poll_readiness(self) -> None:
        while True:
            await asyncio.sleep(self.config.ready_poll_seconds)
            self.readiness.set_triton_ready(await self.triton.model_ready())

    async def _ready(self) -> bool:
        """Readiness now: Triton is asked again when only its (polled) flag says no."""
        if not self.readiness.ready and not self.readiness.marked_down:
            self.readiness.set_triton_ready(await self.triton.model_ready())
        return self.readiness.ready

    def _abort_all(self, reason: str) -> None:
        for job in list(self.jobs):
            job.abort(reason)

    # -- routes ------------------------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        """Requests between their acceptance and their answer's end (read from the supervisor's thread too)."""
        return self.entering + self.streams

    async def live(self, request):
        from starlette.responses import JSONResponse

        return JSONResponse({"status": "alive", "model": self.config.name, "draining": self.readiness.draining,
                             "in_flight": self.in_flight})

    async def health(self, request):
        from starlette.responses import JSONResponse

        if await self._ready():
            return JSONResponse({"status": "ok", "model": self.config.name})
        return JSONResponse({"status": "unavailable", "model": self.config.name, "reason": self.readiness.reason},
                            status_code=503)

    async def models(self, request):
        from starlette.responses import JSONResponse

        data = []
        if await self._ready():
            data.append({"id": self.config.name, "object": "model", "created": self.created,
                         "owned_by": "dspark-trt", "max_model_len": self.config.max_context})
        return JSONResponse({"object": "list", "data": data})

    async def openapi(self, request):
        from starlette.responses import JSONResponse

        if self._openapi is None:
            from .. import __version__

            self._openapi = oa.openapi_document(keys=bool(self.config.api_keys), model=self.config.name,
                                                version=__version__)
        return JSONResponse(self._openapi)

    async def completions(self, request):
        return await self._handle(request, chat=False)

    async def chat_completions(self, request):
        return await self._handle(request, chat=True)

    # -- one request -------------------------------------------------------------------------------------
    async def _body(self, request) -> dict:
        size = 0
        chunks = []
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise oa.OpenAIError(f"the request body is larger than {MAX_BODY_BYTES} bytes", status=413)
            chunks.append(chunk)
        try:
            body = json.loads(b"".join(chunks))
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            raise oa.OpenAIError(f"the request body is not valid JSON: {e}") from None
        try:  # JSON may spell lone UTF-16 surrogates (\\ud800), which no tokenizer or stop string can take
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise oa.OpenAIError("the request body holds a lone surrogate (an escape like \\ud800 without its "
                                 "pair): send valid Unicode text") from None
        return body

    async def _handle(self, request, *, chat: bool):
        if self.readiness.draining:
            return _error(oa.OpenAIError(DRAINING, status=503))
        self.entering += 1
        try:
            return await self._accepted(request, chat=chat)
        finally:
            self.entering -= 1

    async def _accepted(self, request, *, chat: bool):
        try:
            body = await self._body(request)
            req = oa.parse_chat(body) if chat else oa.parse_completion(body)
            if req.model != self.config.name:
                raise oa.OpenAIError(f"the model {req.model!r} does not exist: this server serves "
                                     f"{self.config.name!r} (GET /v1/models)", status=404, param="model",
                                     code="model_not_found")
            if not await self._ready():
                raise oa.OpenAIError(f"the model is not ready ({self.readiness.reason}); retry shortly", status=503)
            prompt_ids, prompt_text = await self._prompt(req, chat)
            max_tokens = self._max_tokens(req, len(prompt_ids), chat)
        except oa.OpenAIError as e:
            return _error(e)
        tensors = generate_inputs(prompt_ids, max_tokens, temperature=req.temperature, seed=req.seed,
                                  stop=req.stop, top_p=req.top_p, top_k=req.top_k)
        rid = oa.new_id("chatcmpl" if chat else "cmpl")
        job = _Job(self, tensors, rid)
        try:
            first = await self._until_disconnect(request, job.next())
        except TritonRequestError as e:
            job.close()
            return _error(_from_triton(e))
        except BaseException:
            job.close()
            raise
        if first is None:  # the client left before the first round
            job.close()
            from starlette.responses import Response

            return Response(status_code=499)
        echo = prompt_text if (not chat and req.echo) else None
        if req.stream:
            from sse_starlette.sse import EventSourceResponse

            job.streaming = True
            self.streams += 1
            return EventSourceResponse(self._events(job, first, req, rid, chat, len(prompt_ids), echo),
                                       ping=15, sep="\n")
        try:
            answer = await self._until_disconnect(request, self._collect(job, first))
        except TritonRequestError as e:
            return _error(_from_triton(e))
        finally:
            job.close()
        if answer is None:
            from starlette.responses import Response

            return Response(status_code=499)
        text, count, final = answer
        usage = oa.usage(final.prompt_tokens if final.prompt_tokens is not None else len(prompt_ids), count)
        build = oa.chat_response if chat else oa.completion_response
        from starlette.responses import JSONResponse

        return JSONResponse(build(rid, self.config.name, (echo or "") + text, final.finish_reason, usage,
                                  oa.dspark_stats(final)))

    async def _prompt(self, req, chat: bool) -> tuple[list[int], str | None]:
        """Token ids of the prompt (and its text, for echo)."""
        tok = self.tokenizer
        if chat:
            if tok is None:
                raise oa.OpenAIError("this model has no tokenizer, so it cannot serve chat: use /v1/completions "
                                     "with token ids", param="messages")
            if not self.chat_template:
                raise oa.OpenAIError(no_template_message(), param="messages")
            size = sum(len(m["content"].encode("utf-8")) for m in req.messages)
            self._check_size(size, "messages")
            try:
                text = tok.apply_chat_template(req.messages, tokenize=False, add_generation_prompt=True,
                                               chat_template=self.chat_template)
            except Exception as e:  # the template's own raise_exception, or a malformed template
                raise oa.OpenAIError(f"the chat template refused the messages: {e}", param="messages") from None
        elif isinstance(req.prompt, str):
            if tok is None:
                raise oa.OpenAIError("this model has no tokenizer: send the prompt as a list of token ids",
                                     param="prompt")
            self._check_size(len(req.prompt.encode("utf-8")), "prompt")
            text = req.prompt
        else:  # token ids: the context limit bounds them
            text = None
            if tok is not None and req.echo:
                try:
                    text = tok.decode(req.prompt, skip_special_tokens=False)
                except Exception:  # an id beyond the vocabulary (the model would refuse it the same way)
                    raise oa.OpenAIError("'prompt' holds a token id outside the model's vocabulary",
                                         param="prompt") from None
            return list(req.prompt), text
        encode = lambda: tok.encode(text, add_special_tokens=False)  # noqa: E731  (as SpeculativeDecoder does)
        ids = encode() if len(text) <= SMALL_PROMPT_CHARS else await asyncio.to_thread(encode)
        if not ids:
            raise oa.OpenAIError("the prompt tokenizes to nothing: send some text", param="messages" if chat
                                 else "prompt")
        return ids, text

    def _check_size(self, size: int, param: str) -> None:
        if size > self.config.max_prompt_bytes:
            raise oa.OpenAIError(f"the prompt is {size} bytes, more than this server accepts "
                                 f"({self.config.max_prompt_bytes}); send a shorter prompt", param=param,
                                 code="context_length_exceeded")

    def _max_tokens(self, req, prompt_len: int, chat: bool) -> int:
        limit = self.config.max_context
        name = "max_completion_tokens" if chat else "max_tokens"
        if limit is not None and prompt_len >= limit:
            raise oa.OpenAIError(f"the prompt has {prompt_len} tokens, the model's context is {limit}: send a "
                                 f"shorter prompt", param="messages" if chat else "prompt",
                                 code="context_length_exceeded")
        if req.max_tokens is None:
            if chat:
                return limit - prompt_len if limit is not None else DEFAULT_CHAT_TOKENS
            return min(DEFAULT_COMPLETION_TOKENS, limit - prompt_len) if limit is not None else \
                DEFAULT_COMPLETION_TOKENS
        if limit is not None and prompt_len + req.max_tokens > limit:
            raise oa.OpenAIError(f"the prompt ({prompt_len} tokens) + {name} ({req.max_tokens}) exceeds the "
                                 f"model's context of {limit} tokens; ask for at most {limit - prompt_len}",
                                 param=name, code="context_length_exceeded")
        return req.max_tokens

    async def _until_disconnect(self, request, awaitable):
        """``awaitable``'s result, or None when the client disconnects first (the awaitable is cancelled)."""
        work = asyncio.ensure_future(awaitable)
        watch = asyncio.ensure_future(_disconnected(request))
        try:
            done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
        if work in done:
            return work.result()
        work.cancel()
        return None

    async def _collect(self, job: _Job, first: Piece) -> tuple[str, int, Final]:
        texts, count, piece = [first.text], len(first.ids), first
        while piece.final is None:
            piece = await job.next()
            texts.append(piece.text)
            count += len(piece.ids)
        return "".join(texts), count, piece.final

    async def _events(self, job: _Job, first: Piece, req, rid: str, chat: bool, prompt_len: int, echo: str | None):
        """Server-sent events of one streamed answer, encoded; the generator closing early cancels the request.

        Events ready at the same moment go out as one chunk (one write to the socket, one TLS record): the role
        chunk with the first text, pieces that queued up while the previous chunk was being sent, and the last
        text with its usage chunk and ``[DONE]``. The bytes of the stream are the same as one event a chunk."""
        from sse_starlette.event import ServerSentEvent

        name, created = self.config.name, int(time.time())
        event = lambda obj: ServerSentEvent(json.dumps(obj, separators=(",", ":")), sep="\n").encode()  # noqa: E731
        ready: list[bytes] = []  # encoded events not sent yet
        count = 0
        try:
            if chat:
                ready.append(event(oa.chat_chunk(rid, name, created, {"role": "assistant", "content": ""})))
            elif echo:
                ready.append(event(oa.completion_chunk(rid, name, created, echo)))
            piece = first
            while True:
                count += len(piece.ids)
                final = piece.final
                stats = oa.dspark_stats(final) if final is not None else None
                reason = final.finish_reason if final is not None else None
                if piece.text or final is not None:
                    if chat:
                        delta = {"content": piece.text} if piece.text else {}
                        ready.append(event(oa.chat_chunk(rid, name, created, delta, reason, stats)))
                    else:
                        ready.append(event(oa.completion_chunk(rid, name, created, piece.text, reason, stats)))
                if final is not None:
                    break
                if job.queue.empty() and ready:  # nothing more to add now: send what is ready, then wait
                    yield b"".join(ready)
                    ready = []
                piece = await job.next()
            if req.include_usage:
                prompt_tokens = final.prompt_tokens if final.prompt_tokens is not None else prompt_len
                obj = "chat.completion.chunk" if chat else "text_completion"
                ready.append(event(oa.usage_chunk(rid, name, created, obj, oa.usage(prompt_tokens, count), stats)))
        except TritonRequestError as e:
            ready.append(event(_from_triton(e).body()))
        finally:
            job.close()  # also when the client left: the generator is closed, the Triton request cancelled
        # reached only when the answer ended (or failed) with the client still there
        yield b"".join(ready) + ServerSentEvent("[DONE]", sep="\n").encode()


async def _disconnected(request) -> None:
    """Return when the client closes the connection (the body has been read: only ``http.disconnect`` is left)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def create_app(config: FrontendConfig, readiness: Readiness | None = None):
    """The ASGI app (Starlette) for ``config``; ``readiness`` shares the model's state with a supervisor."""
    from contextlib import asynccontextmanager

    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.routing import Route

    from .auth import BearerAuth

    state = _App(config, readiness or Readiness())

    @asynccontextmanager
    async def lifespan(app):
        await state.startup()
        try:
            yield
        finally:
            await state.shutdown()

    routes = [Route("/health", state.health, methods=["GET"]),
              Route("/health/ready", state.health, methods=["GET"]),
              Route("/health/live", state.live, methods=["GET"]),
              Route("/openapi.json", state.openapi, methods=["GET"]),
              Route("/v1/models", state.models, methods=["GET"]),
              Route("/v1/completions", state.completions, methods=["POST"]),
              Route("/v1/chat/completions", state.chat_completions, methods=["POST"])]
    app = Starlette(routes=routes, lifespan=lifespan, middleware=[Middleware(BearerAuth, keys=config.api_keys)])
    app.state.dspark = state
    return app


class OpenAIFrontend:
    """The app served by uvicorn on a background thread (``start`` / ``stop``; a context manager).

    Args:
        config: what to serve.
        host, port: where to listen (port 0: any free port; ``port`` holds the chosen one after ``start``).
        readiness (*optional*): shared with the supervisor of ``dspark serve``.
        access_log (bool): uvicorn's per-request log lines (the request line: never a header, so never a key).
        ssl_keyfile, ssl_certfile (*optional*): serve HTTPS with this private key and certificate (PEM; both).
    """

    def __init__(self, config: FrontendConfig, *, host: str = "127.0.0.1", port: int = 9000,
                 readiness: Readiness | None = None, access_log: bool = False, ssl_keyfile: str | None = None,
                 ssl_certfile: str | None = None):
        self.config, self.host, self.port = config, host, port
        self.readiness = readiness or Readiness()
        self.access_log = access_log
        if (ssl_keyfile is None) != (ssl_certfile is None):
            raise DSparkTrtError("HTTPS needs both --ssl-keyfile and --ssl-certfile (the private key and its "
                                 "certificate); pass both, or neither for plain HTTP")
        self.ssl_keyfile, self.ssl_certfile = ssl_keyfile, ssl_certfile
        self._server = None
        self._state: _App | None = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self.chat_available = False

    def in_flight(self) -> int:
        """Requests in flight now (0 before the start): what a drain waits for."""
        return self._state.in_flight if self._state is not None else 0

    @property
    def url(self) -> str:
        """The base URL a client uses (a wildcard bind's at loopback: ``serving/addresses.py``)."""
        scheme = "https" if self.ssl_certfile else "http"
        return f"{scheme}://{client_address(self.host, self.port)}/v1"

    def _check_tls(self) -> None:
        """The key and certificate load (what uvicorn does at its start, where a failure reads badly)."""
        import ssl

        try:
            # a password callable: an encrypted key fails here instead of prompting on the terminal
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(self.ssl_certfile, self.ssl_keyfile,
                                                                    password=lambda: b"")
        except (OSError, ssl.SSLError) as e:
            raise DSparkTrtError(f"cannot serve HTTPS with --ssl-certfile {self.ssl_certfile} and --ssl-keyfile "
                                 f"{self.ssl_keyfile} ({getattr(e, 'strerror', None) or e}); pass a PEM "
                                 f"certificate and its unencrypted private key") from None

    def bind(self) -> "OpenAIFrontend":
        """Take the port now (``start`` serves on it): a busy port fails before anything else starts."""
        if self._socket is not None:
            return self
        if self.ssl_certfile:
            self._check_tls()
        # proto IPPROTO_TCP, not 0: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on sockets that say
        # they are TCP, and with it on, every response waits ~40 ms for the client's delayed ACK
        host = self.host.strip("[]")
        ipv6 = ":" in host
        sock = socket.socket(socket.AF_INET6 if ipv6 else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if ipv6:  # the family asked for only: '::' is IPv6's every address, not IPv4's too
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            sock.bind((host, self.port))
        except OSError as e:
            sock.close()
            raise DSparkTrtError(f"the OpenAI front end cannot listen on {self.host}:{self.port} ({e.strerror}); "
                                 f"pass another --openai-port (0 = any free port)") from None
        self.port = sock.getsockname()[1]
        self._socket = sock
        return self

    def start(self, timeout: float = 60.0) -> "OpenAIFrontend":
        """Serve (on a thread) once Triton is up: the app's gRPC channel connects at its start."""
        import uvicorn

        sock = self.bind()._socket
        app = create_app(self.config, self.readiness)
        self._state = state = app.state.dspark
        self.chat_available = state.tokenizer is not None and state.chat_template is not None
        config = uvicorn.Config(app, log_level="warning", access_log=self.access_log, lifespan="on",
                                timeout_graceful_shutdown=3, timeout_keep_alive=30, ssl_keyfile=self.ssl_keyfile,
                                ssl_certfile=self.ssl_certfile)
        if self.access_log:  # uvicorn set its access logger to log_level (warning), which drops every access line
            logging.getLogger("uvicorn.access").setLevel(logging.INFO)
        self._server = server = uvicorn.Server(config)
        self._thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="dspark-openai",
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                sock.close()
                raise DSparkTrtError(f"the OpenAI front end did not start on {self.host}:{self.port}; see the "
                                     f"log above")
            time.sleep(0.05)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self._server is None and self._socket is not None:  # bound, never started
            self._socket.close()
        self._socket = None
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(timeout)
        self._thread = self._server = None

    def __enter__(self) -> "OpenAIFrontend":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
