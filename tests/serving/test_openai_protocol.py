"""The OpenAI request checks (no server): what is honoured, what is refused and how the refusal reads."""

from __future__ import annotations

import math

import pytest

from dspark_trt.serving import openai_protocol as oa
from dspark_trt.serving.triton_stream import generate_inputs, http_status


def completion(**fields):
    return oa.parse_completion({"model": "dspark", "prompt": "hello", **fields})


def chat(**fields):
    return oa.parse_chat({"model": "dspark", "messages": [{"role": "user", "content": "hi"}], **fields})


def test_defaults_follow_the_api():
    req = completion()
    assert (req.max_tokens, req.temperature, req.top_p, req.top_k, req.stop, req.stream, req.echo) == \
        (None, 1.0, 1.0, 0, [], False, False)
    assert 0 <= req.seed < 2**31  # sampled (temperature 1) and unseeded: a random seed
    seeds = {completion().seed for _ in range(8)}
    assert len(seeds) > 1
    assert completion(temperature=0).seed == 0  # greedy: the seed does not matter, fixed
    assert completion(temperature=0.5, seed=7).seed == 7


def test_honoured_parameters_pass_through():
    req = completion(max_tokens=5, temperature=0.7, top_p=0.9, top_k=40, seed=3, stop="###", stream=True,
                     stream_options={"include_usage": True}, echo=True, user="me")
    assert (req.max_tokens, req.temperature, req.top_p, req.top_k, req.seed, req.stop, req.stream,
            req.include_usage, req.echo) == (5, 0.7, 0.9, 40, 3, ["###"], True, True, True)
    assert completion(top_k=-1).top_k == 0  # vLLM's "off"
    assert completion(prompt=[[1, 2, 3]]).prompt == [1, 2, 3]  # a batch of one prompt
    assert completion(prompt=["abc"]).prompt == "abc"
    c = chat(max_completion_tokens=7)
    assert c.max_tokens == 7 and c.messages == [{"role": "user", "content": "hi"}]
    assert chat(max_tokens=7, max_completion_tokens=7).max_tokens == 7


@pytest.mark.parametrize("fields", [
    {"n": 1}, {"best_of": 1}, {"logprobs": None}, {"presence_penalty": 0}, {"frequency_penalty": 0.0},
    {"logit_bias": {}}, {"suffix": None}, {"store": False}, {"metadata": {"a": "b"}}, {"service_tier": "auto"},
])
def test_neutral_values_of_refused_parameters_are_accepted(fields):
    completion(**fields)


UNSUPPORTED = [
    ("n", 2), ("best_of", 3), ("logprobs", 5), ("presence_penalty", 0.5), ("frequency_penalty", -1.0),
    ("logit_bias", {"42": 5}), ("suffix", "tail"), ("repetition_penalty", 1.2), ("store", True), ("tools", [{}]),
    ("functions", [{"name": "f"}]), ("response_format", {"type": "json_object"}), ("min_p", 0.1), ("foo", 1),
]


@pytest.mark.parametrize("name,value", UNSUPPORTED)
def test_unsupported_parameters_are_refused_by_name(name, value):
    with pytest.raises(oa.OpenAIError) as e:
        completion(**{name: value})
    assert e.value.status == 400 and e.value.param == name and f"'{name}'" in e.value.message
    assert e.value.code == "unsupported_parameter"


@pytest.mark.parametrize("name,value", [("logprobs", True), ("top_logprobs", 3), ("tool_choice", "auto"),
                                        ("parallel_tool_calls", True), ("audio", {"voice": "x"})])
def test_chat_only_parameters_refused_by_name(name, value):
    with pytest.raises(oa.OpenAIError) as e:
        chat(**{name: value})
    assert e.value.param == name


