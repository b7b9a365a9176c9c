"""API keys (issue 45), without a server: where ``dspark serve`` takes them from, how a bad one is refused (never
echoing it), and the Bearer check itself. The keys against a running server are in test_security.py."""

from __future__ import annotations

import pytest

from dspark_trt.errors import DSparkTrtError
from dspark_trt.serving.auth import API_KEY_ENV, BearerAuth, api_keys


def test_keys_from_the_flag_the_file_and_the_environment(tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("# the team's keys\nsk-file-1\n\n  sk-file-2  \nsk-flag\n")
    assert api_keys(("sk-flag",), keys, {API_KEY_ENV: "sk-env-1, sk-env-2"}) == \
        ("sk-flag", "sk-file-1", "sk-file-2", "sk-env-1", "sk-env-2")
    assert api_keys() == () and api_keys(environ={"OTHER": "x"}) == ()


@pytest.mark.parametrize("given, environ, words", [
    (("has space",), {}, "--api-key"),
    (("",), {}, "--api-key"),
    (("naïve",), {}, "printable ASCII"),
    ((), {API_KEY_ENV: " , "}, "holds no key"),
    ((), {API_KEY_ENV: "ok,bad\tkey"}, API_KEY_ENV),
])
def test_a_bad_key_is_one_line_that_never_shows_it(given, environ, words):
    with pytest.raises(DSparkTrtError) as e:
        api_keys(given, environ=environ)
    message = str(e.value)
    assert words in message and "\n" not in message
    for key in [*given, *environ.values()]:
        if key.strip(" ,"):
            assert key not in message


def test_a_key_file_that_cannot_serve(tmp_path):
    with pytest.raises(DSparkTrtError, match="cannot read the API key file .*--api-key-file"):
        api_keys(key_file=tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n\n")
    with pytest.raises(DSparkTrtError, match="holds no key"):
        api_keys(key_file=empty)
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(DSparkTrtError, match="not UTF-8"):
        api_keys(key_file=binary)


def test_the_bearer_check():
    auth = BearerAuth(None, ["sk-one", "sk-two"])
    assert auth.allows(b"Bearer sk-one") and auth.allows(b"bearer  sk-two") and auth.allows(b"BEARER sk-two ")
    assert auth.allows(b"Bearer sk-on") is False and auth.allows(b"Bearer sk-one2") is False
    assert auth.allows(b"Bearer SK-ONE") is False
    for missing in (None, b"", b"sk-one", b"Basic c2stb25l", b"Bearer ", b"Bearer"):
        assert auth.allows(missing) is None, missing
    assert not BearerAuth(None, []).enabled


def test_the_serve_command_line_gathers_the_keys_and_keeps_them_out_of_the_repr(tmp_path, monkeypatch):
    from dspark_trt.cli.main import build_command_parser
    from dspark_trt.cli.serve import _options

    keys = tmp_path / "keys"
    keys.write_text("sk-from-file\n")
    monkeypatch.setenv(API_KEY_ENV, "sk-from-env")
    parser = build_command_parser("serve", "dspark serve")
    options = _options(parser.parse_args(["--api-key", "sk-a", "--api-key", "sk-b", "--api-key-file", str(keys)]))
    assert options.api_keys == ("sk-a", "sk-b", "sk-from-file", "sk-from-env")
    assert "sk-" not in repr(options)
    monkeypatch.delenv(API_KEY_ENV)
    assert _options(parser.parse_args([])).api_keys == ()
    with pytest.raises(DSparkTrtError, match="both --ssl-keyfile and --ssl-certfile"):
        _options(parser.parse_args(["--ssl-keyfile", str(keys)]))


def test_a_bad_certificate_is_refused_before_anything_starts(tmp_path):
    from dspark_trt.serving.openai_app import FrontendConfig, OpenAIFrontend

    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    f = OpenAIFrontend(FrontendConfig(triton_grpc="127.0.0.1:1"), port=0, ssl_keyfile=str(junk),
                       ssl_certfile=str(junk))
    with pytest.raises(DSparkTrtError, match="cannot serve HTTPS with --ssl-certfile"):
        f.bind()
    assert f._socket is None
    with pytest.raises(DSparkTrtError, match="both --ssl-keyfile and --ssl-certfile"):
        OpenAIFrontend(FrontendConfig(triton_grpc="127.0.0.1:1"), ssl_certfile=str(junk))
