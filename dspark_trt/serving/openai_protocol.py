"""The OpenAI API's request and response bodies for the front end (``openai_app.py``); no I/O here.

The bodies are pydantic models (as vLLM defines its OpenAI protocol): ``CompletionRequestBody`` and
``ChatRequestBody`` check a request (types, ranges, unknown fields: strict, nothing coerced), the response
models describe what the builders below return, and ``openapi_document`` describes the API from them
(``GET /openapi.json``). ``parse_completion`` / ``parse_chat`` validate a decoded JSON body, check what
spans fields (one prompt, ``stream_options`` with ``stream``, ``max_tokens`` vs ``max_completion_tokens``)
and return a ``CompletionRequest`` / ``ChatRequest``, or raise ``OpenAIError`` (HTTP 400 in OpenAI's error
shape, ``param`` naming the field, pydantic's words for what was wrong).
Every field the API defines is either honoured or refused: a parameter this server cannot honour
(``n`` > 1, ``logprobs``, penalties ≠ 0, ``logit_bias``, tools, structured output, ``suffix``…) is an
error that names it, never a silent ignore; unknown fields are refused the same way. Metadata that does
not change the output (``user``, ``metadata``, ``store: false``) is accepted.

Defaults follow the API: ``temperature`` 1 (0 = greedy), ``top_p`` 1, ``max_tokens`` 16 for completions
and the rest of the context for chat; a sampled request without ``seed`` gets a random one. Extensions
(as in vLLM): ``top_k`` (0 or −1 = off); the ``dspark`` object in responses (speculation figures).
"""

from __future__ import annotations

import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

__all__ = ["OpenAIError", "CompletionRequest", "ChatRequest", "parse_completion", "parse_chat", "error_body",
           "MAX_STOP", "MAX_SEED", "usage", "dspark_stats", "completion_response", "chat_response",
           "completion_chunk", "chat_chunk", "usage_chunk", "new_id"]

MAX_STOP = 4  # stop strings per request (OpenAI's limit)
MAX_SEED = 2**63 - 1
MAX_INT32 = 2**31 - 1  # max_tokens and top_k travel to the model as int32
MAX_TOKEN_ID = 2**63 - 1  # token ids travel as int64 (the model checks them against its vocabulary)

# Fields the API defines that this server refuses unless they hold their neutral value: name → (is it
# neutral?, why it is refused). The message names the field and says what to send instead.
_NEUTRAL_ONLY = {
    "n": (lambda v: v in (None, 1), "one choice per request: send n = 1 (or send the request n times)"),
    "best_of": (lambda v: v in (None, 1), "best_of needs several candidates per request: send best_of = 1"),
    "logprobs": (lambda v: v in (None, False), "log probabilities are not returned by this server"),
    "top_logprobs": (lambda v: v in (None, 0), "log probabilities are not returned by this server"),
    "presence_penalty": (lambda v: v in (None, 0, 0.0), "penalties change the target's distribution, which "
                         "speculative decoding must reproduce exactly: send 0"),
    "frequency_penalty": (lambda v: v in (None, 0, 0.0), "penalties change the target's distribution, which "
                          "speculative decoding must reproduce exactly: send 0"),
    "repetition_penalty": (lambda v: v in (None, 1, 1.0), "penalties change the target's distribution, which "
                           "speculative decoding must reproduce exactly: send 1"),
    "logit_bias": (lambda v: v in (None, {}), "logit_bias changes the target's distribution: send none"),
    "suffix": (lambda v: v in (None, ""), "insertion (suffix) is not supported"),
    "tools": (lambda v: v in (None, []), "tool calling is not supported"),
    "tool_choice": (lambda v: v in (None, "none"), "tool calling is not supported"),
    "parallel_tool_calls": (lambda v: v is None, "tool calling is not supported"),
    "functions": (lambda v: v in (None, []), "function calling is not supported"),
    "function_call": (lambda v: v in (None, "none"), "function calling is not supported"),
    "response_format": (lambda v: v is None or (isinstance(v, dict) and v.get("type") == "text"),
                        "structured output (json_object / json_schema) is not supported: send type 'text'"),
    "audio": (lambda v: v is None, "audio output is not supported"),
    "modalities": (lambda v: v in (None, ["text"]), "only text output is supported"),
    "prediction": (lambda v: v is None, "predicted outputs are not supported"),
    "web_search_options": (lambda v: v is None, "web search is not supported"),
    "store": (lambda v: v in (None, False), "stored completions are not supported"),
}
#: fields whose values come in several shapes: one message for all of them (pydantic's would name each shape)
_SHAPES = {
    "prompt": "'prompt' must be a string or a list of token ids (integers >= 0)",
    "stop": f"'stop' must be a non-empty string or a list of at most {MAX_STOP} non-empty strings",
    "content": "must be a string or a list of text parts ({\"type\": \"text\", \"text\": ...})",
}
_HINTS = {"model": ": the name of a model from GET /v1/models"}  # after "'model' is required"


