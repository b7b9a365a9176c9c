"""The served model's tensors: names, types, shapes, and the checks that turn them into a scheduler request.

Inputs and outputs follow the conventions of Triton's LLM backends (TensorRT-LLM, vLLM), so their
clients work: ``text_input`` / ``max_tokens`` / ``temperature`` / ``top_p`` / ``top_k`` / ``stop`` /
``stream`` in, ``text_output`` (the new text, never the prompt) out; the HTTP ``/v2/models/<name>/generate``
endpoint maps JSON keys onto these inputs (``"stop": ["###", "\\n\\n"]``). The final response also carries
the request's statistics: ``finish_reason`` ("stop": EOS or a stop string, "length", "cancelled", "error"),
``prompt_tokens``, ``rounds``, ``drafted``, ``accepted``, ``mean_acceptance_length``, ``batch_size``.

Nothing here imports Triton: ``parse_request`` takes ``{name: numpy array}`` and raises ``DSparkTrtError``
with a one-line message (the model sends it back as an invalid-argument error, HTTP 400), so the checks
are tested without a server. Triton itself rejects wrong dtypes and shapes; a *missing* input it does not
reject, so every input is checked here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import DSparkTrtError
from ..runtime.stop import MAX_STOP_STRINGS, StopStrings
from ..runtime.text import IncrementalText

__all__ = ["INPUTS", "OUTPUTS", "GenerateRequest", "parse_request", "IncrementalText", "MAX_TEXT_BYTES",
           "MAX_STOP_STRINGS", "INT32_MAX"]

#: name → (Triton data type, dims, optional)
INPUTS: dict[str, tuple[str, list[int], bool]] = {
    "text_input": ("TYPE_STRING", [1], True),
    "input_ids": ("TYPE_INT64", [-1], True),
    "max_tokens": ("TYPE_INT32", [1], False),
    "temperature": ("TYPE_FP32", [1], True),
    "seed": ("TYPE_INT64", [1], True),
    "stream": ("TYPE_BOOL", [1], True),
    "end_id": ("TYPE_INT64", [-1], True),
    "stop": ("TYPE_STRING", [-1], True),  # up to MAX_STOP_STRINGS non-empty strings
    "top_p": ("TYPE_FP32", [1], True),  # 0 < p <= 1 (1 = off)
    "top_k": ("TYPE_INT32", [1], True),  # >= 0 (0 = off)
}
#: name → (Triton data type, dims)
OUTPUTS: dict[str, tuple[str, list[int]]] = {
    "text_output": ("TYPE_STRING", [1]),
    "output_ids": ("TYPE_INT64", [-1]),
    "finish_reason": ("TYPE_STRING", [1]),
    "mean_acceptance_length": ("TYPE_FP32", [1]),
    "drafted": ("TYPE_INT64", [1]),
    "accepted": ("TYPE_INT64", [1]),
    "batch_size": ("TYPE_INT32", [1]),
    "prompt_tokens": ("TYPE_INT64", [1]),
    "rounds": ("TYPE_INT64", [1]),
}
#: a text prompt longer than this is refused before tokenizing (the context limit still applies after)
MAX_TEXT_BYTES = 256 * 1024
#: the largest max_tokens / top_k an INT32 input holds; a larger JSON number wraps around to a negative one
INT32_MAX = 2**31 - 1


@dataclass
class GenerateRequest:
    prompt: str | list[int]  # text (needs the tokenizer) or token ids
    max_tokens: int
    temperature: float = 0.0
    seed: int = 0
    stream: bool = False
    end_id: list[int] | None = None  # stop token ids; None = the model's EOS
    stop: list[str] | None = None  # stop strings
    top_p: float = 1.0  # nucleus sampling (1 = off)
    top_k: int = 0  # top-k sampling (0 = off)

    def submit_kwargs(self) -> dict:
        """Keyword arguments of ``RequestScheduler.submit`` (after the prompt)."""
        out = dict(max_new_tokens=self.max_tokens, temperature=self.temperature, seed=self.seed,
                   eos_token_id=self.end_id)
        if self.stop:
            out["stop"] = list(self.stop)
        if self.top_p != 1.0:
            out["top_p"] = self.top_p
        if self.top_k:
            out["top_k"] = self.top_k
        return out


def _scalar(tensors: dict, name: str, kind):
    value = np.asarray(tensors[name])
    if value.size != 1:
        raise DSparkTrtError(f"input {name!r} must hold exactly one value, got shape {list(value.shape)}")
    value = value.reshape(-1)[0]
    if kind is bool:
        if value.dtype != np.bool_:
            raise DSparkTrtError(f"input {name!r} must be BOOL, got {value.dtype}")
        return bool(value)
    if kind is int and not np.issubdtype(value.dtype, np.integer):
        raise DSparkTrtError(f"input {name!r} must be an integer, got {value.dtype}")
    if kind is float and not np.issubdtype(value.dtype, np.number):
        raise DSparkTrtError(f"input {name!r} must be a number, got {value.dtype}")
    return kind(value)


def _wrapped(tensors: dict, name: str, value: int) -> str:
    """A hint for a negative INT32: JSON numbers of 2^31 and more wrap around on Triton's HTTP endpoint."""
    if value < 0 and np.asarray(tensors[name]).dtype == np.int32:
        return f" (a value above {INT32_MAX} wraps around to a negative INT32 over HTTP)"
    return ""


