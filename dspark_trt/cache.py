"""The one cache root and the content digests that key everything cached under it.

Root: ``$DSPARK_TRT_CACHE`` when set, else ``$XDG_CACHE_HOME/dspark-trt``, else ``~/.cache/dspark-trt``.
Below it, each user of the cache owns one directory (``cache_dir("onnx")``, ``cache_dir("exports")``, …).

Digests: ``file_sha256`` streams a file in fixed chunks (memory stays at one chunk whatever its size, so a
multi-GB graph or checkpoint costs its read time, never its size in memory); ``json_digest`` hashes JSON-able
parts; ``sources_digest`` hashes dspark-trt's version and every Python source of the package, so that a new
exporter (or anything it depends on) never reuses what an older one cached — no hand-kept list of sources.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

__all__ = ["HASH_CHUNK", "cache_root", "cache_dir", "file_sha256", "json_digest", "sources_digest"]

HASH_CHUNK = 1 << 24  # 16 MiB per read: the most a digest holds in memory


def cache_root() -> Path:
    """``$DSPARK_TRT_CACHE``, else ``$XDG_CACHE_HOME/dspark-trt``, else ``~/.cache/dspark-trt``."""
    explicit = os.environ.get("DSPARK_TRT_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dspark-trt"


def cache_dir(name: str) -> Path:
    """The cache directory one user owns (not created here)."""
    return cache_root() / name


def file_sha256(path: str | Path, chunk: int = HASH_CHUNK) -> str:
    """sha256 of a file, read ``chunk`` bytes at a time into one reused buffer."""
    h = hashlib.sha256()
    buf = bytearray(chunk)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def json_digest(*parts) -> str:
    """sha256 of ``parts`` as sorted-key JSON (sets and tuples as lists)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=list).encode()).hexdigest()


@functools.cache
def sources_digest() -> str:
    """sha256 over dspark-trt's version and every ``*.py`` of the package (path and contents), once per process."""
    from . import __version__

    root = Path(__file__).resolve().parent
    h = hashlib.sha256(__version__.encode())
    for file in sorted(root.rglob("*.py")):
        h.update(file.relative_to(root).as_posix().encode())
        h.update(file.read_bytes())
    return h.hexdigest()
