"""The OpenAI API's request checks and response shapes for the front end (``openai_app.py``); no I/O here.

``parse_completion`` / ``parse_chat`` turn a decoded JSON body into a ``CompletionRequest`` /
``ChatRequest`` or raise ``OpenAIError`` (HTTP 400 in OpenAI's error shape, ``param`` naming the field).
Every field the API defines is either honoured or refused: a parameter this server cannot honour
(``n`` > 1, ``logprobs``, penalties ≠ 0, ``logit_bias``, tools, structured output, ``suffix``…) is an
error that names it, never a silent ignore; unknown fields are refused the same way. Metadata that does
not change the output (``user``, ``metadata``, ``store: false``) is accepted.

Defaults follow the API: ``temperature`` 1 (0 = greedy), ``top_p`` 1, ``max_tokens`` 16 for completions
and the rest of the context for chat; a sampled request without ``seed`` gets a random one. Extensions
(as in vLLM): ``top_k`` (0 or −1 = off); the ``dspark`` object in responses (speculation figures).
"""

from __future__ import annotations

import math
import secrets
import time
import uuid
from dataclasses import dataclass, field

__all__ = ["OpenAIError", "CompletionRequest", "ChatRequest", "parse_completion", "parse_chat", "error_body",
           "MAX_STOP", "MAX_SEED", "usage", "dspark_stats", "completion_response", "chat_response",
           "completion_chunk", "chat_chunk", "usage_chunk", "new_id"]

MAX_STOP = 4  # stop strings per request (OpenAI's limit)
MAX_SEED = 2**63 - 1

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
_METADATA = {"user", "metadata", "service_tier"}  # accepted, no effect on the output
_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "stream_options"}
_COMPLETION_FIELDS = _COMMON | {"prompt", "echo"}
_CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens"}
_CHAT_ROLES = ("system", "developer", "user", "assistant")


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


def _fail(message: str, param: str | None, code: str | None = None) -> OpenAIError:
    return OpenAIError(message, param=param, code=code)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(body: dict, name: str, default: float, low: float, high: float, *, open_low: bool = False) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _fail(f"'{name}' must be a number, got {v!r}", name)
    if not math.isfinite(v) or v < low or v > high or (open_low and v == low):
        lo = f"> {low:g}" if open_low else f">= {low:g}"
        raise _fail(f"'{name}' must be {lo} and <= {high:g}, got {v!r}", name)
    return float(v)


def _check_fields(body, allowed: set[str], endpoint: str) -> None:
    if not isinstance(body, dict):
        raise _fail("the request body must be a JSON object", None)
    for name in body:
        if name in allowed or name in _METADATA:
            continue
        if name in _NEUTRAL_ONLY:
            neutral, why = _NEUTRAL_ONLY[name]
            if not neutral(body[name]):
                raise _fail(f"unsupported parameter '{name}' = {body[name]!r}: {why}", name, "unsupported_parameter")
            continue
        raise _fail(f"unsupported parameter '{name}' for {endpoint}", name, "unsupported_parameter")