def _strings(tensors: dict, name: str) -> list[str]:
    raw = np.asarray(tensors[name], dtype=object).reshape(-1)
    out = []
    for value in raw:
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                raise DSparkTrtError(f"input {name!r} is not valid UTF-8; send UTF-8 text") from None
        if not isinstance(value, str):
            raise DSparkTrtError(f"input {name!r} must hold strings (BYTES), got {type(value).__name__}")
        out.append(value)
    return out


def parse_request(tensors: dict[str, np.ndarray], *, vocab_size: int, max_text_bytes: int = MAX_TEXT_BYTES,
                  max_context: int | None = None) -> GenerateRequest:
    """Check one request's input tensors and return what to submit; ``DSparkTrtError`` names the problem.

    ``max_context``: the model's context (prompt + max_tokens), named in the message of an out-of-range
    ``max_tokens``."""
    unknown = sorted(set(tensors) - set(INPUTS))
    if unknown:
        raise DSparkTrtError(f"unknown input(s) {unknown}; this model takes {sorted(INPUTS)}")
    has_text, has_ids = "text_input" in tensors, "input_ids" in tensors
    if has_text == has_ids:
        raise DSparkTrtError("give exactly one of the inputs 'text_input' (BYTES [1]) and 'input_ids' (INT64 [-1])")
    if "max_tokens" not in tensors:
        raise DSparkTrtError("missing input 'max_tokens' (INT32 [1]): how many tokens to generate, >= 1")
    max_tokens = _scalar(tensors, "max_tokens", int)
    if max_tokens < 1:
        limit = f"this model's context of {max_context} tokens minus the prompt" if max_context else \
            f"{INT32_MAX} (INT32)"
        raise DSparkTrtError(f"max_tokens must be between 1 and {limit}, got {max_tokens}"
                             f"{_wrapped(tensors, 'max_tokens', max_tokens)}")
    if has_text:
        raw = np.asarray(tensors["text_input"], dtype=object).reshape(-1)
        if raw.size != 1:
            raise DSparkTrtError(f"input 'text_input' must hold exactly one string, got {raw.size}")
        text = raw[0]
        if isinstance(text, bytes):
            if len(text) > max_text_bytes:
                raise DSparkTrtError(f"text_input is {len(text)} bytes, more than this model accepts "
                                     f"({max_text_bytes}); send a shorter prompt")
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError:
                raise DSparkTrtError("text_input is not valid UTF-8; send UTF-8 text") from None
        if not isinstance(text, str) or not text:
            raise DSparkTrtError("text_input is empty: send at least one character")
        if len(text.encode("utf-8")) > max_text_bytes:
            raise DSparkTrtError(f"text_input is more than {max_text_bytes} bytes; send a shorter prompt")
        prompt: str | list[int] = text
    else:
        ids = np.asarray(tensors["input_ids"])
        if not np.issubdtype(ids.dtype, np.integer):
            raise DSparkTrtError(f"input_ids must be integers (INT64), got {ids.dtype}")
        ids = ids.reshape(-1)
        if ids.size == 0:
            raise DSparkTrtError("input_ids is empty: send at least one token id")
        bad = ids[(ids < 0) | (ids >= vocab_size)]
        if bad.size:
            raise DSparkTrtError(f"input_ids has token id {int(bad[0])} outside the vocabulary [0, {vocab_size})")
        prompt = [int(t) for t in ids]
    temperature = _scalar(tensors, "temperature", float) if "temperature" in tensors else 0.0
    if not np.isfinite(temperature) or temperature < 0:
        raise DSparkTrtError(f"temperature must be finite and >= 0 (0 = greedy), got {temperature}")
    seed = _scalar(tensors, "seed", int) if "seed" in tensors else 0
    if seed < 0:
        raise DSparkTrtError(f"seed must be >= 0, got {seed}")
    stream = _scalar(tensors, "stream", bool) if "stream" in tensors else False
    end_id = None
    if "end_id" in tensors:
        ends = np.asarray(tensors["end_id"]).reshape(-1)
        if not np.issubdtype(ends.dtype, np.integer) or ends.size == 0:
            raise DSparkTrtError("end_id must be one or more integer token ids")
        if ((ends < 0) | (ends >= vocab_size)).any():
            raise DSparkTrtError(f"end_id must be token ids in [0, {vocab_size})")
        end_id = [int(e) for e in ends]
    stop = _strings(tensors, "stop") if "stop" in tensors else []
    stop = list(StopStrings(stop).strings) if stop else None  # up to MAX_STOP_STRINGS non-empty strings
    top_p = _scalar(tensors, "top_p", float) if "top_p" in tensors else 1.0
    if not (np.isfinite(top_p) and 0.0 < top_p <= 1.0):
        raise DSparkTrtError(f"top_p must be in (0, 1] (1 = off), got {top_p}")
    top_k = _scalar(tensors, "top_k", int) if "top_k" in tensors else 0
    if top_k < 0:
        raise DSparkTrtError(f"top_k must be between 0 (off) and {INT32_MAX}, got {top_k}"
                             f"{_wrapped(tensors, 'top_k', top_k)}")
    return GenerateRequest(prompt, max_tokens, temperature, seed, stream, end_id, stop, float(top_p), int(top_k))
