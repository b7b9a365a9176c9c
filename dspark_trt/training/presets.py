"""Budget numbers by where ``dspark distill`` runs; explicit options override them (docs/smollm2.md).

``gpu`` is sized for one H200 to finish in about 8 minutes with SmolLM2-135M: 64 + 8,192 prompts (the prompt
bank with its modifiers, less the validation subjects) continued up to 256 tokens, 512 at a time, then 3
minutes of training at 64 sequences × 32 anchors per step. The sizes are estimates from the CPU run's costs,
not yet measured on a GPU.
"""

from __future__ import annotations

__all__ = ["PRESETS"]

PRESETS: dict[str, dict] = {
    "cpu": {},
    "gpu": {"bank_prompts": 8192, "new_tokens": 256, "data_batch": 512, "batch": 64, "anchors": 32,
            "minutes": 3.0, "val_every": 250, "val_prompts": 96},
}