@pytest.mark.parametrize("fields,param,words", [  # pydantic's words after the field's name; never a 5xx
    ({"max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
    ({"max_tokens": -1}, "max_tokens", "greater than or equal to 1"),
    ({"max_tokens": 2**31}, "max_tokens", "less than or equal to 2147483647"),  # int32 on the way to the model
    ({"max_tokens": "10"}, "max_tokens", "valid integer"),
    ({"max_tokens": True}, "max_tokens", "valid integer"),
    ({"max_tokens": 2.5}, "max_tokens", "valid integer"),
    ({"temperature": "hot"}, "temperature", "valid number"),
    ({"temperature": -0.1}, "temperature", "greater than or equal to 0"),
    ({"temperature": 2.5}, "temperature", "less than or equal to 2"),
    ({"temperature": math.nan}, "temperature", "finite number"),
    ({"temperature": True}, "temperature", "valid number"),
    ({"top_p": 0}, "top_p", "greater than 0"),
    ({"top_p": 1.5}, "top_p", "less than or equal to 1"),
    ({"top_k": -2}, "top_k", "greater than or equal to -1"),
    ({"top_k": 1.5}, "top_k", "valid integer"),
    ({"seed": -1}, "seed", "greater than or equal to 0"),
    ({"seed": 2**63}, "seed", "less than or equal to 9223372036854775807"),
    ({"seed": "1"}, "seed", "valid integer"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
    ({"stop": [""]}, "stop", "non-empty"),
    ({"stop": 3}, "stop", "non-empty"),
    ({"stream": "yes"}, "stream", "valid boolean"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "only allowed with stream"),
    ({"stream": True, "stream_options": {"other": 1}}, "stream_options.other", "unsupported parameter"),
    ({"stream": True, "stream_options": {"include_usage": 1}}, "stream_options.include_usage", "valid boolean"),
    ({"prompt": ""}, "prompt", "empty"),
    ({"prompt": []}, "prompt", "empty"),
    ({"prompt": ["a", "b"]}, "prompt", "one prompt per request"),
    ({"prompt": [1, "a"]}, "prompt", "token ids"),
    ({"prompt": [-1]}, "prompt", "token ids"),
    ({"prompt": [2**64]}, "prompt", "token ids"),
    ({"prompt": None}, "prompt", "a string or a list of token ids"),
    ({"echo": "yes"}, "echo", "valid boolean"),
    ({"model": ""}, "model", "at least 1 character"),
    ({"model": 3}, "model", "valid string"),
])
def test_bad_values_name_the_parameter(fields, param, words):
    with pytest.raises(oa.OpenAIError) as e:
        completion(**fields)
    assert e.value.status == 400 and e.value.param == param
    assert words in e.value.message


@pytest.mark.parametrize("messages,param", [
    ([], "messages"),
    (None, "messages"),
    ("hi", "messages"),
    ([{"role": "tool", "content": "x"}], "messages[0].role"),
    ([{"role": "robot", "content": "x"}], "messages[0].role"),
    ([{"role": "user"}], "messages[0].content"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "messages[0].content"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "tool_calls": [{}]}],
     "messages[1].tool_calls"),
    (["hi"], "messages[0]"),
])
def test_bad_messages(messages, param):
    with pytest.raises(oa.OpenAIError) as e:
        oa.parse_chat({"model": "dspark", "messages": messages})
    assert e.value.param == param


def test_message_text_parts_are_joined_and_names_kept():
    req = oa.parse_chat({"model": "m", "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "name": "ann", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]})
    assert req.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "ab", "name": "ann"}]


def test_max_tokens_fields_must_agree():
    with pytest.raises(oa.OpenAIError, match="disagree"):
        chat(max_tokens=5, max_completion_tokens=6)


def test_a_body_that_is_not_an_object():
    for body in ([], "x", 3, None):
        with pytest.raises(oa.OpenAIError, match="JSON object"):
            oa.parse_completion(body)


def test_a_missing_field_is_required_by_name():
    with pytest.raises(oa.OpenAIError) as e:
        oa.parse_completion({"prompt": "x"})
    assert e.value.param == "model" and "'model' is required: the name of a model" in e.value.message
    with pytest.raises(oa.OpenAIError) as e:
        oa.parse_chat({"model": "m"})
    assert e.value.param == "messages" and "required" in e.value.message


def test_error_shape():
    e = oa.OpenAIError("bad n", param="n", code="unsupported_parameter")
    assert e.body() == {"error": {"message": "bad n", "type": "invalid_request_error", "param": "n",
                                  "code": "unsupported_parameter"}}
    assert oa.OpenAIError("busy", status=503).type == "server_busy"
    assert oa.OpenAIError("boom", status=500).type == "server_error"


@pytest.mark.parametrize("message,status", [
    ("server busy: 1 requests already wait for one of 1 batch rows", 503),
    ("Stub process 'dspark_0_0' is not healthy.", 503),
    ("Request for unknown model: 'dspark' is not found", 503),
    ("internal error: RuntimeError: x", 500),
    ("decoding failed: boom", 500),
    ("prompt (9000 tokens) + max_new_tokens (16) exceeds the model's context of 8192 tokens", 400),
    ("input_ids has token id 9999 outside the vocabulary [0, 2560)", 400),
])
def test_triton_error_wording_maps_to_http_status(message, status):
    assert http_status(message) == status


def test_generate_inputs_leave_out_what_is_off():
    t = generate_inputs([1, 2, 3], 8, temperature=0.0, seed=0)
    assert sorted(t) == ["input_ids", "max_tokens", "seed", "stream", "temperature"]
    assert t["input_ids"].dtype.name == "int64" and t["max_tokens"].dtype.name == "int32" and bool(t["stream"][0])
    t = generate_inputs([1], 4, stop=["a", "é"], top_p=0.5, top_k=3)
    assert list(t["stop"]) == [b"a", "é".encode()] and t["top_p"][0] == 0.5 and t["top_k"][0] == 3
    assert "top_p" not in generate_inputs([1], 4, top_p=1.0)


def test_cpu_host_noise_is_recognised():
    from dspark_trt.serving.server import is_cpu_host_noise

    assert is_cpu_host_noise('E1202 03:47:47.463410 8126 server.cc:241] "CudaDriverHelper has not been initialized."')
    assert is_cpu_host_noise("Error: Failed to initialize NVML")
    assert is_cpu_host_noise('W1202 metrics.cc:798] "DCGM unable to start: DCGM initialization error"')
    assert not is_cpu_host_noise('E1202 model_lifecycle.cc:642] "failed to load \'dspark\' version 1"')



def test_the_built_answers_are_the_typed_responses():
    """The dicts the front end sends validate against the models the OpenAPI document describes them with."""
    from types import SimpleNamespace

    final = SimpleNamespace(mean_acceptance_length=2.5, rounds=4, drafted=12, accepted=6, batch_size=3)
    stats, use = oa.dspark_stats(final), oa.usage(5, 10)
    oa.CompletionResponse.model_validate(oa.completion_response("cmpl-1", "m", "text", "stop", use, stats))
    oa.ChatCompletionResponse.model_validate(oa.chat_response("chatcmpl-1", "m", "text", "length", use, stats))
    oa.CompletionResponse.model_validate(oa.completion_chunk("cmpl-1", "m", 1, "piece"))
    oa.CompletionResponse.model_validate(oa.completion_chunk("cmpl-1", "m", 1, "", "stop", stats))
    oa.CompletionResponse.model_validate(oa.usage_chunk("cmpl-1", "m", 1, "text_completion", use, stats))
    for delta in ({"role": "assistant", "content": ""}, {"content": "x"}, {}):
        oa.ChatCompletionChunk.model_validate(oa.chat_chunk("chatcmpl-1", "m", 1, delta))
    oa.ChatCompletionChunk.model_validate(oa.usage_chunk("chatcmpl-1", "m", 1, "chat.completion.chunk", use, stats))
    oa.ErrorResponse.model_validate(oa.OpenAIError("x", param="n").body())
    with pytest.raises(Exception):  # the models are strict about what an answer holds: a test that can fail
        oa.CompletionResponse.model_validate({**oa.completion_response("c", "m", "t", "stop", use, stats), "x": 1})


def test_the_openapi_document_describes_every_route():
    doc = oa.openapi_document(keys=True)
    assert set(doc["paths"]) == {"/health", "/health/ready", "/health/live", "/v1/models", "/v1/completions",
                                 "/v1/chat/completions"}
    schemas = doc["components"]["schemas"]
    body = schemas["CompletionRequestBody"]
    assert body["additionalProperties"] is False and set(body["required"]) == {"model", "prompt"}
    assert body["properties"]["max_tokens"]["anyOf"][0]["maximum"] == 2**31 - 1
    assert "n" in body["properties"] and "messages" in schemas["ChatRequestBody"]["required"]
    assert doc["paths"]["/v1/completions"]["post"]["security"] == [{"bearer": []}]
    assert all("security" not in doc["paths"][p]["get"] for p in ("/health", "/health/ready", "/health/live"))
    assert "securitySchemes" not in oa.openapi_document(keys=False)["components"]
