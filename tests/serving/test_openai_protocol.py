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


@pytest.mark.parametrize("fields,param,words", [
    ({"max_tokens": 0}, "max_tokens", "at least 1"),
    ({"max_tokens": -1}, "max_tokens", "at least 1"),
    ({"max_tokens": "10"}, "max_tokens", "integer"),
    ({"max_tokens": True}, "max_tokens", "integer"),
    ({"max_tokens": 2.5}, "max_tokens", "integer"),
    ({"temperature": "hot"}, "temperature", "must be a number"),
    ({"temperature": -0.1}, "temperature", ">= 0"),
    ({"temperature": 2.5}, "temperature", "<= 2"),
    ({"temperature": math.nan}, "temperature", ">= 0"),
    ({"temperature": True}, "temperature", "must be a number"),
    ({"top_p": 0}, "top_p", "> 0"),
    ({"top_p": 1.5}, "top_p", "<= 1"),
    ({"top_k": -2}, "top_k", "integer >= 0"),
    ({"top_k": 1.5}, "top_k", "integer >= 0"),
    ({"seed": -1}, "seed", "[0, 2**63)"),
    ({"seed": 2**63}, "seed", "[0, 2**63)"),
    ({"seed": "1"}, "seed", "integer"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
    ({"stop": [""]}, "stop", "non-empty"),
    ({"stop": 3}, "stop", "non-empty"),
    ({"stream": "yes"}, "stream", "true or false"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "only allowed with stream"),
    ({"stream": True, "stream_options": {"other": 1}}, "stream_options", "include_usage"),
    ({"prompt": ""}, "prompt", "empty"),
    ({"prompt": []}, "prompt", "empty"),
    ({"prompt": ["a", "b"]}, "prompt", "one prompt per request"),
    ({"prompt": [1, "a"]}, "prompt", "token ids"),
    ({"prompt": None}, "prompt", "required"),
    ({"echo": "yes"}, "echo", "true or false"),
    ({"model": ""}, "model", "required"),
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

