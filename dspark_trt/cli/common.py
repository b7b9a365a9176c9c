"""What every dspark command shares: logging verbosity, the error contract and the final status line.

Exit codes: 0 ok, 1 user error (one line, no traceback), 2 usage, 3 validation mismatch.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import shlex
import sys
import time
from types import ModuleType
from typing import Callable

from ..errors import DSparkTrtError, ValidationMismatch
from ..threads import set_cpu_threads  # noqa: F401  (re-exported for the commands)

EXIT_OK, EXIT_USER_ERROR, EXIT_USAGE, EXIT_MISMATCH = 0, 1, 2, 3

log = logging.getLogger("dspark")


def add_verbosity(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (repeatable)")
    parser.add_argument("-q", "--quiet", action="count", default=0, help="less log output (repeatable)")


def setup_logging(args: argparse.Namespace) -> None:
    level = logging.INFO + 10 * (getattr(args, "quiet", 0) - getattr(args, "verbose", 0))
    logging.basicConfig(format="[%(levelname).1s] %(message)s", level=max(logging.DEBUG, level), stream=sys.stderr,
                        force=True)


def run_guarded(fn: Callable[[argparse.Namespace], int], args: argparse.Namespace, *, status_line: bool = False,
                argv: list[str] | None = None) -> int:
    """Run a command: user errors become one line on stderr and exit 1; optionally print PASSED/FAILED."""
    start = time.perf_counter()
    try:
        status = fn(args)
    except ValidationMismatch as e:
        print(f"error: {e}", file=sys.stderr)
        status = EXIT_MISMATCH
    except DSparkTrtError as e:
        print(f"error: {e}", file=sys.stderr)
        status = EXIT_USER_ERROR
    except ModuleNotFoundError as e:  # a package listed in optional.PACKAGES: one line with the pip command
        from ..optional import from_import_error

        words = [(argv or sys.argv or ["dspark"])[0], getattr(args, "command", None), getattr(args, "benchmark", None)]
        hint = from_import_error(e, purpose=" ".join(w for w in words if w))
        if hint is None:
            raise
        print(f"error: {hint}", file=sys.stderr)
        status = EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        status = 130
    if status_line:
        cmd = shlex.join(argv if argv is not None else sys.argv)
        print(f"{'PASSED' if status == 0 else 'FAILED'} | {time.perf_counter() - start:.1f}s | {cmd}", file=sys.stderr)
    return status


def import_optional(module: str) -> ModuleType | None:
    """A subcommand's module (``add_arguments`` + ``run``), or None when this version does not ship it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
        return None
