"""``dspark-export``: the same as ``dspark export``."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from .main import main as dspark_main

    return dspark_main(sys.argv[1:] if argv is None else argv, command="export", prog="dspark-export")


if __name__ == "__main__":
    sys.exit(main())