def _sampling(body: dict, *, max_tokens_field: str = "max_tokens") -> dict:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _fail("'model' is required: the name of a model from GET /v1/models", "model")
    max_tokens = body.get(max_tokens_field)
    if max_tokens_field != "max_tokens" and body.get("max_tokens") is not None:
        legacy = body["max_tokens"]
        if max_tokens is not None and legacy != max_tokens:
            raise _fail(f"'max_tokens' ({legacy!r}) and '{max_tokens_field}' ({max_tokens!r}) disagree; send one",
                        max_tokens_field)
        max_tokens, max_tokens_field = legacy, "max_tokens"
    if max_tokens is not None:
        if not _is_int(max_tokens):
            raise _fail(f"'{max_tokens_field}' must be an integer, got {max_tokens!r}", max_tokens_field)
        if max_tokens < 1:
            raise _fail(f"'{max_tokens_field}' must be at least 1, got {max_tokens}", max_tokens_field)
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0, open_low=True)
    top_k = body.get("top_k")
    if top_k is None:
        top_k = 0
    elif not _is_int(top_k) or top_k < -1:
        raise _fail(f"'top_k' must be an integer >= 0 (0 or -1 = off), got {top_k!r}", "top_k")
    seed = body.get("seed")
    if seed is None:
        seed = secrets.randbelow(2**31) if temperature > 0 else 0  # an unseeded sampled request varies
    elif not _is_int(seed) or not 0 <= seed <= MAX_SEED:
        raise _fail(f"'seed' must be an integer in [0, 2**63), got {seed!r}", "seed")
    stop = body.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise _fail("'stop' must be a non-empty string or a list of non-empty strings", "stop")
    if len(stop) > MAX_STOP:
        raise _fail(f"'stop' has {len(stop)} strings; at most {MAX_STOP} are allowed", "stop")
    stream = body.get("stream")
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _fail(f"'stream' must be true or false, got {stream!r}", "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise _fail("'stream_options' is only allowed with stream: true", "stream_options")
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise _fail("'stream_options' takes only {\"include_usage\": bool}", "stream_options")
        include_usage = options.get("include_usage") or False
        if not isinstance(include_usage, bool):
            raise _fail("'stream_options.include_usage' must be true or false", "stream_options")
    return dict(model=model, max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=max(top_k, 0),
                seed=seed, stop=list(stop), stream=stream, include_usage=include_usage)


def parse_completion(body) -> CompletionRequest:
    """Check a POST /v1/completions body (one prompt: a string or a list of token ids)."""
    _check_fields(body, _COMPLETION_FIELDS, "/v1/completions")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list):
        if prompt and all(isinstance(p, (str, list)) for p in prompt):
            raise _fail(f"'prompt' holds {len(prompt)} prompts; send one prompt per request", "prompt")
        if not all(_is_int(t) for t in prompt):
            raise _fail("'prompt' must be a string or a list of token ids (integers)", "prompt")
    elif not isinstance(prompt, str):
        raise _fail("'prompt' is required: a string or a list of token ids", "prompt")
    if not prompt:
        raise _fail("'prompt' is empty: send at least one character or token", "prompt")
    echo = body.get("echo") or False
    if not isinstance(echo, bool):
        raise _fail(f"'echo' must be true or false, got {echo!r}", "echo")
    return CompletionRequest(**_sampling(body), prompt=prompt, echo=echo)


def _message_text(content, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise _fail(f"messages[{i}].content[{j}] is of type {kind!r}: only text parts are supported",
                            f"messages[{i}].content")
            parts.append(part["text"])
        return "".join(parts)
    raise _fail(f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}].content")


def parse_chat(body) -> ChatRequest:
    """Check a POST /v1/chat/completions body; message contents become plain text."""
    _check_fields(body, _CHAT_FIELDS, "/v1/chat/completions")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _fail("'messages' must be a non-empty list of {\"role\", \"content\"} objects", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise _fail(f"messages[{i}] must be an object with 'role' and 'content'", f"messages[{i}]")
        role = m.get("role")
        if role not in _CHAT_ROLES:
            why = "tool calling is not supported" if role in ("tool", "function") else \
                f"use one of {', '.join(_CHAT_ROLES)}"
            raise _fail(f"messages[{i}].role {role!r} is not supported: {why}", f"messages[{i}].role")
        extra = set(m) - {"role", "content", "name"}
        if extra - {"tool_calls", "refusal"} or m.get("tool_calls") or m.get("refusal"):
            bad = sorted(extra)[0]
            raise _fail(f"messages[{i}].{bad} is not supported", f"messages[{i}].{bad}")
        if m.get("content") is None:
            raise _fail(f"messages[{i}] has no content", f"messages[{i}].content")
        msg = {"role": role, "content": _message_text(m["content"], i)}
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        out.append(msg)
    return ChatRequest(**_sampling(body, max_tokens_field="max_completion_tokens"), messages=out)


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
