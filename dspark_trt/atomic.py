"""Atomic outputs: nothing the user had is overwritten, lost or half-written.

A result directory is built in a hidden temporary directory and moved into place only when complete. An
existing directory is replaced only when it is empty, or when it is an earlier output of the same writer
(it holds that writer's ``marker`` file, ``manifest.json`` by default) *and* ``force`` is given; anything
else is refused with one line. When the directory exists (``-o .`` included), the temporary directory is
built inside it and the old entries are swapped for the new ones at the end, so the directory itself —
possibly the shell's working directory — stays where it is. Every file and directory written keeps the
user's umask (tools such as safetensors and ``tempfile`` create private 0600 files).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

from .errors import DSparkTrtError

__all__ = ["MARKER", "atomic_output_dir", "atomic_output_file", "atomic_write_text", "atomic_write_bytes",
           "check_output_dir", "check_output_file", "write_marker"]

MARKER = "manifest.json"  # the file that marks a directory as an earlier output of ours


def _check_parents(path: Path) -> None:
    """Refuse a path below an existing file (``-o notes.txt/sub``)."""
    for parent in Path(os.path.abspath(path)).parents:
        if parent.exists():
            if not parent.is_dir():
                raise DSparkTrtError(f"cannot write {path}: {parent} is a file, not a directory; choose another path")
            return


def check_output_dir(out: str | Path, *, force: bool = False, marker: str = MARKER) -> Path:
    """Refuse a path that is a file, sits below a file, or is a non-empty directory that is not an earlier
    output (no ``marker`` file); an earlier output is replaced only with ``force``."""
    out = Path(out)
    _check_parents(out)
    if out.exists() and not out.is_dir():
        raise DSparkTrtError(f"output path {out} exists and is not a directory; choose another output directory")
    if out.is_dir() and any(out.iterdir()):
        if not (out / marker).is_file():
            raise DSparkTrtError(f"output directory {out} is not empty and holds no earlier dspark output (no {marker}); "
                                 f"--force replaces only an earlier output or an empty directory: choose another "
                                 f"output directory")
        if not force:
            raise DSparkTrtError(f"output directory {out} holds an earlier output; pass --force to replace it "
                                 f"(or choose another)")
    return out


def write_marker(directory: str | Path, written_by: str, *, marker: str = MARKER, **info) -> None:
    """Write ``directory/<marker>`` (``manifest.json`` by default) saying who wrote this output (so ``--force``
    may replace it later)."""
    import json

    from . import __version__

    record = {"written_by": written_by, "dspark_trt": __version__, **info}
    atomic_write_text(Path(directory) / marker, json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _ordinary_permissions(root: Path) -> None:
    """chmod ``root`` and everything below it as if created under the user's umask (exec bits kept)."""
    mask = _umask()
    paths = [root] + list(root.rglob("*")) if root.is_dir() else [root]
    for p in paths:
        if p.is_symlink():
            continue
        mode = os.stat(p).st_mode
        full = 0o777 if p.is_dir() or mode & 0o111 else 0o666
        os.chmod(p, full & ~mask)


def _mkdir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DSparkTrtError(f"cannot create directory {path}: {e.strerror}; choose another path") from None


@contextmanager
def atomic_output_dir(out: str | Path, *, force: bool = False, marker: str = MARKER,
                      owned: Iterable[str] | None = None) -> Iterator[Path]:
    """Yield a temporary directory whose contents become ``out`` when the block finishes without an exception
    (see the module docstring for what may be replaced). On any exception nothing of it is left behind.

    ``owned``: the top-level names this writer's outputs consist of; replacing an earlier output then moves
    only those (and the new output's own names) aside, and leaves anything else the user put in ``out``.
    None: every entry belongs to the output."""
    check_output_dir(out, force=force, marker=marker)
    out = Path(os.path.abspath(out))  # "." → the working directory, whose Path has an empty name
    in_place = out.is_dir()
    if in_place:
        tmp = Path(tempfile.mkdtemp(prefix=".dspark-tmp-", dir=out))
    else:
        _mkdir(out.parent)
        try:
            tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        except OSError as e:
            raise DSparkTrtError(f"cannot write below {out.parent}: {e.strerror}; choose another path") from None
    try:
        yield tmp
        _ordinary_permissions(tmp)
        if in_place:
            _swap_entries(out, tmp, marker=marker, owned=None if owned is None else set(owned))
        else:
            os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _swap_entries(out: Path, tmp: Path, *, marker: str = MARKER, owned: set[str] | None = None) -> None:
    """Replace ``out``'s entries (an earlier output, or none) by ``tmp``'s; put the old ones back on failure.

    Only renames (the same file system: nothing is copied, however large). The old marker goes first and the new
    marker comes last, so a directory holding a marker always holds a complete output, even if the process is
    killed in between. ``owned``: the names that belong to an output (None: all); other entries stay."""
    old = Path(tempfile.mkdtemp(prefix=".dspark-old-", dir=out))
    new_names = sorted((e.name for e in tmp.iterdir()), key=lambda n: n == marker)  # the marker last
    ours = None if owned is None else owned | set(new_names) | {marker}
    moved, placed = [], []
    try:
        entries = [e for e in out.iterdir() if e not in (tmp, old) and (ours is None or e.name in ours)]
        for entry in sorted(entries, key=lambda e: e.name != marker):  # the marker first
            os.rename(entry, old / entry.name)
            moved.append(entry.name)
        for name in new_names:
            os.rename(tmp / name, out / name)
            placed.append(name)
    except BaseException:
        for name in reversed(placed):
            os.rename(out / name, tmp / name)
        for name in reversed(moved):
            os.rename(old / name, out / name)
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)


def check_output_file(path: str | Path, *, force: bool = False) -> Path:
    """Refuse a file output that is a directory, sits below a file, or exists without ``force``."""
    path = Path(path)
    _check_parents(path)
    if path.is_dir():
        raise DSparkTrtError(f"{path} is a directory; give a file path")
    if path.exists() and not force:
        raise DSparkTrtError(f"{path} exists; pass --force to replace it (or choose another path)")
    return path


@contextmanager
def atomic_output_file(path: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling path (same suffix) that replaces ``path`` when the block succeeds; the
    result has the user's umask; on any exception the temporary file is removed and ``path`` is untouched."""
    path = Path(path)
    _check_parents(path)
    if path.is_dir():
        raise DSparkTrtError(f"{path} is a directory; give a file path")
    _mkdir(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        _ordinary_permissions(Path(tmp))
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write a file through a temporary sibling and ``os.replace`` (never half-written)."""
    with atomic_output_file(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write a text file through a temporary sibling and ``os.replace``."""
    atomic_write_bytes(path, text.encode())
