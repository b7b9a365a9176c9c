"""The embedded demo pair: what ``dspark-export``, ``dspark generate``, ``dspark serve`` and ``dspark bench e2e``
run on when no model is given (``pair.py``). Built from a synthetic tiny pair (``synthetic/``) trained here and a
drafter distilled by ``training.quick``; cached under the one cache root (``cache.py``).
"""

from .pair import EMBEDDED_TEXT, build_embedded_pair, embedded_pair

__all__ = ["EMBEDDED_TEXT", "build_embedded_pair", "embedded_pair"]
