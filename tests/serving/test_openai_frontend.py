"""The OpenAI-compatible front end in front of a real tritonserver (127.0.0.1, free ports), with real clients:
the official ``openai`` package (sync, async, streaming), curl, and raw HTTP for what a client library would
refuse to send.

One deployment for the module (``Deployment``: tritonserver + the front end on a thread), serving the
embedded demo pair's fp32 export (byte tokenizer; a small chat template given, as the tokenizer has none).
Every answer is compared with in-process ``SpeculativeDecoder.generate`` of the same prompt alone (same
export, onnxruntime, one thread). The answers never include the prompt (``echo`` adds it).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import random
import re
import subprocess
import time
import urllib.error
import urllib.request

import pytest

pytestmark = [pytest.mark.tritonserver, pytest.mark.onnx, pytest.mark.slow, pytest.mark.xdist_group("tritonserver")]

openai = pytest.importorskip("openai")

TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
PROMPTS = ["Speculative decoding", "A small drafter", "The target model checks", "tokens", "x",
           "Speculative decoding lets a small drafter guess several tokens ahead while", "the verifier"]


@pytest.fixture(scope="module")
def decoder(embedded_export):
    from dspark_trt.runtime import SpeculativeDecoder

    return SpeculativeDecoder.from_export(embedded_export, backend="onnxruntime", device="cpu", threads=1)


@pytest.fixture(scope="module")
def served(tmp_path_factory, embedded_export):
    from dspark_trt.serving.deployment import Deployment, resolve_source
    from dspark_trt.serving.settings import ServeOptions

    log = tmp_path_factory.mktemp("openai") / "tritonserver.log"
    options = ServeOptions(threads=1, http_port=0, grpc_port=0, metrics_port=0, openai_port=0, chat_template=TEMPLATE,
                           log_file=log, exit_timeout=5)
    d = Deployment(resolve_source(embedded_export), options, say=lambda line: None)
    d.start()
    d.log_path = log
    yield d
    code = d.stop()
    assert code == 0, f"tritonserver exit code {code} (a model that never unloads waits for the exit timeout); see {log}"


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.frontend.url, api_key="unused", max_retries=0, timeout=300)


def alone(decoder, prompt, max_tokens, temperature=0.0, seed=0, **kwargs):
    out = decoder.generate(prompt, max_tokens, temperature=temperature, seed=seed, **kwargs)
    return out.texts[0], out.tokens[0]


def chat_prompt(decoder, messages):
    return decoder.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                 chat_template=TEMPLATE)


def post(served, path: str, body, *, raw: bytes | None = None, timeout: float = 300):
    """(status, decoded JSON) of a POST to the front end."""
    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(f"{served.frontend.url}{path}", data=data,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def get(url: str):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_models_and_health_reflect_readiness(served, client):
    assert [m.id for m in client.models.list()] == ["dspark"]
    base = served.frontend.url.removesuffix("/v1")
    assert get(f"{base}/health") == (200, {"status": "ok", "model": "dspark"})
    served.readiness.mark_down("a test says so")  # what the supervisor does when the stub dies
    try:
        status, body = get(f"{base}/health")
        assert status == 503 and body["reason"] == "a test says so"
        assert get(f"{served.frontend.url}/models")[1]["data"] == []
        with pytest.raises(openai.APIStatusError) as e:
            client.completions.create(model="dspark", prompt="x", max_tokens=2, temperature=0)
        assert e.value.status_code == 503 and "not ready" in e.value.message
    finally:
        served.readiness.mark_up()
    assert get(f"{base}/health")[0] == 200


def test_completions_equal_generate_and_count_usage(client, decoder):
    for prompt in PROMPTS[:4]:
        text, ids = alone(decoder, prompt, 24)
        r = client.completions.create(model="dspark", prompt=prompt, max_tokens=24, temperature=0)
        choice = r.choices[0]
        assert choice.text == text  # the generated text only: the prompt is not echoed
        assert choice.finish_reason == ("length" if len(ids) == 24 else "stop")
        n_prompt = len(decoder.tokenizer.encode(prompt, add_special_tokens=False))
        assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == \
            (n_prompt, len(ids), n_prompt + len(ids))
        stats = r.model_extra["dspark"]
        assert 0 <= stats["accepted"] <= stats["drafted"] and stats["rounds"] >= 1
        assert stats["mean_acceptance_length"] == pytest.approx((stats["accepted"] + stats["rounds"]) / stats["rounds"],
                                                                rel=1e-5)
    echoed = client.completions.create(model="dspark", prompt=PROMPTS[0], max_tokens=24, temperature=0, echo=True)
    assert echoed.choices[0].text == PROMPTS[0] + alone(decoder, PROMPTS[0], 24)[0]
    # token ids in, sampling with a seed: the same tokens as in-process
    ids_prompt = decoder.tokenizer.encode(PROMPTS[5], add_special_tokens=False)
    text, ids = alone(decoder, [ids_prompt], 20, temperature=1.0, seed=11)
    r = client.completions.create(model="dspark", prompt=ids_prompt, max_tokens=20, temperature=1.0, seed=11)
    assert r.choices[0].text == text and r.usage.completion_tokens == len(ids)


def test_streamed_chunks_concatenate_to_the_answer(client, decoder):
    prompt = PROMPTS[5]
    text, ids = alone(decoder, prompt, 40, temperature=1.0, seed=5)
    full = client.completions.create(model="dspark", prompt=prompt, max_tokens=40, temperature=1.0, seed=5)
    assert full.choices[0].text == text
    chunks = list(client.completions.create(model="dspark", prompt=prompt, max_tokens=40, temperature=1.0, seed=5,
                                            stream=True, stream_options={"include_usage": True}))
    pieces = [c.choices[0].text for c in chunks if c.choices]
    assert len([p for p in pieces if p]) > 2 and "".join(pieces) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == full.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ids)
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens

    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "The verifier"}]
    text, ids = alone(decoder, chat_prompt(decoder, messages), 32)
    answer = client.chat.completions.create(model="dspark", messages=messages, max_tokens=32, temperature=0)
    assert answer.choices[0].message.content == text and answer.choices[0].message.role == "assistant"
    assert answer.usage.completion_tokens == len(ids)
    stream = list(client.chat.completions.create(model="dspark", messages=messages, max_completion_tokens=32,
                                                 temperature=0, stream=True))
    assert stream[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in stream) == text
    assert stream[-1].choices[0].finish_reason == answer.choices[0].finish_reason


def test_events_ready_together_go_out_in_one_chunk(served, decoder):
    """The stream's bytes are server-sent events, one per round, each ``data: JSON`` and a blank line, ending in
    ``data: [DONE]``; events ready at the same moment share one HTTP chunk (one write, one TLS record): the chat's
    role with its first text, and the last text with the usage and [DONE]."""
    import aiohttp

    messages = [{"role": "user", "content": "The verifier"}]
    text, ids = alone(decoder, chat_prompt(decoder, messages), 24)
    body = {"model": "dspark", "messages": messages, "max_tokens": 24, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}

    async def chunks():
        out, part = [], b""
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{served.frontend.url}/chat/completions", json=body) as r:
                assert r.status == 200 and r.headers["content-type"].startswith("text/event-stream")
                async for data, end_of_chunk in r.content.iter_chunks():  # HTTP chunked-encoding boundaries
                    part += data
                    if end_of_chunk and part:
                        out.append(part)
                        part = b""
        return out + ([part] if part else [])

    received = asyncio.run(chunks())
    stream = b"".join(received)
    events = [e for e in stream.split(b"\n\n")]
    assert events[-1] == b"" and all(e.startswith(b"data: ") and b"\n" not in e for e in events[:-1])
    events = [e[len(b"data: "):] for e in events[:-1]]
    assert events[-1] == b"[DONE]"
    chunks_ = [json.loads(e) for e in events[:-1]]
    assert chunks_[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks_ if c["choices"]) == text
    assert chunks_[-1]["choices"] == [] and chunks_[-1]["usage"]["completion_tokens"] == len(ids)
    texts = [c for c in chunks_[1:-1] if c["choices"][0]["delta"].get("content")]
    assert len(texts) >= 2 and len(received) < len(events)  # several rounds, fewer writes than events
    first = [json.loads(e[len(b"data: "):]) for e in received[0].split(b"\n\n")[:-1]]
    assert len(first) >= 2 and first[1]["choices"][0]["delta"]["content"]  # the role and the first text together
    last = received[-1].split(b"\n\n")[:-1]
    assert last[-1] == b"data: [DONE]" and len(last) >= 3  # the last round's text, the usage and [DONE] together
    assert json.loads(last[-3][len(b"data: "):])["choices"][0]["finish_reason"] is not None


def test_stop_cuts_exactly(client, decoder):
    prompt = PROMPTS[0]
    text, _ = alone(decoder, prompt, 48)
    stop = text[12:15]  # a string that the greedy answer contains
    expected = text[: text.find(stop)]
    r = client.completions.create(model="dspark", prompt=prompt, max_tokens=48, temperature=0, stop=[stop, "\x00"])
    assert r.choices[0].text == expected and r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == alone(decoder, prompt, 48, stop=[stop])[0]
    streamed = client.completions.create(model="dspark", prompt=prompt, max_tokens=48, temperature=0, stop=stop,
                                         stream=True)
    pieces = [c.choices[0].text for c in streamed]
    assert "".join(pieces) == expected
    unmatched = client.completions.create(model="dspark", prompt=prompt, max_tokens=48, temperature=0, stop="\x01\x02")
    assert unmatched.choices[0].text == text


def test_64_concurrent_streaming_chats_each_equal_its_answer_alone(served, decoder):
    rng = random.Random(0)
    requests = []
    for i in range(64):
        messages = [{"role": "user", "content": rng.choice(PROMPTS) + f" ({i})"}]
        temperature, seed = (0.0, 0) if i % 2 == 0 else (1.0, 100 + i)
        requests.append((messages, rng.choice([8, 16]), temperature, seed))
    # in-process, one batch per max_tokens: generate's results do not depend on the batch (the runtime's
    # tests check that against each request alone), and 64 requests one by one would take a minute here
    expected = [None] * len(requests)
    for n in (8, 16):
        idx = [i for i, r in enumerate(requests) if r[1] == n]
        out = decoder.generate([chat_prompt(decoder, requests[i][0]) for i in idx], n,
                               temperature=[requests[i][2] for i in idx], seed=[requests[i][3] for i in idx])
        for i, text in zip(idx, out.texts):
            expected[i] = text

    async def run():
        aclient = openai.AsyncOpenAI(base_url=served.frontend.url, api_key="unused", max_retries=0, timeout=600)

        async def one(messages, n, temperature, seed):
            stream = await aclient.chat.completions.create(model="dspark", messages=messages, max_tokens=n,
                                                           temperature=temperature, seed=seed, stream=True)
            parts, batch = [], 0
            async for chunk in stream:
                parts.append(chunk.choices[0].delta.content or "")
                batch = max(batch, (chunk.model_extra.get("dspark") or {}).get("batch_size") or 0)
            return "".join(parts), batch

        try:
            return await asyncio.gather(*(one(*r) for r in requests))
        finally:
            await aclient.close()

    answers = asyncio.run(run())
    for i, ((text, _), want) in enumerate(zip(answers, expected)):
        assert text == want, f"request {i}"
    assert max(b for _, b in answers) > 1  # they were batched together


def test_async_client_without_streaming(served, decoder):
    async def run():
        async with openai.AsyncOpenAI(base_url=served.frontend.url, api_key="unused", max_retries=0) as aclient:
            return await aclient.chat.completions.create(model="dspark", messages=[{"role": "user", "content": "x"}],
                                                         max_tokens=12, temperature=0)

    r = asyncio.run(run())
    assert r.choices[0].message.content == alone(decoder, chat_prompt(decoder, [{"role": "user", "content": "x"}]),
                                                 12)[0]


BAD = [  # (path, body or raw bytes, status, param, words)
    ("/completions", b'{"model": "dspark", "prompt": ', 400, None, "not valid JSON"),
    ("/completions", {"model": "gpt-4", "prompt": "x", "max_tokens": 2}, 404, "model", "does not exist"),
    ("/chat/completions", {"model": "dspark", "messages": []}, 400, "messages", "at least 1 item"),
    ("/completions", {"model": "dspark", "prompt": "x", "max_tokens": 0}, 400, "max_tokens", "greater than or equal"),
    ("/completions", {"model": "dspark", "prompt": "x", "max_tokens": -1}, 400, "max_tokens", "greater than or equal"),
    ("/completions", {"model": "dspark", "prompt": "x", "max_tokens": 10**9}, 400, "max_tokens", "context of 8192"),
    ("/chat/completions", {"model": "dspark", "messages": [{"role": "user", "content": "x"}],
                           "max_completion_tokens": 10**9}, 400, "max_completion_tokens", "context"),
    ("/completions", {"model": "dspark", "prompt": "x", "temperature": "hot"}, 400, "temperature", "number"),
    ("/completions", {"model": "dspark", "prompt": "x", "n": 2}, 400, "n", "one choice"),
    ("/completions", {"model": "dspark", "prompt": "x", "logprobs": 3}, 400, "logprobs", "log probabilities"),
    ("/chat/completions", {"model": "dspark", "messages": [{"role": "user", "content": "x"}],
                           "presence_penalty": 0.5}, 400, "presence_penalty", "penalties"),
    ("/chat/completions", {"model": "dspark", "messages": [{"role": "user", "content": "x"}],
                           "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools", "tool"),
    ("/completions", {"model": "dspark", "prompt": "a" * 1_000_000, "max_tokens": 2}, 400, "prompt", "bytes"),
    ("/completions", {"model": "dspark", "prompt": [1, 99999], "max_tokens": 2}, 400, None, "vocabulary"),
]


def test_bad_requests_each_followed_by_a_good_one(served, client, decoder):
    good_text = alone(decoder, "A small drafter", 8)[0]
    for path, body, status, param, words in BAD:
        raw = body if isinstance(body, bytes) else None
        code, answer = post(served, path, body, raw=raw)
        assert code == status, (path, body if raw else list(body), answer)
        error = answer["error"]
        assert words in error["message"] and set(error) == {"message", "type", "param", "code"}
        if param is not None:
            assert error["param"] == param
        r = client.completions.create(model="dspark", prompt="A small drafter", max_tokens=8, temperature=0)
        assert r.choices[0].text == good_text
    with pytest.raises(openai.BadRequestError) as e:  # what a client library makes of it
        client.chat.completions.create(model="dspark", messages=[{"role": "user", "content": "x"}], n=3)
    assert e.value.body["param"] == "n"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x")


def _cancelled(served) -> int:
    counts = [int(n) for n in re.findall(r"(\d+) cancelled", served.log_path.read_text(errors="replace"))]
    return max(counts, default=0)


def _wait_cancelled(served, at_least: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while _cancelled(served) < at_least:
        assert time.monotonic() < deadline, f"the model never logged {at_least} cancelled request(s)"
        time.sleep(0.2)


def test_a_client_that_disconnects_cancels_its_triton_request(served, client, decoder):
    before = _cancelled(served)
    host, port = served.frontend.host, served.frontend.port
    conn = http.client.HTTPConnection(host, port, timeout=60)
    body = json.dumps({"model": "dspark", "prompt": "Speculative", "max_tokens": 4000, "stream": True,
                       "temperature": 0})
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    events = 0
    while events < 3:
        line = response.fp.readline()
        events += line.startswith(b"data:")
    conn.close()  # mid-stream
    _wait_cancelled(served, before + 1)
    # a non-streaming request whose client gives up is cancelled too
    impatient = openai.OpenAI(base_url=served.frontend.url, api_key="unused", max_retries=0, timeout=1.5)
    with pytest.raises(openai.APITimeoutError):
        impatient.completions.create(model="dspark", prompt="Speculative", max_tokens=4000, temperature=0)
    _wait_cancelled(served, before + 2)
    r = client.completions.create(model="dspark", prompt="tokens", max_tokens=10, temperature=0)
    assert r.choices[0].text == alone(decoder, "tokens", 10)[0]


def test_curl(served, decoder):
    url = f"{served.frontend.url}/completions"
    body = json.dumps({"model": "dspark", "prompt": "The target model checks", "max_tokens": 16, "temperature": 0})
    out = subprocess.run(["curl", "-sS", url, "-H", "Content-Type: application/json", "-d", body],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    text = alone(decoder, "The target model checks", 16)[0]
    assert json.loads(out)["choices"][0]["text"] == text
    stream = json.dumps({**json.loads(body), "stream": True})
    out = subprocess.run(["curl", "-sSN", url, "-H", "Content-Type: application/json", "-d", stream],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    events = [line[len("data: "):] for line in out.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == text


def test_metrics_endpoint_counts_what_the_front_end_reports(served, client):
    from dspark_trt.serving.client import scrape_metrics

    def total(samples, name):
        return sum(v for (n, _), v in samples.items() if n == name)

    url = served.server.endpoints.metrics
    before = scrape_metrics(url, "dspark_")
    r = client.completions.create(model="dspark", prompt=PROMPTS[1], max_tokens=20, temperature=0)
    after = scrape_metrics(url, "dspark_")
    stats = r.model_extra["dspark"]
    assert total(after, "dspark_generated_tokens_total") - total(before, "dspark_generated_tokens_total") == \
        r.usage.completion_tokens
    assert total(after, "dspark_accepted_tokens_total") - total(before, "dspark_accepted_tokens_total") == \
        stats["accepted"]
    assert total(after, "dspark_request_rounds_total") - total(before, "dspark_request_rounds_total") == \
        stats["rounds"]


def test_deployment_writes_the_serving_flags_and_refuses_them_for_a_ready_repository(tmp_path, embedded_export):
    from dspark_trt.cli.main import main
    from dspark_trt.serving.deployment import Deployment, resolve_source
    from dspark_trt.serving.settings import ServeOptions
    from dspark_trt.serving.repository import read_model_config

    d = Deployment(resolve_source(embedded_export), ServeOptions(instances=2, max_queue=3, max_batch_size=8))
    try:
        repo = d.prepare()
        config = read_model_config(repo / "dspark" / "config.pbtxt")
        assert config.instance_group[0].count == 2
        assert config.parameters["max_queue"].string_value == "3"
        assert config.parameters["max_batch_size"].string_value == "8"
        assert resolve_source(repo).kind == "repository"
        assert main(["serve", str(repo), "--instances", "2", "--max-queue", "1"]) == 1  # one line, nothing started
    finally:
        d.stop()
    assert not repo.exists()  # the scratch repository goes with the deployment


def test_a_restarted_server_serves_again_behind_the_same_front_end(served, client, decoder):
    """The supervisor's last resort (a model that does not reload): tritonserver stopped and started again on
    the same ports; the front end reconnects. Last in the module: it replaces the server process."""
    old = served.server.process.pid
    served.restart_server()
    assert served.server.process.pid != old
    base = served.frontend.url.removesuffix("/v1")
    deadline = time.monotonic() + 60
    while get(f"{base}/health")[0] != 200:
        assert time.monotonic() < deadline, "the front end never saw the restarted server ready"
        time.sleep(0.2)
    r = client.completions.create(model="dspark", prompt="A small drafter", max_tokens=8, temperature=0)
    assert r.choices[0].text == alone(decoder, "A small drafter", 8)[0]
