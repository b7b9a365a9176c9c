"""The front end's own behaviour, served by uvicorn on 127.0.0.1 with no Triton behind it (a closed port):
readiness, what is refused before Triton is asked, and how an unreachable Triton reads. The answers with a
real tritonserver are in test_openai_frontend.py."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("sse_starlette")
pytest.importorskip("tritonclient.grpc")


@pytest.fixture(scope="module")
def frontend(tmp_path_factory):
    from dspark_trt.serving.openai_app import FrontendConfig, OpenAIFrontend
    from dspark_trt.serving.server import free_port
    from dspark_trt.synthetic.byte_tokenizer import write_byte_tokenizer

    tokenizer = tmp_path_factory.mktemp("tokenizer")
    write_byte_tokenizer(tokenizer)  # no chat template
    config = FrontendConfig(triton_grpc=f"127.0.0.1:{free_port()}", tokenizer_dir=tokenizer, max_context=64,
                            ready_poll_seconds=3600)
    f = OpenAIFrontend(config, port=0).start()
    yield f
    f.stop()


def call(frontend, path: str, body=None, *, raw: bytes | None = None):
    url = f"http://{frontend.host}:{frontend.port}{path}"
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), dict(e.headers)


def test_the_listening_socket_is_tcp_so_nagle_is_off():
    # asyncio sets TCP_NODELAY on accepted connections only when the listening socket's proto is IPPROTO_TCP;
    # with proto 0 every answer waited ~40 ms for the client's delayed ACK (measured: 44 ms vs 0.5 ms)
    from dspark_trt.serving.openai_app import FrontendConfig, OpenAIFrontend

    f = OpenAIFrontend(FrontendConfig(triton_grpc="127.0.0.1:1"), port=0).bind()
    try:
        assert f._socket.proto == socket.IPPROTO_TCP and f.port > 0
    finally:
        f.stop()


def test_a_busy_port_is_one_line_naming_the_flag(frontend):
    from dspark_trt.errors import DSparkTrtError
    from dspark_trt.serving.openai_app import FrontendConfig, OpenAIFrontend

    with pytest.raises(DSparkTrtError, match="--openai-port"):
        OpenAIFrontend(FrontendConfig(triton_grpc="127.0.0.1:1"), port=frontend.port).bind()


def test_without_triton_nothing_is_ready(frontend):
    status, body, _ = call(frontend, "/health")
    assert status == 503 and body["status"] == "unavailable" and "not ready" in body["reason"]
    assert call(frontend, "/v1/models")[:2] == (200, {"object": "list", "data": []})
    status, body, headers = call(frontend, "/v1/completions", {"model": "dspark", "prompt": "x", "max_tokens": 2})
    assert status == 503 and "not ready" in body["error"]["message"] and headers.get("retry-after") == "1"


def test_refusals_that_need_no_model(frontend):
    assert call(frontend, "/v1/completions", raw=b"{not json")[0] == 400
    status, body, _ = call(frontend, "/v1/completions", {"model": "other", "prompt": "x"})
    assert status == 404 and body["error"]["code"] == "model_not_found"
    status, body, _ = call(frontend, "/v1/chat/completions", {"model": "dspark", "messages": [], "n": 1})
    assert status == 400 and body["error"]["param"] == "messages"
    status, body, _ = call(frontend, "/v1/completions", raw=b'{"model": "dspark", "prompt": "' + b"a" * (5 << 20) + b'"}')
    assert status == 413


def test_checks_after_readiness_and_an_unreachable_triton(frontend):
    frontend.readiness.set_triton_ready(True)  # as if Triton said so: what comes next is the front end's own
    try:
        status, body, _ = call(frontend, "/v1/chat/completions",
                               {"model": "dspark", "messages": [{"role": "user", "content": "hi"}]})
        # the exact flag, with the template dspark-trt ships (a file that exists, beside the package's code)
        from dspark_trt.serving.chat_template import PLAIN_CHAT_TEMPLATE

        assert status == 400 and f"--chat-template {PLAIN_CHAT_TEMPLATE} " in body["error"]["message"]
        assert PLAIN_CHAT_TEMPLATE.is_file() and body["error"]["param"] == "messages"
        status, body, _ = call(frontend, "/v1/completions", {"model": "dspark", "prompt": "a" * 60, "max_tokens": 5})
        assert status == 400 and body["error"]["param"] == "max_tokens" and "at most 4" in body["error"]["message"]
        status, body, _ = call(frontend, "/v1/completions", {"model": "dspark", "prompt": "a" * 64})
        assert status == 400 and body["error"]["code"] == "context_length_exceeded"
        status, body, _ = call(frontend, "/v1/completions", {"model": "dspark", "prompt": "a" * 300_000})
        assert status == 400 and "bytes" in body["error"]["message"]
        status, body, _ = call(frontend, "/v1/completions", {"model": "dspark", "prompt": "abc", "max_tokens": 3})
        assert status == 503 and "unreachable" in body["error"]["message"]
    finally:
        frontend.readiness.set_triton_ready(False)


def test_the_api_description_and_odd_bodies(frontend):
    status, doc, _ = call(frontend, "/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.") and "/v1/chat/completions" in doc["paths"]
    status, body, _ = call(frontend, "/v1/completions", raw=b'{"model": "dspark", "prompt": "\\ud800"}')
    assert status == 400 and "surrogate" in body["error"]["message"]
    status, body, _ = call(frontend, "/v1/completions", raw=b"[" * 100_000)
    assert status == 400 and "not valid JSON" in body["error"]["message"]


def test_a_drain_refuses_new_requests_and_keeps_liveness(tmp_path):
    """Readiness false for good, every new request 503 with Retry-After (even a malformed one: nothing is read),
    liveness 200 saying so; the in-flight count is what dspark serve's drain waits on."""
    from dspark_trt.serving.openai_app import DRAINING, FrontendConfig, OpenAIFrontend, Readiness
    from dspark_trt.serving.server import free_port

    readiness = Readiness()
    readiness.set_triton_ready(True)
    f = OpenAIFrontend(FrontendConfig(triton_grpc=f"127.0.0.1:{free_port()}", ready_poll_seconds=3600),
                       port=0, readiness=readiness).start()
    try:
        status, body, _ = call(f, "/health/live")
        assert status == 200 and body == {"status": "alive", "model": "dspark", "draining": False, "in_flight": 0}
        readiness.start_drain()
        readiness.set_triton_ready(True)  # Triton still up: the drain alone makes it not ready
        for path in ("/health", "/health/ready"):
            status, body, _ = call(f, path)
            assert status == 503 and body["reason"] == DRAINING
        status, body, headers = call(f, "/v1/completions", {"model": "dspark", "prompt": "x", "max_tokens": 2})
        assert status == 503 and body["error"]["message"] == DRAINING and headers.get("retry-after") == "1"
        assert call(f, "/v1/chat/completions", raw=b"{not json")[0] == 503
        status, body, _ = call(f, "/health/live")
        assert status == 200 and body["draining"] is True and f.in_flight() == 0
    finally:
        f.stop()