class OpenAIError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None,
                 type: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message, self.status, self.param, self.code = message, status, param, code
        self.type = type or ("invalid_request_error" if status < 500 else
                             "server_busy" if status == 503 else "server_error")

    def body(self) -> dict:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def error_body(message: str, *, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


# -- request bodies: pydantic models (the checks, and the OpenAPI document's schemas) -------------------------
def _neutral(value: Any, info: ValidationInfo) -> Any:
    neutral, why = _NEUTRAL_ONLY[info.field_name]
    if not neutral(value):
        raise PydanticCustomError("unsupported_parameter", "unsupported parameter '{name}' = {value}: {why}",
                                  {"name": info.field_name, "value": _short(value), "why": why})
    return value


#: what each neutral-only parameter accepts, as JSON Schema (the OpenAPI document says exactly what passes)
_NEUTRAL_SCHEMA = {
    "n": {"enum": [None, 1]}, "best_of": {"enum": [None, 1]}, "logprobs": {"enum": [None, False]},
    "top_logprobs": {"enum": [None, 0]}, "presence_penalty": {"enum": [None, 0]},
    "frequency_penalty": {"enum": [None, 0]}, "repetition_penalty": {"enum": [None, 1]},
    "logit_bias": {"anyOf": [{"type": "null"}, {"type": "object", "maxProperties": 0}]},
    "suffix": {"enum": [None, ""]}, "tools": {"anyOf": [{"type": "null"}, {"type": "array", "maxItems": 0}]},
    "tool_choice": {"enum": [None, "none"]}, "parallel_tool_calls": {"type": "null"},
    "functions": {"anyOf": [{"type": "null"}, {"type": "array", "maxItems": 0}]},
    "function_call": {"enum": [None, "none"]},
    "response_format": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"type": {"const": "text"}},
                                                     "required": ["type"]}]},
    "audio": {"type": "null"}, "modalities": {"anyOf": [{"type": "null"}, {"const": ["text"]}]},
    "prediction": {"type": "null"}, "web_search_options": {"type": "null"}, "store": {"enum": [None, False]},
}


def _neutral_field(name: str) -> Any:
    return Field(None, description=f"accepted only with its neutral value: {_NEUTRAL_ONLY[name][1]}",
                 json_schema_extra=_NEUTRAL_SCHEMA[name])


class _Strict(BaseModel):
    """Unknown fields are refused by name; no value is coerced into another type ("1" is not 1, 1 is not true)."""

    model_config = ConfigDict(extra="forbid", strict=True)


TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]
NonEmpty = Annotated[str, Field(min_length=1)]


class StreamOptions(_Strict):
    include_usage: bool | None = Field(None, description="a last chunk with the usage (and no choices)")


class _Unsupported(_Strict):
    """The API's parameters this server cannot honour: accepted only with their neutral value."""

    n: Any = _neutral_field("n")
    best_of: Any = _neutral_field("best_of")
    logprobs: Any = _neutral_field("logprobs")
    top_logprobs: Any = _neutral_field("top_logprobs")
    presence_penalty: Any = _neutral_field("presence_penalty")
    frequency_penalty: Any = _neutral_field("frequency_penalty")
    repetition_penalty: Any = _neutral_field("repetition_penalty")
    logit_bias: Any = _neutral_field("logit_bias")
    suffix: Any = _neutral_field("suffix")
    tools: Any = _neutral_field("tools")
    tool_choice: Any = _neutral_field("tool_choice")
    parallel_tool_calls: Any = _neutral_field("parallel_tool_calls")
    functions: Any = _neutral_field("functions")
    function_call: Any = _neutral_field("function_call")
    response_format: Any = _neutral_field("response_format")
    audio: Any = _neutral_field("audio")
    modalities: Any = _neutral_field("modalities")
    prediction: Any = _neutral_field("prediction")
    web_search_options: Any = _neutral_field("web_search_options")
    store: Any = _neutral_field("store")
    # metadata: accepted, no effect on the output
    user: Any = Field(None, description="accepted; no effect")
    metadata: Any = Field(None, description="accepted; no effect")
    service_tier: Any = Field(None, description="accepted; no effect")

    _check_neutral = field_validator(*_NEUTRAL_ONLY)(_neutral)


