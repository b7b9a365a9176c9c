"""Atomic outputs: nothing the user had is overwritten or half-written.

A result directory is built in a hidden temporary sibling and renamed into place only when complete; an
existing non-empty directory is replaced only with ``force`` (and then swapped, never merged).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .errors import DSparkTrtError

__all__ = ["atomic_output_dir", "atomic_write_text", "atomic_write_bytes", "check_output_dir"]


def check_output_dir(out: str | Path, *, force: bool = False) -> Path:
    """Refuse an output path that is a file, or a non-empty directory without ``force``."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise DSparkTrtError(f"output path {out} exists and is not a directory; choose another output directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise DSparkTrtError(f"output directory {out} is not empty; pass --force to replace it (or choose another)")
    return out


@contextmanager
def atomic_output_dir(out: str | Path, *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary directory that becomes ``out`` when the block finishes without an exception."""
    out = check_output_dir(out, force=force)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private; the result is an ordinary directory
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
        os.rename(out, old)
    os.rename(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write a file through a temporary sibling and ``os.replace`` (never half-written)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write a text file through a temporary sibling and ``os.replace``."""
    atomic_write_bytes(path, text.encode())
