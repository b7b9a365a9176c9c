"""The exception types of dspark-trt.

``DSparkTrtError`` is the user's fault (bad checkpoint, bad flag, missing optional package): the CLI
prints its one-line message and exits 1, no traceback. ``DSparkTrtInternalError`` is ours (a broken
invariant): it keeps its traceback. It is deliberately *not* a subclass of ``DSparkTrtError``.
"""

from __future__ import annotations


class DSparkTrtError(Exception):
    """A user or input error: the message names the contract that was broken and the fix."""


class MissingDependency(DSparkTrtError):
    """A Python package this command needs is not installed; the message gives the one ``pip install``."""


class ValidationMismatch(DSparkTrtError):
    """An exported artifact disagrees with the reference (CLI exit 3). ``report``: the validation report's lines
    (every check, passed or not; the message names the first failure)."""

    def __init__(self, message: str, report: list[str] | None = None):
        super().__init__(message)
        self.report = list(report or [])


class ServerBusy(DSparkTrtError):
    """A request refused because as many requests as allowed already wait (``max_queue``): retry later
    (the Triton model answers UNAVAILABLE, an HTTP front end 503)."""


class DSparkTrtInternalError(Exception):
    """A broken internal invariant: this is a bug in dspark-trt."""


class CheckpointContractError(DSparkTrtError):
    """A checkpoint that violates the DSpark checkpoint contract; ``violations`` lists every problem."""

    def __init__(self, model_dir: str, violations: list[str]):
        self.model_dir = model_dir
        self.violations = sorted(violations)
        n = len(self.violations)
        head = f"checkpoint {model_dir} violates the DSpark checkpoint contract ({n} problem{'s' * (n != 1)})"
        super().__init__(head + ": " + "; ".join(self.violations))
