"""Check the exported target graph against ``transformers``: ``OnnxRuntimeTarget`` vs ``HFTarget``, same model.

The scenario is the runtime's own: a right-padded prefill of two prompts of different lengths, a verify of
4 tokens, a commit that keeps 3 and 1 of them (a per-request rollback, leaving a hole), and a second verify
of 3 tokens over that cache. Logits (fp32) and taps are compared at every valid slot within the export
dtype's tolerance (``TARGET_TOLERANCES``, printed with its reason); a mismatch raises ``ValidationMismatch``
(CLI exit 3).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import torch

from .validate import Check, Tolerance, ValidationReport, _close

__all__ = ["TARGET_TOLERANCES", "validate_target_onnx"]

log = logging.getLogger("dspark.export")

#: per export dtype; the reason is printed with every report
TARGET_TOLERANCES = {
    "fp32": Tolerance(2e-4, 1e-4, "fp32 both sides; MLAS GEMMs and softmax sum in another order than torch "
                      "(~1e-7 relative per op, grown through the layers and the lm_head)"),
    "fp16": Tolerance(6e-2, 2e-2, "fp16 activations: onnxruntime and torch round fp16 intermediates at different "
                      "points (10-bit mantissa, ~1e-3 per op, grown through the layers)", exact_tokens=False),
    "bf16": Tolerance(2.5e-1, 4e-2, "bf16 activations (8-bit mantissa, ~4e-3 per op) on both sides, the graph as "
                      "its fp32 bf16-emulation twin on onnxruntime's CPU provider; fused attention rounds elsewhere",
                      exact_tokens=False),
}


def validate_target_onnx(onnx_path: str | Path, model, layer_ids: Sequence[int], *, dtype: str, seed: int = 0,
                         raise_on_failure: bool = True) -> ValidationReport:
    """Run ``onnx_path`` (``OnnxRuntimeTarget``) and ``model`` (``HFTarget``) through prefill, verify, rollback,
    verify; compare logits and taps of ``layer_ids`` (the drafter's DeepSeek ids)."""
    from ..runtime.ort_target import OnnxRuntimeTarget
    from ..runtime.target import HFTarget
    from .target_graph import target_shape

    shape = target_shape(model.config)
    tol = TARGET_TOLERANCES[dtype]
    report = ValidationReport(dtype, tol, title="target validation: onnxruntime vs transformers, prefill + verify + "
                                                "rollback + verify")
    ref = HFTarget(model)
    got = OnnxRuntimeTarget(onnx_path, num_layers=shape.num_layers, num_key_value_heads=shape.num_key_value_heads,
                            head_dim=shape.head_dim, hidden_size=shape.hidden_size, vocab_size=shape.vocab_size,
                            layer_ids=layer_ids, dtype=dtype)
    ref.set_taps(layer_ids)
    got.set_taps(layer_ids)
    gen = torch.Generator().manual_seed(seed)
    V = shape.vocab_size
    prompts = [torch.randint(0, V, (n,), generator=gen) for n in (7, 3)]
    r, g = ref.prefill(prompts), got.prefill(prompts)
    valid = ref.valid.unsqueeze(-1).expand_as(r.taps)  # [B, T, m·d]: padding slots are not compared
    report.checks += [_close("prefill logits [B, V]", g.logits, r.logits.float(), tol),
                      _close("prefill taps [B, T, m·d]", g.taps, r.taps, tol, mask=valid)]
    for step, (Q, keep) in enumerate(((4, (3, 1)), (3, (3, 3)))):
        tokens = torch.randint(0, V, (2, Q), generator=gen)
        r, g = ref.verify(tokens), got.verify(tokens)
        label = f"verify {step + 1} (Q={Q}{', after a rollback' if step else ''})"
        report.checks += [_close(f"{label} logits [B, Q, V]", g.logits, r.logits.float(), tol),
                          _close(f"{label} taps [B, Q, m·d]", g.taps, r.taps, tol)]
        ref.commit(torch.tensor(keep))
        got.commit(torch.tensor(keep))
    report.checks.append(Check("committed lengths", got.lengths.tolist() == ref.lengths.tolist(),
                               f"{got.lengths.tolist()} vs transformers {ref.lengths.tolist()}"))
    for line in report.lines():
        log.info(line)
    if raise_on_failure and not report.ok:
        from ..errors import ValidationMismatch

        bad = [c for c in report.checks if not c.ok]
        raise ValidationMismatch(f"the exported target graph disagrees with transformers ({len(bad)} of "
                                 f"{len(report.checks)} checks): {bad[0].name}: {bad[0].detail}; re-export, or report "
                                 f"a bug if it persists")
    return report
