"""The rows of a gpu-check run and its JSON report, rewritten (atomically) as soon as a row is known, so a run
that is killed keeps what it proved.

Row statuses: ``PASS``, ``FAIL`` (disagrees with the reference, or a goal ``--perf`` enforces), ``ERROR`` (the
check could not run), ``SKIP`` (not applicable here, said why), ``NOT RUN`` (did not fit ``--budget``, or a step
it needs did not pass). ``FAIL`` and ``ERROR`` fail the run (exit 3); ``NOT RUN`` rows make it incomplete
(``"complete": false``), not failed.
"""

from __future__ import annotations

import json
import time
import traceback
from pathlib import Path
from typing import Callable

__all__ = ["Checks", "ReportWriter", "exit_status", "OUT_FILE", "NOT_RUN"]

OUT_FILE = "gpu_check.json"
NOT_RUN = "NOT RUN"
_OK = ("PASS", "SKIP", NOT_RUN)


class Checks:
    """Runs named checks; a failing or crashing check is recorded, never fatal. ``on_row`` is called after every
    row (the report writer)."""

    def __init__(self, on_row: Callable[[], None] | None = None):
        self.rows: list[dict] = []
        self.on_row = on_row

    def _add(self, row: dict) -> None:
        self.rows.append(row)
        print(f"{row['status']:5} {row['check']}: {row['detail']}", flush=True)
        if self.on_row is not None:
            self.on_row()

    def run(self, name: str, fn) -> object:
        t0 = time.perf_counter()
        data = None
        try:
            result = fn()
            detail, data = (result if isinstance(result, tuple) else (result or "", None))
            status = "PASS"
        except AssertionError as e:
            status, detail = "FAIL", str(e).splitlines()[0][:200] if str(e) else "assertion failed"
        except Exception as e:  # a check that cannot run is a failure of the check, not a crash of the tool
            status, detail = "ERROR", f"{type(e).__name__}: {str(e).splitlines()[0][:180] if str(e) else ''}"
            traceback.print_exc()
        row = {"check": name, "status": status, "detail": detail, "seconds": round(time.perf_counter() - t0, 1)}
        if data is not None:
            row["data"] = data
        self._add(row)
        return data

    def skip(self, name: str, reason: str) -> None:
        """A check that cannot run here, said explicitly (``SKIP`` rows do not fail the report)."""
        self._add({"check": name, "status": "SKIP", "detail": reason, "seconds": 0.0})

    def fail(self, name: str, reason: str) -> None:
        """A check that failed before it could run (a required TensorRT that does not import)."""
        self._add({"check": name, "status": "FAIL", "detail": reason, "seconds": 0.0})

    def not_run(self, name: str, reason: str, expected: float) -> None:
        """A step left out (``--budget``, or a step it needs did not pass): listed, with its expected time."""
        self._add({"check": name, "status": NOT_RUN, "detail": reason, "seconds": 0.0, "expected_s": expected})

    @property
    def passed(self) -> bool:
        return all(r["status"] in _OK for r in self.rows)

    @property
    def complete(self) -> bool:
        return not any(r["status"] == NOT_RUN for r in self.rows)

    def table(self) -> str:
        if not self.rows:
            return "(no checks)"
        w = max(len(r["check"]) for r in self.rows)
        lines = [f"{'check'.ljust(w)}  status   detail", "-" * (w + 40)]
        lines += [f"{r['check'].ljust(w)}  {r['status']:7}  {r['detail']} [{r['seconds']}s]" for r in self.rows]
        return "\n".join(lines)


def exit_status(checks: Checks) -> int:
    """0 when every row is PASS, SKIP or NOT RUN; 3 when one is FAIL or ERROR."""
    return 0 if checks.passed else 3


class ReportWriter:
    """``DIR/gpu_check.json``, rewritten whole and atomically (a temporary file renamed over it) each time
    ``write`` is called: ``build()`` returns the report as it stands."""

    def __init__(self, path: str | Path, build: Callable[[], dict]):
        self.path, self.build = Path(path), build
        self.writes = 0

    def write(self) -> None:
        from ...atomic import atomic_write_text

        atomic_write_text(self.path, json.dumps(self.build(), indent=1) + "\n")
        self.writes += 1