class _SamplingBody(_Unsupported):
    model: NonEmpty = Field(description="the model's name (GET /v1/models)")
    max_tokens: Annotated[int, Field(ge=1, le=MAX_INT32)] | None = Field(
        None, description="tokens to generate at most (completions: default 16; chat: the rest of the context)")
    temperature: Annotated[float, Field(ge=0.0, le=2.0, allow_inf_nan=False)] | None = Field(
        None, description="0 = greedy (default 1)")
    top_p: Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)] | None = Field(None, description="default 1")
    top_k: Annotated[int, Field(ge=-1, le=MAX_INT32)] | None = Field(None, description="0 or -1 = off (default)")
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] | None = Field(
        None, description="default: random for a sampled request")
    stop: NonEmpty | Annotated[list[NonEmpty], Field(max_length=MAX_STOP)] | None = None
    stream: bool | None = Field(None, description="server-sent events, ending in 'data: [DONE]'")
    stream_options: StreamOptions | None = Field(None, description="only with stream: true")


class CompletionRequestBody(_SamplingBody):
    """POST /v1/completions: one prompt."""

    prompt: str | list[TokenId] | list[str] | list[list[TokenId]] = Field(
        description="text, or token ids (a list of one of either is one prompt too)")
    echo: bool | None = Field(None, description="prepend the prompt to the answer")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None
    tool_calls: Any = Field(None, description="accepted only empty: tool calling is not supported")
    refusal: Any = Field(None, description="accepted only empty")

    @field_validator("role", mode="before")
    @classmethod
    def _tools(cls, role):
        if role in ("tool", "function"):
            raise PydanticCustomError("unsupported_parameter", "role '{role}' is not supported: tool calling is not "
                                      "supported", {"role": role})
        return role

    @field_validator("tool_calls", "refusal")
    @classmethod
    def _empty(cls, value, info: ValidationInfo):
        if value:
            raise PydanticCustomError("unsupported_parameter", "not supported (tool calling, refusals)")
        return value


class ChatRequestBody(_SamplingBody):
    """POST /v1/chat/completions."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1, le=MAX_INT32)] | None = Field(
        None, description="max_tokens' newer name (send one, or both equal)")


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_shape_tag(item) -> bool:
    """A union member's name in a pydantic error location (``str``, ``list[int]``, ``function-after[...]``)."""
    return isinstance(item, str) and (item in ("str", "int", "float", "bool", "list", "dict", "none")
                                      or "[" in item or "-" in item)


def _param(loc) -> tuple[str | None, bool]:
    """The request field a pydantic error location names (``messages[0].content``), and whether it ran into a
    union member (several shapes were tried)."""
    out = ""
    for item in loc:
        if _is_shape_tag(item):
            return out or None, True
        out += f"[{item}]" if isinstance(item, int) else (f".{item}" if out else item)
    return out or None, False


def _openai_error(e: ValidationError, endpoint: str) -> OpenAIError:
    """The first error of a body's validation, in OpenAI's shape, ``param`` naming the field."""
    err = e.errors(include_url=False)[0]
    kind, param, shaped = err["type"], *_param(err["loc"])
    leaf = param.rsplit(".", 1)[-1] if param else None
    if param is None:
        return OpenAIError("the request body must be a JSON object", param=None)
    if kind == "extra_forbidden":
        return OpenAIError(f"unsupported parameter '{param}' for {endpoint}", param=param,
                           code="unsupported_parameter")
    if kind == "unsupported_parameter":
        return OpenAIError(err["msg"] if "." not in param else f"{param}: {err['msg']}", param=param,
                           code="unsupported_parameter")
    if kind == "missing":
        return OpenAIError(f"'{param}' is required{_HINTS.get(param, '')}", param=param)
    if shaped and leaf in _SHAPES:
        message = _SHAPES[leaf]
        return OpenAIError(message if message.startswith("'") else f"'{param}' {message}", param=param)
    return OpenAIError(f"'{param}': {err['msg']}, got {_short(err['input'])}", param=param)


@dataclass
class Sampling:
    """The generation parameters both endpoints share (after checks; ``max_tokens`` None = the default)."""

    model: str
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int = 0
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False


@dataclass
class CompletionRequest(Sampling):
    prompt: str | list[int] = ""
    echo: bool = False


@dataclass
class ChatRequest(Sampling):
    messages: list[dict] = field(default_factory=list)  # [{"role": str, "content": str, ...}], content as text


