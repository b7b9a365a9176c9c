"""A server that can face a network (issue 45), with a real tritonserver and real clients.

``dspark serve EXPORT --host 0.0.0.0`` as a user runs it (a subprocess): API keys from a file and from
DSPARK_API_KEY, HTTPS with a self-signed certificate made here, the metrics endpoint published alone
(``--metrics-host 0.0.0.0``), the access log on. Checked: every /v1 route (plain and streamed) refuses a missing
or wrong key with a 401 in OpenAI's error shape and answers the right keys, through the ``openai`` client, raw
HTTP and curl; the health probe needs no key; no key shows in what it printed, the logs, or any of its processes'
command lines (nor tritonserver's environment); Triton's HTTP and gRPC endpoints listen on 127.0.0.1 only, the
front end on 0.0.0.0; plain HTTP to the HTTPS port fails cleanly and the server serves on.

Then a deployment with Triton published (``triton_host="0.0.0.0"``): it listens there, and loading, unloading
and reading model configurations over HTTP and gRPC are refused without the supervisor's header while the model
keeps serving; the supervisor's own reload (a dead stub's restart) still works.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from dspark_trt.bench.serve_openai import self_signed_certificate

pytestmark = [pytest.mark.tritonserver, pytest.mark.onnx, pytest.mark.slow, pytest.mark.xdist_group("tritonserver")]

openai = pytest.importorskip("openai")
psutil = pytest.importorskip("psutil")

FILE_KEY = "sk-dspark-file-7f3c9a1e"
ENV_KEY = "sk-dspark-env-b21d04c8"
TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
GOOD = {"model": "dspark", "prompt": "A small drafter", "max_tokens": 8, "temperature": 0}
CHAT = {"model": "dspark", "messages": [{"role": "user", "content": "The verifier"}], "max_tokens": 8,
        "temperature": 0}


@pytest.fixture(scope="module")
def secure(tmp_path_factory, embedded_export):
    """``dspark serve`` of the embedded export on 0.0.0.0 with keys (file + environment) and HTTPS."""
    from tests.serving.test_dspark_serve import Serve

    root = tmp_path_factory.mktemp("secure")
    key_file, cert_file = self_signed_certificate(root)  # the one bench serve --secure makes
    keys = root / "keys.txt"
    keys.write_text(f"# keys of the test\n{FILE_KEY}\n")
    template = root / "chat.jinja"
    template.write_text(TEMPLATE)
    args = [str(embedded_export), "--host", "0.0.0.0", "--openai-port", "0", "--http-port", "0", "--grpc-port", "0",
            "--metrics-port", "0", "--metrics-host", "0.0.0.0", "--threads", "1", "--exit-timeout", "3",
            "--log-file", str(root / "tritonserver.log"), "--api-key-file", str(keys), "--ssl-keyfile", key_file,
            "--ssl-certfile", cert_file, "--chat-template", str(template), "--access-log"]
    os.environ["DSPARK_API_KEY"] = ENV_KEY  # read by the dspark serve started now
    try:
        serve = Serve(args, root / "stderr.txt")
    finally:
        del os.environ["DSPARK_API_KEY"]
    serve.root, serve.cert = root, cert_file
    serve.tls = ssl.create_default_context(cafile=cert_file)
    try:
        serve.ready(timeout=600)
        yield serve
        serve.proc.send_signal(signal.SIGTERM)
        assert serve.proc.wait(120) == 0
    finally:
        serve.kill()


def client(serve, key: str) -> "openai.OpenAI":
    return openai.OpenAI(base_url=serve.openai, api_key=key, max_retries=0, timeout=120,
                         http_client=openai.DefaultHttpxClient(verify=serve.tls))


def call(serve, path: str, body=None, headers=None, *, base=None):
    """(status, headers, decoded JSON or text) of a GET (no body) or POST to the front end, over HTTPS."""
    url = f"{base or serve.openai.removesuffix('/v1')}{path}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=120, context=serve.tls) as r:
            status, head, raw = r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        status, head, raw = e.code, dict(e.headers), e.read()
    try:
        return status, head, json.loads(raw)
    except ValueError:
        return status, head, raw.decode()


def assert_401(status, headers, body):
    assert status == 401, (status, body)
    assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["code"] == "invalid_api_key"
    assert {k.lower(): v for k, v in headers.items()}["www-authenticate"].startswith("Bearer")
    assert FILE_KEY not in json.dumps(body) and ENV_KEY not in json.dumps(body)


def test_every_v1_route_needs_a_key_through_the_openai_client(secure):
    for key in ("wrong-key", FILE_KEY[:-1], FILE_KEY + "x"):
        c = client(secure, key)
        for call_ in (lambda: c.models.list(),
                      lambda: c.completions.create(model="dspark", prompt="x", max_tokens=2),
                      lambda: list(c.completions.create(model="dspark", prompt="x", max_tokens=2, stream=True)),
                      lambda: c.chat.completions.create(model="dspark", messages=[{"role": "user", "content": "x"}]),
                      lambda: list(c.chat.completions.create(model="dspark", stream=True,
                                                             messages=[{"role": "user", "content": "x"}]))):
            with pytest.raises(openai.AuthenticationError) as e:
                call_()
            assert e.value.status_code == 401 and e.value.code == "invalid_api_key"
    answers = set()
    for key in (FILE_KEY, ENV_KEY):
        c = client(secure, key)
        assert [m.id for m in c.models.list()] == ["dspark"]
        text = c.completions.create(**GOOD).choices[0].text
        streamed = "".join(ch.choices[0].text for ch in c.completions.create(**GOOD, stream=True))
        chat = c.chat.completions.create(**CHAT).choices[0].message.content
        chat_streamed = "".join(ch.choices[0].delta.content or ""
                                for ch in c.chat.completions.create(**CHAT, stream=True))
        assert text and streamed == text and chat and chat_streamed == chat
        answers.add((text, chat))
    assert len(answers) == 1  # both keys get the same answers


def test_keys_over_raw_http_and_curl(secure):
    routes = [("/v1/models", None), ("/v1/completions", GOOD), ("/v1/completions", {**GOOD, "stream": True}),
              ("/v1/chat/completions", CHAT), ("/v1/chat/completions", {**CHAT, "stream": True}),
              ("/v1/no-such-route", None)]
    for path, body in routes:
        assert_401(*call(secure, path, body))
        assert_401(*call(secure, path, body, {"Authorization": "Bearer nope"}))
        assert_401(*call(secure, path, body, {"Authorization": f"Basic {FILE_KEY}"}))
        assert_401(*call(secure, path, body, {"Authorization": FILE_KEY}))
    for path, body in routes[:-1]:
        status, _, answer = call(secure, path, body, {"Authorization": f"Bearer {ENV_KEY}"})
        assert status == 200, (path, answer)
    assert call(secure, "/v1/no-such-route", None, {"Authorization": f"Bearer {ENV_KEY}"})[0] == 404
    status, _, health = call(secure, "/health")  # probes need no key
    assert status == 200 and health["status"] == "ok"

    url = f"{secure.openai}/completions"
    base = ["curl", "-sS", "--cacert", secure.cert, url, "-H", "Content-Type: application/json", "-d", json.dumps(GOOD),
            "-w", "\n%{http_code}"]
    out = subprocess.run(base, capture_output=True, text=True, timeout=120, check=True).stdout
    body, code = out.rsplit("\n", 1)
    assert code == "401" and json.loads(body)["error"]["code"] == "invalid_api_key"
    out = subprocess.run(base + ["-H", f"Authorization: Bearer {FILE_KEY}"], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    body, code = out.rsplit("\n", 1)
    assert code == "200" and json.loads(body)["choices"][0]["text"]


def test_plain_http_to_the_https_port_fails_cleanly(secure):
    plain = secure.openai.replace("https://", "http://").removesuffix("/v1")
    with pytest.raises((ConnectionError, urllib.error.URLError, OSError)) as e:
        urllib.request.urlopen(f"{plain}/health", timeout=30).read()
    assert not isinstance(e.value, TimeoutError)
    out = subprocess.run(["curl", "-sS", f"{plain}/health", "-m", "30"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and out.returncode != 28  # refused, not timed out
    status, _, health = call(secure, "/health")  # still serving
    assert status == 200 and health["status"] == "ok"


def _processes(serve) -> list[psutil.Process]:
    main = psutil.Process(serve.proc.pid)
    return [main, *main.children(recursive=True)]


def _listening(process: psutil.Process) -> set[tuple[str, int]]:
    """(address, port) of its listening sockets; an IPv6 socket bound to an IPv4-mapped address (gRPC's way to
    bind 127.0.0.1) as that IPv4 address."""
    return {(c.laddr.ip.removeprefix("::ffff:"), c.laddr.port) for c in process.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN}


def test_triton_listens_on_loopback_whatever_host_says(secure):
    text = "\n".join(secure.seen)
    ports = {name: int(port) for name, port in
             (("http", text.split("HTTP http://127.0.0.1:")[1].split()[0]),
              ("grpc", text.split("gRPC 127.0.0.1:")[1].split(",")[0]),
              ("metrics", text.split("metrics http://127.0.0.1:")[1].split("/")[0]))}
    (triton,) = [p for p in _processes(secure) if p.name() == "tritonserver"]
    listening = _listening(triton)
    assert ("127.0.0.1", ports["http"]) in listening and ("127.0.0.1", ports["grpc"]) in listening
    assert ("0.0.0.0", ports["metrics"]) in listening  # --metrics-host: the metrics alone, published
    published = {(ip, port) for ip, port in listening if not ipaddress.ip_address(ip).is_loopback}
    assert published == {("0.0.0.0", ports["metrics"])}, listening
    front = int(secure.openai.rsplit(":", 1)[1].split("/")[0])
    assert ("0.0.0.0", front) in _listening(psutil.Process(secure.proc.pid))
    assert "metrics endpoint is published on 0.0.0.0" in text and "listening on all addresses" in text


def test_no_key_in_output_logs_or_command_lines(secure):
    call(secure, "/v1/completions", GOOD, {"Authorization": f"Bearer {FILE_KEY}"})  # something in the access log
    secure.drain()
    seen = "\n".join(secure.seen)
    assert "API key: required (2 accepted)" in seen
    logs = [seen] + [p.read_text(errors="replace") for p in (secure.root / "stderr.txt", secure.root / "tritonserver.log")]
    assert "POST /v1/completions HTTP/1.1\" 200" in seen  # the access log (stdout) is on, and names no key
    for process in _processes(secure):
        logs.append(" ".join(process.cmdline()))
        if process.pid != secure.proc.pid:  # dspark serve got the key in its environment; nothing it starts does
            logs.append(repr(process.environ()))
    for text in logs:
        assert FILE_KEY not in text and ENV_KEY not in text


# -- Triton published ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def published(tmp_path_factory, embedded_export):
    from dspark_trt.serving.deployment import Deployment, resolve_source
    from dspark_trt.serving.settings import ServeOptions

    log = tmp_path_factory.mktemp("published") / "tritonserver.log"
    options = ServeOptions(threads=1, http_port=0, grpc_port=0, metrics_port=0, openai_port=None,
                           triton_host="0.0.0.0", log_file=log, exit_timeout=5)
    d = Deployment(resolve_source(embedded_export), options, say=lambda line: None)
    d.start()
    yield d
    assert d.stop() == 0, f"see {log}"


def _generate(endpoints) -> str:
    from dspark_trt.serving.client import http_generate

    return http_generate(endpoints.http, "dspark", {"text_input": "A small drafter", "max_tokens": 8}).text


def test_a_published_triton_refuses_model_control_without_the_supervisors_header(published):
    from dspark_trt.serving.server import CONTROL_HEADER

    e = published.server.endpoints
    listening = _listening(psutil.Process(published.server.process.pid))
    assert ("0.0.0.0", e.http_port) in listening and ("0.0.0.0", e.metrics_port) in listening
    assert any(port == e.grpc_port and ip in ("0.0.0.0", "::") for ip, port in listening), listening
    before = _generate(e)

    def http(method, path, headers=None):
        request = urllib.request.Request(f"http://{e.http}{path}", method=method, headers=headers or {},
                                         data=b"{}" if method == "POST" else None)
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    for method, path in [("POST", "/v2/repository/models/dspark/unload"), ("POST", "/v2/repository/models/dspark/load"),
                         ("POST", "/v2/repository/index"), ("GET", "/v2/models/dspark/config"),
                         ("GET", "/v2/trace/setting"), ("GET", "/v2/logging")]:
        for headers in (None, {CONTROL_HEADER: "guess"}, {"Authorization": "Bearer guess"}):
            status, text = http(method, path, headers)
            assert status == 403 and "restricted" in text, (method, path, headers, status, text)
    assert http("GET", "/v2/models/dspark/ready")[0] == 200  # health, metadata, inference stay open
    assert http("GET", "/v2/models/dspark")[0] == 200

    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    g = grpcclient.InferenceServerClient(e.grpc)
    for action in (lambda: g.unload_model("dspark"), lambda: g.load_model("dspark"),
                   lambda: g.get_model_config("dspark")):
        with pytest.raises(InferenceServerException, match="(?i)restricted|permission"):
            action()
    assert g.is_model_ready("dspark")
    assert _generate(e) == before  # the model kept serving

    published.reload_model()  # the supervisor's own unload + load (a dead stub's restart) carries the header
    assert _generate(e) == before
