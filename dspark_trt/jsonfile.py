"""Reading the JSON files users hand us (configs, manifests): a missing or broken file is a one-line error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import DSparkTrtError

__all__ = ["read_json"]


def read_json(path: str | Path, *, missing: str, fix: str) -> Any:
    """Parse ``path``; raise ``DSparkTrtError(missing)`` when it is absent, or name the parse error and ``fix``."""
    path = Path(path)
    if not path.is_file():
        raise DSparkTrtError(missing)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise DSparkTrtError(f"cannot read {path} as JSON ({e}); {fix}") from None