def _sampling(body: _SamplingBody, max_tokens: int | None) -> dict:
    """What the model is asked, with the API's defaults, and the checks across fields."""
    if body.stream_options is not None and not body.stream:
        raise OpenAIError("'stream_options' is only allowed with stream: true", param="stream_options")
    temperature = 1.0 if body.temperature is None else body.temperature
    seed = body.seed
    if seed is None:
        seed = secrets.randbelow(2**31) if temperature > 0 else 0  # an unseeded sampled request varies
    stop = [] if body.stop is None else [body.stop] if isinstance(body.stop, str) else list(body.stop)
    return dict(model=body.model, max_tokens=max_tokens, temperature=temperature,
                top_p=1.0 if body.top_p is None else body.top_p, top_k=max(body.top_k or 0, 0), seed=seed, stop=stop,
                stream=bool(body.stream),
                include_usage=bool(body.stream_options is not None and body.stream_options.include_usage))


def parse_completion(body) -> CompletionRequest:
    """Check a POST /v1/completions body (one prompt: a string or a list of token ids)."""
    try:
        req = CompletionRequestBody.model_validate(body)
    except ValidationError as e:
        raise _openai_error(e, "/v1/completions") from None
    prompt = req.prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        raise OpenAIError(f"'prompt' holds {len(prompt)} prompts; send one prompt per request", param="prompt")
    if not prompt:
        raise OpenAIError("'prompt' is empty: send at least one character or token", param="prompt")
    return CompletionRequest(**_sampling(req, req.max_tokens), prompt=prompt, echo=bool(req.echo))


def _message_text(content) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


def parse_chat(body) -> ChatRequest:
    """Check a POST /v1/chat/completions body; message contents become plain text."""
    try:
        req = ChatRequestBody.model_validate(body)
    except ValidationError as e:
        raise _openai_error(e, "/v1/chat/completions") from None
    max_tokens, name = req.max_completion_tokens, "max_completion_tokens"
    if req.max_tokens is not None:
        if max_tokens is not None and req.max_tokens != max_tokens:
            raise OpenAIError(f"'max_tokens' ({req.max_tokens}) and 'max_completion_tokens' ({max_tokens}) "
                              f"disagree; send one", param=name)
        max_tokens = req.max_tokens
    messages = []
    for m in req.messages:
        msg = {"role": m.role, "content": _message_text(m.content)}
        if m.name is not None:
            msg["name"] = m.name
        messages.append(msg)
    return ChatRequest(**_sampling(req, max_tokens), messages=messages)


# -- responses ------------------------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def dspark_stats(final) -> dict:
    """The ``dspark`` extension object from the model's final response (``triton_stream.Final``)."""
    return {"mean_acceptance_length": final.mean_acceptance_length, "rounds": final.rounds,
            "drafted": final.drafted, "accepted": final.accepted, "batch_size": final.batch_size}


def completion_response(rid: str, model: str, text: str, finish_reason: str, usage_: dict, dspark: dict) -> dict:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
            "usage": usage_, "dspark": dspark}


def chat_response(rid: str, model: str, text: str, finish_reason: str, usage_: dict, dspark: dict) -> dict:
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                         "finish_reason": finish_reason}],
            "usage": usage_, "dspark": dspark}


def completion_chunk(rid: str, model: str, created: int, text: str, finish_reason: str | None = None,
                     dspark: dict | None = None) -> dict:
    chunk = {"id": rid, "object": "text_completion", "created": created, "model": model,
             "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}]}
    if dspark is not None:
        chunk["dspark"] = dspark
    return chunk


def chat_chunk(rid: str, model: str, created: int, delta: dict, finish_reason: str | None = None,
               dspark: dict | None = None) -> dict:
    chunk = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
             "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}
    if dspark is not None:
        chunk["dspark"] = dspark
    return chunk


def usage_chunk(rid: str, model: str, created: int, obj: str, usage_: dict, dspark: dict) -> dict:
    """The last chunk with ``stream_options.include_usage``: no choices, the usage (and our figures)."""
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": usage_,
            "dspark": dspark}


# -- response bodies: pydantic models (what the builders above return; the OpenAPI document's schemas) ----------
class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorDetail(_Out):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(_Out):
    """Every error, in OpenAI's shape."""

    error: ErrorDetail


class Usage(_Out):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class DSparkStats(_Out):
    """The speculation figures of one request (an extension, as vLLM adds its own fields)."""

    mean_acceptance_length: float | None
    rounds: int | None
    drafted: int | None
    accepted: int | None
    batch_size: int | None


