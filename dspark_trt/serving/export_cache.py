"""Exports of drafter checkpoints for ``dspark serve CHECKPOINT``, cached by content digest and export options.

    serve/exports/<config digest[:12]>-<key[:16]>/     an ordinary export directory (dspark-export's layout)
    serve/digests.json                                 file identity → content sha256 (see below)

``serve/`` is ``cache.cache_dir("serve")`` (below the one cache root, ``XDG_CACHE_HOME`` honoured) unless a
cache directory is given.

The key hashes the contents of every file of the drafter and target directories, the export options, and
dspark-trt's version with all its sources (``cache.sources_digest``: a new exporter never reuses an old export). Reading a
multi-GB target for every start would take longer than the start itself, so each file's sha256 is kept in
``digests.json`` beside its identity (path, size, mtime, inode) and read again only when that changes — the
same trade git's index and ccache make. An entry is written atomically (complete or absent) under a file
lock, so two starts of the same checkpoint export it once. Delete the directory to reclaim the space.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from pathlib import Path

from ..cache import cache_dir as _cache_dir
from ..cache import file_sha256, json_digest, sources_digest

__all__ = ["CachedExport", "cached_export", "cache_entry", "export_cache_dir", "directory_digest"]

log = logging.getLogger("dspark")

def export_cache_dir() -> Path:
    """The default cache directory of ``dspark serve``'s exports: ``<cache root>/serve``."""
    return _cache_dir("serve")


@dataclasses.dataclass(frozen=True)
class CachedExport:
    path: Path
    reused: bool  # True: found in the cache; False: exported now
    key: str


class _DigestIndex:
    """``digests.json``: realpath → [size, mtime_ns, inode, sha256]."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self.entries = json.loads(path.read_text())
        except (OSError, ValueError):
            self.entries = {}
        self.changed = False

    def sha256(self, file: Path) -> str:
        st = file.stat()
        real = os.path.realpath(file)
        identity = [st.st_size, st.st_mtime_ns, st.st_ino]
        entry = self.entries.get(real)
        if entry is not None and entry[:3] == identity:
            return entry[3]
        digest = file_sha256(file)
        self.entries[real] = identity + [digest]
        self.changed = True
        return digest

    def save(self) -> None:
        if self.changed:
            from ..atomic import atomic_write_text

            atomic_write_text(self.path, json.dumps(self.entries, indent=0, sort_keys=True) + "\n")


def directory_digest(directory: str | Path, index: _DigestIndex | None = None) -> str:
    """sha256 over the relative paths and contents of every file below ``directory`` (hidden ones skipped)."""
    root = Path(directory)
    h = hashlib.sha256()
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = file.relative_to(root)
        if any(part.startswith(".") for part in rel.parts):
            continue
        h.update(rel.as_posix().encode() + b"\0")
        h.update((index.sha256(file) if index is not None else file_sha256(file)).encode())
    return h.hexdigest()


def cache_entry(drafter_dir: str | Path, *, target_dir: str | Path, options, cache_dir: str | Path | None = None
                ) -> tuple[Path, str]:
    """Where the export of ``drafter_dir`` + ``target_dir`` with ``options`` lives in the cache, and its key
    (nothing is exported; the files' digests are computed or read from ``digests.json``)."""
    from filelock import FileLock

    from ..config import DSparkConfig

    drafter_dir, target_dir = Path(drafter_dir), Path(target_dir)
    config = DSparkConfig.from_pretrained(drafter_dir)  # not a checkpoint: one line, nothing written
    cache = Path(cache_dir) if cache_dir is not None else export_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache / "digests.json.lock")):
        index = _DigestIndex(cache / "digests.json")
        inputs = {"drafter": directory_digest(drafter_dir, index), "target": directory_digest(target_dir, index)}
        index.save()
    key = json_digest({"inputs": inputs, "sources": sources_digest(), "options": dataclasses.asdict(options)})
    return cache / "exports" / f"{config.digest()[:12]}-{key[:16]}", key


def cached_export(drafter_dir: str | Path, *, target_dir: str | Path, options, cache_dir: str | Path | None = None
                  ) -> CachedExport:
    """The export of ``drafter_dir`` + ``target_dir`` with ``options`` (``ExportOptions``), exported on a miss
    (``DSparkTrtError`` for a directory that is not a checkpoint, before anything is written)."""
    from filelock import FileLock

    from ..artifact.export_dir import ExportDir
    from ..export.pipeline import export_model

    out, key = cache_entry(drafter_dir, target_dir=target_dir, options=options, cache_dir=cache_dir)
    if ExportDir(out).exists():
        return CachedExport(out, True, key)
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):
        if ExportDir(out).exists():  # another start exported it while this one waited
            return CachedExport(out, True, key)
        log.info("exporting %s (target %s) into the cache %s; later starts reuse it", drafter_dir, target_dir, out)
        export_model(drafter_dir, out, options, target_dir=target_dir, force=True)
    return CachedExport(out, False, key)
