"""The exported target graph's I/O names, its K/V interface, and the manifest's ``target`` section.

    input_ids, position_ids, attention_mask, logits_index [B, ·], past_key_<l> / past_value_<l> [B, H, P, D]
      →  logits [B, K, V], taps [B, Q, m·d], new_key / new_value [L, B, H, Q, D]

``export/target_graph.py`` builds the graph; the runtime's targets feed it and read ``target_section``.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import DSparkTrtError

__all__ = ["KV_INTERFACE", "GEMMA4_KV_INTERFACE", "KV_INTERFACES", "OUTPUT_NAMES", "MAX_NEW_TOKENS", "past_names", "input_names", "check_kv_interface",
           "target_section"]

#: the target graph's K/V interface (recorded in the manifest's target section as ``kv_interface``)
KV_INTERFACE = "per-layer-capacity-v1"  # also: logits_index
#: Gemma-4 targets (export/gemma4_target_graph.py): per-type K/V, sliding layers by position; onnxruntime runs it
GEMMA4_KV_INTERFACE = "gemma4-windowed-v1"
KV_INTERFACES = (KV_INTERFACE, GEMMA4_KV_INTERFACE)
OUTPUT_NAMES = ["logits", "taps", "new_key", "new_value"]
#: the most new tokens one target graph call scores: prompts run in chunks of this many (the runtime's
#: ``prefill_chunk``), so the engine's activation memory is sized for a chunk, not a whole context
MAX_NEW_TOKENS = 512



def past_names(num_layers: int) -> tuple[list[str], list[str]]:
    """The per-layer cache inputs: ``past_key_0 … past_key_{L-1}``, ``past_value_0 …``."""
    return [f"past_key_{i}" for i in range(num_layers)], [f"past_value_{i}" for i in range(num_layers)]


def input_names(num_layers: int) -> list[str]:
    keys, values = past_names(num_layers)
    return ["input_ids", "position_ids", "attention_mask", "logits_index", *keys, *values]


def check_kv_interface(section: dict, where: str = "the export") -> None:
    """One line refusing a target graph whose K/V interface this runtime does not speak."""
    found = section.get("kv_interface")
    if found not in KV_INTERFACES:
        raise DSparkTrtError(f"the target graph of {where} has K/V interface {found or 'stacked past_key [L, B, H, P, D]'}, "
                             f"this dspark-trt runs {KV_INTERFACE}; re-export the target (dspark-export DRAFTER "
                             f"--target TARGET -o OUT --force)")


def target_section(export_dir: str | Path, manifest: dict) -> dict:
    """The ``target`` section of an export's manifest (``ExportDir.target``); a one-line error saying how to add
    it when absent."""
    export_dir = Path(export_dir)
    section = manifest.get("target")
    if not section:
        raise DSparkTrtError(f"{export_dir} has no exported target (exported with --skip-target or without "
                             f"--target); re-run dspark-export DRAFTER --target TARGET -o {export_dir} --force")
    check_kv_interface(section, str(export_dir))
    path = export_dir / section["onnx"]
    if not path.is_file():
        raise DSparkTrtError(f"{path} is missing; re-run dspark-export DRAFTER --target TARGET -o {export_dir} --force")
    return section
