"""issue 47: `dspark serve --host 0.0.0.0` printed `http://0.0.0.0:PORT/v1`, which no client can use."""

from __future__ import annotations

import pytest

from dspark_trt.serving.addresses import bind_note, client_address
from dspark_trt.serving.server import Endpoints


@pytest.mark.parametrize("host, address", [("0.0.0.0", "127.0.0.1:8000"), ("", "127.0.0.1:8000"),
                                           ("::", "[::1]:8000"), ("[::]", "[::1]:8000"),
                                           ("127.0.0.1", "127.0.0.1:8000"), ("10.1.2.3", "10.1.2.3:8000"),
                                           ("::1", "[::1]:8000"), ("gpu-box", "gpu-box:8000")])
def test_a_client_dials_loopback_for_a_wildcard_bind_and_brackets_ipv6(host, address):
    assert client_address(host, 8000) == address


def test_the_ready_line_urls_and_note_of_a_wildcard_bind():
    from dspark_trt.serving.openai_app import OpenAIFrontend

    e = Endpoints("0.0.0.0", 8000, 8001, 8002)
    assert (e.http, e.grpc, e.metrics) == ("127.0.0.1:8000", "127.0.0.1:8001", "http://127.0.0.1:8002/metrics")
    assert OpenAIFrontend(None, host="0.0.0.0", port=9000).url == "http://127.0.0.1:9000/v1"
    assert OpenAIFrontend(None, host="::", port=9000).url == "http://[::1]:9000/v1"
    assert "listening on all addresses (0.0.0.0)" in bind_note("0.0.0.0")
    assert bind_note("127.0.0.1") == ""


@pytest.mark.parametrize("host, grpc, http", [("127.0.0.1", "127.0.0.1", "127.0.0.1"), ("::1", "[::1]", "ipv6:::1"),
                                              ("[::]", "[::]", "ipv6:::"), ("0.0.0.0", "0.0.0.0", "0.0.0.0")])
def test_tritonserver_gets_ipv6_as_it_takes_it(host, grpc, http):
    # measured with the bundled tritonserver: '::1' for HTTP binds 255.255.255.255, for gRPC cannot listen
    from dspark_trt.serving.addresses import triton_address

    assert (triton_address(host, "grpc"), triton_address(host, "http"), triton_address(host, "metrics")) == \
        (grpc, http, http)


@pytest.mark.parametrize("host, triton", [("127.0.0.1", "127.0.0.1"), ("0.0.0.0", "127.0.0.1"), ("10.1.2.3", "127.0.0.1"),
                                          ("::", "::1"), ("::1", "::1"), ("gpu-box", "127.0.0.1")])
def test_triton_stays_on_loopback_of_the_family_asked_whatever_host_says(host, triton):
    from dspark_trt.serving.addresses import is_loopback
    from dspark_trt.serving.deployment import triton_host_of
    from dspark_trt.serving.settings import ServeOptions

    assert triton_host_of(ServeOptions(host=host)) == triton and is_loopback(triton)
    assert triton_host_of(ServeOptions(host=host, triton_host="0.0.0.0")) == "0.0.0.0"
    assert not is_loopback("0.0.0.0") and not is_loopback("gpu-box") and is_loopback("localhost")


def test_the_tritonserver_command_line(tmp_path):
    from dspark_trt.serving.server import CONTROL_HEADER, RESTRICTED_APIS, TritonServer

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text("")
    server = TritonServer(tmp_path, host="::1", metrics_host="0.0.0.0", executable="/bin/true", http_port=1,
                          grpc_port=2, metrics_port=3, restrict_control=True)
    cmd, env = server.command()
    flags = dict(zip(cmd[1::2], cmd[2::2]))
    assert (flags["--http-address"], flags["--grpc-address"], flags["--metrics-address"]) == \
        ("ipv6:::1", "[::1]", "0.0.0.0")
    rule = flags["--http-restricted-api"]
    assert rule == flags["--grpc-restricted-protocol"] and rule.startswith(",".join(RESTRICTED_APIS) + ":")
    header, secret = rule.split(":", 1)[1].split("=")
    assert header == CONTROL_HEADER and len(secret) >= 32
    assert server.endpoints.metrics == "http://127.0.0.1:3/metrics" and server.endpoints.http == "[::1]:1"
    assert "--http-restricted-api" not in TritonServer(tmp_path, executable="/bin/true").command()[0]
