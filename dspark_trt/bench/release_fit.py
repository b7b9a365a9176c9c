"""The largest target depth whose release row fits a memory budget (``dspark bench releases --target-layers fit``).

A full-shape row holds the target's weights (bf16, 2 bytes a parameter) in three steps. Their peaks, as lines over
the rows measured (docs/checkpoints.md, "At full shape": 4B, 8B, 14B widths, GLM-5 at the least depth, the whole
4B target, the fitted rows; the engine's line an upper envelope, since its factor varies with the model, 2.41–2.70):

    target engine build      ≈ 0.4 GB + 2.7 · T                   (``ENGINE``)
    greedy decoding          ≈ 3.5 GB + 1.05 · (D + T)            (``PAIR``: both graphs' sessions)
    export + validate        below both: the target graph is streamed from placeholders and validated on the
                             layers that fit (``validate_target_files``)

and for a Gemma-4 pair, whose steps measured more at both depths run (6 and 11 layers):

    greedy decoding          ≈ 3.5 GB + 1.47 · (D + T)            (``PAIR_GEMMA4``)
    export + validate        ≈ 7.4 GB + 2.97 · T                  (``EXPORT_GEMMA4``: the target is validated whole,
                             against transformers in bf16 and in fp32, ``export/gemma4_target_onnx.py``)

These are peaks of resident memory, which count the pages of weights a step maps from disk: the kernel can drop
those and read them again, so a row can run where its estimate exceeds the memory (the Gemma-4 row at 11 layers
peaked at 28.45 GB on a 23 GB machine, docs/checkpoints.md); the estimate errs on that side.

with T the target's and D the drafter graphs' weight bytes (its ``embed_tokens`` and ``lm_head`` included, which a
speculators drafter reads from the target). ``fit_target_layers`` returns the largest depth (at least
the least that keeps the drafter's taps, at most the release's own) whose larger estimate is within the budget.
The estimate is a model, not a promise: the row measures each step's peak and reports it.
"""

from __future__ import annotations

__all__ = ["ENGINE", "PAIR", "PAIR_GEMMA4", "EXPORT_GEMMA4", "weight_bytes", "estimated_peak", "fit_target_layers"]

#: (fixed bytes, bytes per weight byte) of a target engine build's peak; measured 5.37 / 11.72 / 17.33 / 18.64 /
#: 21.23 / 20.32 / 19.06 GB at T = 1.99 / 4.80 / 7.08 / 7.73 / 8.04 / 7.44 / 7.51 GB (Qwen3-4B whole, 36 layers; 33
#: layers, 20.32 GB, over 0.4 + 2.6 · T = 19.74, which made the factor 2.7; 8B widths at 13 layers)
ENGINE = (0.4e9, 2.7)
#: (fixed bytes, bytes per weight byte of D + T) of greedy decoding's peak; measured 8.34 / 12.52 / 17.55 / 18.35 /
#: 14.85 GB at D + T = 4.78 / 9.54 / 13.91 / 14.04 / 10.83 GB
PAIR = (3.5e9, 1.05)
#: a Gemma-4 pair's greedy decoding: measured 20.95 / 24.37 GB at D + T = 11.95 / 14.29 GB (6 / 11 target layers)
PAIR_GEMMA4 = (3.5e9, 1.47)
#: a Gemma-4 pair's export + validate: measured 21.55 / 28.45 GB at T = 4.80 / 7.13 GB (6 / 11 target layers)
EXPORT_GEMMA4 = (7.4e9, 2.97)


def weight_bytes(preset, bytes_per_parameter: int = 2) -> tuple[int, int]:
    """(drafter graphs, target) weight bytes of a drafter preset and its target at their depths, from their tensor
    shapes (the drafter's in DeepSeek layout: its graphs hold ``embed_tokens`` and ``lm_head`` in every format)."""
    import dataclasses

    from ..synthetic.presets import drafter_tensor_shapes, parameter_count, target_tensor_shapes

    graphs = dataclasses.replace(preset, lm_head=True) if hasattr(preset, "lm_head") else preset  # read or own
    drafter = parameter_count(drafter_tensor_shapes(graphs, "deepseek"))
    target = parameter_count(target_tensor_shapes(preset.target))
    return bytes_per_parameter * drafter, bytes_per_parameter * target


def estimated_peak(preset) -> float:
    """The largest step's estimated peak bytes of a full-shape row of ``preset`` at its target depth."""
    from ..synthetic.gemma4_presets import Gemma4DrafterPreset

    drafter, target = weight_bytes(preset)
    if isinstance(preset, Gemma4DrafterPreset):  # DeepSpec's Gemma-4 drafter with its Gemma-4 target
        return max(ENGINE[0] + ENGINE[1] * target, PAIR_GEMMA4[0] + PAIR_GEMMA4[1] * (drafter + target),
                   EXPORT_GEMMA4[0] + EXPORT_GEMMA4[1] * target)
    return max(ENGINE[0] + ENGINE[1] * target, PAIR[0] + PAIR[1] * (drafter + target))


def fit_target_layers(preset, budget_bytes: int) -> tuple[int, str]:
    """(the largest target depth whose row fits ``budget_bytes``, one line saying why); the least depth that keeps
    the drafter's taps when even that does not fit (the line says so)."""
    from ..synthetic.presets import scaled

    least, most = len(preset.target_layer_ids) + 1, int(preset.target.num_hidden_layers)

    def peak(depth: int) -> tuple[float, int]:
        at = scaled(preset, target_layers=depth)
        return estimated_peak(at), weight_bytes(at)[1]

    best = next((d for d in range(most, least - 1, -1) if peak(d)[0] <= budget_bytes), None)
    depth = least if best is None else best
    need, target = peak(depth)
    why = (f"target depth {depth} of {most}: {target / 1e9:.2f} GB of bf16 weights, estimated peak {need / 1e9:.1f} GB "
           f"of a {budget_bytes / 1e9:.1f} GB budget")
    if best is None:
        why += " (the least depth that keeps the taps; it does not fit the budget)"
    elif depth < most:
        why += f" (depth {depth + 1}: {peak(depth + 1)[0] / 1e9:.1f} GB)"
    return depth, why
