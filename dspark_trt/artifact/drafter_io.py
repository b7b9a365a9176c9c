"""The drafter graphs' I/O names and the interface check every reader of them runs (``export/graphs.py`` builds
the graphs, ``runtime/drafter_graphs.py`` feeds them).

    context:  taps [B, T, m·d], positions [B, T] int32  →  ctx_k, ctx_v [L, B, T, H_kv, D]
    draft:    anchor [B], ctx_key_<l> / ctx_value_<l> [B, H_kv, T, D] per layer l, ctx_len, ctx_start,
              temperature, seed [B]  →  draft_tokens [B, N], cand_ids [B, N, k] (top-k only),
              cand_logits [B, N, k], confidence [B, N] (with a head)
"""

from __future__ import annotations

__all__ = ["CONTEXT_INPUTS", "CONTEXT_OUTPUTS", "DRAFT_INPUTS", "DRAFT_KV_INTERFACE", "ctx_names",
           "draft_input_names", "check_draft_interface", "draft_outputs"]

CONTEXT_INPUTS = ("taps", "positions")
CONTEXT_OUTPUTS = ("ctx_k", "ctx_v")
DRAFT_INPUTS = ("anchor", "ctx_key_<l>", "ctx_value_<l>", "ctx_len", "ctx_start", "temperature", "seed")  # l: layer
#: the draft graph's context interface (per-layer heads-first inputs read in place, row 0 at ``ctx_start``)
DRAFT_KV_INTERFACE = "per-layer-heads-first-v2"


def ctx_names(num_layers: int) -> tuple[list[str], list[str]]:
    """The draft graph's per-layer context inputs: ``ctx_key_0 … ctx_key_{L-1}``, ``ctx_value_0 …``."""
    return [f"ctx_key_{i}" for i in range(num_layers)], [f"ctx_value_{i}" for i in range(num_layers)]


def draft_input_names(num_layers: int) -> list[str]:
    keys, values = ctx_names(num_layers)
    return ["anchor", *keys, *values, "ctx_len", "ctx_start", "temperature", "seed"]


def check_draft_interface(input_names, where: str) -> None:
    """One line refusing a draft graph (or engine) of an older interface: the stacked ``ctx_k [L, B, T, H_kv, D]``
    input, or per-layer inputs without ``ctx_start``."""
    names = set(input_names)
    if "ctx_k" in names or "ctx_key_0" not in names or "ctx_start" not in names:
        from ..errors import DSparkTrtError

        older = ("one stacked ctx_k [L, B, T, H_kv, D]" if "ctx_key_0" not in names
                 else "per-layer ctx_key_<l> without ctx_start")
        raise DSparkTrtError(f"the draft graph of {where} takes its context as {older} (an older export); this "
                             f"dspark-trt runs {DRAFT_KV_INTERFACE} (ctx_key_<l> / ctx_value_<l>, ctx_start): "
                             f"re-export the drafter (dspark-export DRAFTER --target TARGET -o OUT --force)")


def draft_outputs(topk: int | None, has_confidence: bool) -> tuple[str, ...]:
    names = ("draft_tokens",) + (("cand_ids",) if topk is not None else ()) + ("cand_logits",)
    return names + (("confidence",) if has_confidence else ())
