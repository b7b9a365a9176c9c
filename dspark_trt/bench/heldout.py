"""Held-out benchmark prompts that travel with a pair: ``PAIR/prompts.json`` (written by ``dspark smollm2``).

``dspark bench e2e --drafter PAIR/drafter --target PAIR/target`` (or ``--export OUT`` of such a pair) uses
them when no ``--prompt`` / ``--input-ids`` is given; they were never part of the drafter's training text.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["find_heldout", "read_heldout"]


def read_heldout(pair_dir: str | Path) -> list[list[int]] | None:
    path = Path(pair_dir) / "prompts.json"
    if not path.is_file():
        return None
    from ..errors import DSparkTrtError

    try:
        entries = json.loads(path.read_text())["heldout"]
        return [[int(t) for t in e["input_ids"]] for e in entries]
    except (ValueError, KeyError, TypeError) as e:
        raise DSparkTrtError(f"{path} is not a held-out prompt file ({e}); rebuild it with 'dspark smollm2'") from None


def find_heldout(*, drafter=None, target=None, export=None) -> tuple[list[list[int]], Path] | None:
    """(prompts, file) of the pair the given directories belong to, or None."""
    dirs = [Path(p).parent for p in (drafter, target) if p]
    if export:
        dirs.append(Path(export))
        try:
            from ..artifact.export_dir import ExportDir

            source = (ExportDir(export).manifest.get("target") or {}).get("source")
            if source:
                dirs.append(Path(source).parent)
        except Exception:  # an export without a target section: no held-out prompts, not an error here
            pass
    for d in dirs:
        prompts = read_heldout(d)
        if prompts:
            return prompts, d / "prompts.json"
    return None
