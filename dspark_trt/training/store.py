"""The target-written training text as an asset: a content-addressed store, appended to, never rewritten.

    DIR/<key>/store.json          what the text depends on (the key, human-readable), written once
    DIR/<key>/entries/NNNNNN.pt   one batch of rows (ids, taps, top-K ids and log-probabilities)
    DIR/<key>/entries/NNNNNN.json its sidecar: the sha256 of the .pt, the row keys it holds, its size

``<key>`` hashes what changes the text of any row: the target's identity (its weights' digest and config),
the taps and top-K kept, the continuation length, the sampling settings (T, top-p, top-k), the EOS and
forbidden tokens. Each row inside is keyed by its prompt ids, greedy or sampled, and its noise seed
(``data.Job``), so a run asks for the rows it needs and writes only the missing ones, as a new entry: the
same key twice writes nothing; a larger budget appends. Entries are written atomically (temporary file +
rename; the sidecar last, so an entry without one is a partial write) and checked against their digest when
read: a corrupted or partial entry is reported in one line, removed, and its rows written again — never used.
Writers of one key serialise on ``DIR/<key>/.lock``.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
from pathlib import Path

import torch

from ..atomic import atomic_write_bytes, atomic_write_text
from ..errors import DSparkTrtError

__all__ = ["TextStore", "row_key", "target_identity", "digest"]

log = logging.getLogger("dspark")

FORMAT = 1


def digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def row_key(job) -> str:
    """The store key of one row (``data.Job``): prompt ids, greedy or sampled, noise seed."""
    return digest([list(job.prompt), bool(job.greedy), 0 if job.greedy else int(job.seed)])


def target_identity(target_dir: str | Path, config: dict) -> dict:
    """What identifies a target: the sha256 of its weight files (``*.safetensors``, else ``*.bin``) and its
    config; a directory without weight files is identified by its resolved path and config."""
    target_dir = Path(target_dir)
    files = sorted(target_dir.glob("*.safetensors")) or sorted(target_dir.glob("*.bin"))
    if not files:
        return {"dir": str(target_dir.resolve()), "config": digest(config)}
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 24), b""):
                h.update(chunk)
    return {"weights": h.hexdigest()[:16], "config": digest(config)}


class TextStore:
    """The rows of one key under ``root`` (module docstring)."""

    def __init__(self, root: str | Path, key: dict):
        self.key = {"format": FORMAT, **key}
        self.name = digest(self.key)
        self.dir = Path(root) / self.name
        self.entries = self.dir / "entries"

    # -- reading --------------------------------------------------------------------------------------------
    def index(self) -> dict[str, dict]:
        """{entry name: sidecar} of the complete entries (a .pt without a sidecar is a partial write: removed)."""
        if not self.entries.is_dir():
            return {}
        out = {}
        for side in sorted(self.entries.glob("*.json")):
            try:
                out[side.stem] = json.loads(side.read_text())
            except (OSError, ValueError):
                self._drop(side.stem, "its sidecar is unreadable")
        for pt in sorted(self.entries.glob("*.pt")):
            if pt.stem not in out:
                self._drop(pt.stem, "it has no sidecar (a partial write)")
        return out

    def _drop(self, name: str, why: str) -> None:
        log.warning("text store %s: entry %s is corrupted or partial (%s); it is removed and its rows written again",
                    self.dir, name, why)
        for suffix in (".json", ".pt"):
            (self.entries / f"{name}{suffix}").unlink(missing_ok=True)

    def _read(self, name: str, side: dict) -> list[dict] | None:
        try:
            blob = (self.entries / f"{name}.pt").read_bytes()
        except OSError:
            self._drop(name, "its rows are missing")
            return None
        if hashlib.sha256(blob).hexdigest() != side.get("sha256"):
            self._drop(name, "digest mismatch")
            return None
        try:
            rows = torch.load(io.BytesIO(blob), weights_only=True)
        except Exception as e:  # noqa: BLE001 - a digest-true file torch cannot read: same treatment
            self._drop(name, f"unreadable: {type(e).__name__}")
            return None
        for r in rows:
            r["top_ids"] = r["top_ids"].to(torch.int64)
        return rows

    def load(self, keys: list[str]) -> tuple[dict[str, dict], list[str]]:
        """({row key: row} of the wanted keys the store holds, the entries they came from)."""
        wanted, found, used = set(keys), {}, []
        for name, side in self.index().items():
            if not wanted.intersection(side.get("rows", [])):
                continue
            rows = self._read(name, side)
            if rows is None:
                continue
            used.append(name)
            for k, r in zip(side["rows"], rows):
                if k in wanted and k not in found:
                    found[k] = r
        return found, used

    # -- writing --------------------------------------------------------------------------------------------
    def lock(self):
        from filelock import FileLock

        self.dir.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.dir / ".lock"))

    def append(self, keys: list[str], rows: list[dict]) -> str:
        """Write ``rows`` (keyed ``keys``) as a new entry; returns its name. Call under ``lock()``."""
        if len(keys) != len(rows):
            raise DSparkTrtError(f"text store: {len(keys)} keys for {len(rows)} rows")
        self.entries.mkdir(parents=True, exist_ok=True)
        meta = self.dir / "store.json"
        if not meta.is_file():
            atomic_write_text(meta, json.dumps(self.key, indent=1, sort_keys=True) + "\n")
        taken = [int(p.stem) for p in self.entries.iterdir() if p.stem.isdigit()]
        name = f"{max(taken, default=-1) + 1:06d}"
        slim = [{"ids": r["ids"], "start": r["start"], "taps": r["taps"], "top_ids": r["top_ids"].to(torch.int32),
                 "top_logp": r["top_logp"]} for r in rows]
        buf = io.BytesIO()
        torch.save(slim, buf)
        blob = buf.getvalue()
        atomic_write_bytes(self.entries / f"{name}.pt", blob)
        side = {"sha256": hashlib.sha256(blob).hexdigest(), "rows": keys, "sequences": len(rows),
                "tokens": sum(len(r["ids"]) for r in rows), "pid": os.getpid()}
        atomic_write_text(self.entries / f"{name}.json", json.dumps(side) + "\n")
        return name
