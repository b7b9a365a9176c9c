"""Is a target safe in fp16? Its own activations must stay finite, massive activations included (issue #16).

LLMs carry a few *massive activations* in their residual stream (~2–3·10⁴ in Qwen3-8B), at the sequence's
first token (the attention sink) and at delimiter tokens, from an early layer on. fp16's largest finite
value is 65504: a target either fits (its taps then reach the drafter finite, and the drafter's context
fusion runs in fp32: ``reference/precision.py``) or some layer overflows, and every later layer, the
logits and the taps are inf/NaN.

``check_target_fp16(model)`` runs the fp16 model once on a calibration prompt that starts with BOS (where
massive activations live) and scans every layer's output and the logits. Overflow → ``DSparkTrtError``, one
line naming the layer and the fix (bf16 or fp32); else a report line with the largest activation and its
headroom, recorded in the manifest's ``target`` section.
"""

from __future__ import annotations

import logging

import torch

from ..errors import DSparkTrtError

__all__ = ["FP16_MAX", "check_target_fp16", "calibration_prompt"]

log = logging.getLogger("dspark.export")

FP16_MAX = float(torch.finfo(torch.float16).max)  # 65504


def calibration_prompt(config, length: int = 24, seed: int = 0) -> torch.Tensor:
    """[1, length] int64: BOS (or id 0) then seeded random ids."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    bos = getattr(cfg, "bos_token_id", None)
    first = int(bos[0] if isinstance(bos, (list, tuple)) else bos) if bos is not None else 0
    gen = torch.Generator().manual_seed(seed)
    rest = torch.randint(0, int(cfg.vocab_size), (length - 1,), generator=gen)
    return torch.cat((torch.tensor([first]), rest)).view(1, length)


@torch.no_grad()
def check_target_fp16(model, input_ids: torch.Tensor | None = None) -> str:
    """Run ``model`` (fp16) on ``input_ids`` (default ``calibration_prompt``); raise ``DSparkTrtError`` when a
    layer's output or the logits are non-finite, else return a one-line report of the activation range."""
    arch = (getattr(model.config, "architectures", None) or [type(model).__name__])[0]
    ids = calibration_prompt(model.config) if input_ids is None else input_ids
    out = model(input_ids=ids.to(model.device), output_hidden_states=True, use_cache=False)
    hidden = out.hidden_states  # embeddings, layer 0 … layer L-1 outputs (the last one final-normed)
    largest, where = 0.0, "the embeddings"
    for i, h in enumerate(hidden):
        name = "the embeddings" if i == 0 else f"decoder layer {i - 1}"
        if i == len(hidden) - 1 and i > 0:
            name += " (after the final norm)"
        if not bool(torch.isfinite(h).all()):
            raise DSparkTrtError(
                f"target {arch} overflows fp16: the output of {name} is non-finite on a BOS-first calibration "
                f"prompt (the largest finite activation before it is {largest:.3g} in {where}; fp16's max is "
                f"{FP16_MAX:g}); export with --dtype bf16 or fp32")
        peak = float(h.abs().max())
        if peak > largest:
            largest, where = peak, name
    if not bool(torch.isfinite(out.logits).all()):
        raise DSparkTrtError(f"target {arch} overflows fp16 in its lm_head (non-finite logits on a BOS-first "
                             f"calibration prompt); export with --dtype bf16 or fp32")
    line = (f"fp16 range: largest activation {largest:.3g} in {where} on a BOS-first calibration prompt "
            f"({FP16_MAX / max(largest, 1e-30):.3g}x headroom to {FP16_MAX:g})")
    log.info(line)
    return line
