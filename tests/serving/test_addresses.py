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