class CompletionChoice(_Out):
    index: int
    text: str
    logprobs: None
    finish_reason: str | None


class CompletionResponse(_Out):
    """A /v1/completions answer; streamed: each event one of these with a piece of the text (``usage`` in the
    last one only, with ``stream_options.include_usage``)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    dspark: DSparkStats | None = None


class AssistantMessage(_Out):
    role: Literal["assistant"]
    content: str


class ChatChoice(_Out):
    index: int
    message: AssistantMessage
    logprobs: None
    finish_reason: str | None


class ChatCompletionResponse(_Out):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    dspark: DSparkStats


class ChatDelta(_Out):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(_Out):
    index: int
    delta: ChatDelta
    logprobs: None
    finish_reason: str | None


class ChatCompletionChunk(_Out):
    """One server-sent event of a streamed chat answer (the last, with ``include_usage``, has no choices)."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    dspark: DSparkStats | None = None


class ModelCard(_Out):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int | None


class ModelList(_Out):
    object: Literal["list"]
    data: list[ModelCard]


class Health(_Out):
    status: Literal["ok", "unavailable"]
    model: str
    reason: str | None = None


class Liveness(_Out):
    status: Literal["alive"]
    model: str
    draining: bool
    in_flight: int


# -- the OpenAPI document -------------------------------------------------------------------------------------
def openapi_document(*, keys: bool = False, model: str | None = None, version: str = "0") -> dict:
    """The API this front end serves (OpenAPI 3.1), its schemas the models above; ``keys``: /v1/* need a
    bearer key; ``model``: the one model name the requests may name (any other is a 404)."""
    from pydantic.json_schema import models_json_schema

    requests = [CompletionRequestBody, ChatRequestBody]
    answers = [ErrorResponse, CompletionResponse, ChatCompletionResponse, ChatCompletionChunk, ModelList, Health,
               Liveness]
    _, top = models_json_schema([(m, "validation") for m in requests] + [(m, "serialization") for m in answers],
                                ref_template="#/components/schemas/{model}")
    ref = lambda m: {"$ref": f"#/components/schemas/{m.__name__}"}  # noqa: E731
    json_of = lambda m: {"application/json": {"schema": ref(m)}}  # noqa: E731
    error = {"description": "an error, in OpenAI's shape", "content": json_of(ErrorResponse)}
    secured = {"security": [{"bearer": []}]} if keys else {}
    refusals = {"401": {"description": "no key, or a wrong one", "content": json_of(ErrorResponse)}} if keys else {}

    def generate(body, answer, chunk, summary):
        return {"post": {"summary": summary, **secured,
                         "requestBody": {"required": True, "content": json_of(body)},
                         "responses": {"200": {"description": "the answer (stream: server-sent events, each a chunk, "
                                                              "then 'data: [DONE]')",
                                               "content": {**json_of(answer),
                                                           "text/event-stream": {"schema": ref(chunk)}}},
                                       "400": error, **refusals, "404": error, "413": error, "499": {
                                           "description": "the client left before the answer (nothing is sent)"},
                                       "500": error, "503": error}}}

    paths = {
        "/health": {"get": {"summary": "readiness (no key needed)", "responses": {
            "200": {"description": "ready", "content": json_of(Health)},
            "503": {"description": "not ready, and why", "content": json_of(Health)}}}},
        "/health/ready": {"get": {"summary": "readiness, as /health: not ready while draining (no key needed)",
                                  "responses": {
                                      "200": {"description": "ready", "content": json_of(Health)},
                                      "503": {"description": "not ready, and why", "content": json_of(Health)}}}},
        "/health/live": {"get": {"summary": "liveness: the process and its front end run (no key needed)",
                                 "responses": {"200": {"description": "alive", "content": json_of(Liveness)}}}},
        "/v1/models": {"get": {"summary": "the served model while it is ready", **secured,
                               "responses": {"200": {"description": "the models", "content": json_of(ModelList)},
                                             **refusals}}},
        "/v1/completions": generate(CompletionRequestBody, CompletionResponse, CompletionResponse, "one prompt"),
        "/v1/chat/completions": generate(ChatRequestBody, ChatCompletionResponse, ChatCompletionChunk, "messages"),
    }
    if model is not None:
        for body in (CompletionRequestBody, ChatRequestBody):
            top["$defs"][body.__name__]["properties"]["model"]["enum"] = [model]
    doc = {"openapi": "3.1.0", "info": {"title": "dspark-trt OpenAI-compatible API", "version": version},
           "paths": paths, "components": {"schemas": top.get("$defs", {})}}
    if keys:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return doc
