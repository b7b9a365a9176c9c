"""API keys of the OpenAI front end: where they come from, and the check on every request.

    keys = api_keys(given=("k1",), key_file="keys.txt", environ=os.environ)   # --api-key, --api-key-file,
                                                                               # DSPARK_API_KEY (commas)
    app = BearerAuth(app, keys)        # an ASGI app: /v1/* needs 'Authorization: Bearer KEY', else 401

The check hashes the presented token and compares it with every key's hash in constant time
(``hmac.compare_digest``; every key is compared, so neither the key's length nor which key matched shows in the
timing). Paths in ``OPEN_PATHS`` (health probes, the API description) need no key; every other path does, unknown
ones included (a 401 before a 404 says nothing about which routes exist). A refusal is a 401 in OpenAI's error
shape with ``WWW-Authenticate: Bearer``; the presented token is never echoed, logged or kept.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path
from typing import Iterable, Mapping

from ..errors import DSparkTrtError

__all__ = ["API_KEY_ENV", "OPEN_PATHS", "api_keys", "check_key", "BearerAuth"]

API_KEY_ENV = "DSPARK_API_KEY"
#: paths answered without a key: load balancers' and orchestrators' probes, and the API's description
OPEN_PATHS = frozenset({"/health", "/health/live", "/health/ready", "/openapi.json"})


def check_key(key: str, source: str) -> str:
    """``key`` when it can travel in an HTTP header (printable ASCII, no spaces); else a one-line error naming
    ``source`` (never the key)."""
    if not key or not all(33 <= ord(c) <= 126 for c in key):
        raise DSparkTrtError(f"an API key from {source} is empty or holds spaces or characters outside printable "
                             f"ASCII; an API key travels in an HTTP header: use letters, digits and punctuation")
    return key


def api_keys(given: Iterable[str] = (), key_file: str | Path | None = None,
             environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The keys of ``--api-key`` (``given``), of ``--api-key-file`` (one a line; blank lines and lines starting
    with ``#`` skipped) and of ``DSPARK_API_KEY`` in ``environ`` (several separated by commas), without
    duplicates, in that order; empty: no key is required."""
    keys: list[str] = [check_key(k, "--api-key") for k in given]
    if key_file is not None:
        try:
            lines = Path(key_file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            why = e.strerror if isinstance(e, OSError) else "it is not UTF-8 text"
            raise DSparkTrtError(f"cannot read the API key file {key_file} ({why}); pass a text file with one key "
                                 f"a line to --api-key-file") from None
        found = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
        if not found:
            raise DSparkTrtError(f"the API key file {key_file} holds no key; write one key a line")
        keys += [check_key(k, f"--api-key-file {key_file}") for k in found]
    text = (environ or {}).get(API_KEY_ENV)
    if text is not None:
        found = [k.strip() for k in text.split(",") if k.strip()]
        if not found:
            raise DSparkTrtError(f"{API_KEY_ENV} is set but holds no key; set it to a key (several separated by "
                                 f"commas) or unset it")
        keys += [check_key(k, API_KEY_ENV) for k in found]
    return tuple(dict.fromkeys(keys))


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


def _unauthorized(message: str) -> bytes:
    """A 401's body, in OpenAI's error shape."""
    return json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": "invalid_api_key"}}).encode()


_MISSING = _unauthorized("no API key: this server requires 'Authorization: Bearer KEY' on /v1/* (the key it was "
                         "started with: --api-key, --api-key-file or DSPARK_API_KEY)")
_WRONG = _unauthorized("invalid API key: send one of the keys this server was started with, as "
                       "'Authorization: Bearer KEY'")


class BearerAuth:
    """ASGI middleware: HTTP requests outside ``open_paths`` need ``Authorization: Bearer KEY`` with one of
    ``keys``; no keys: every request passes."""

    def __init__(self, app, keys: Iterable[str], open_paths: Iterable[str] = OPEN_PATHS):
        self.app = app
        self._digests = [_digest(k.encode("ascii")) for k in keys]
        self.open_paths = frozenset(open_paths)

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def allows(self, authorization: bytes | None) -> bool | None:
        """True: a key matched; False: a wrong key; None: no ``Bearer`` credentials at all."""
        if authorization is None:
            return None
        scheme, _, token = authorization.strip().partition(b" ")
        if scheme.lower() != b"bearer" or not token.strip():
            return None
        presented = _digest(token.strip())
        matched = False
        for digest in self._digests:  # all of them, whatever matched: the same time for every token
            matched |= hmac.compare_digest(presented, digest)
        return matched

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self._digests or scope["path"] in self.open_paths:
            return await self.app(scope, receive, send)
        authorization = None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                authorization = value
                break
        verdict = self.allows(authorization)
        if verdict:
            return await self.app(scope, receive, send)
        body = _WRONG if verdict is False else _MISSING
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b'Bearer realm="dspark"')]})
        await send({"type": "http.response.body", "body": body})
