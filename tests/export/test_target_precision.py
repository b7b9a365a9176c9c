"""The exported target in fp16 on massive activations (issue #16): finite when it fits, refused when it overflows."""

from __future__ import annotations

import pytest
import torch

from dspark_trt.errors import DSparkTrtError
from dspark_trt.export.target_precision import calibration_prompt, check_target_fp16
from dspark_trt.testing.massive import plant_massive_target

LAYER_IDS = (1, 2, 4)  # the default tiny pair's taps


def planted(pair, *, boost_layer=None):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(pair.target, dtype=torch.float32).eval()
    model.requires_grad_(False)
    plant_massive_target(model, boost_layer=boost_layer)
    return model


def test_calibration_prompt_starts_with_bos():
    from types import SimpleNamespace

    ids = calibration_prompt(SimpleNamespace(bos_token_id=7, vocab_size=50), length=5)
    assert ids.shape == (1, 5) and int(ids[0, 0]) == 7 and bool((ids < 50).all())
    assert int(calibration_prompt(SimpleNamespace(bos_token_id=None, vocab_size=50))[0, 0]) == 0


def test_a_target_that_overflows_fp16_is_refused_in_one_line(tiny_pair, tmp_path):
    from dspark_trt.config import DSparkConfig
    from dspark_trt.export.pipeline import TargetForExport

    model = planted(tiny_pair, boost_layer=1)  # 3·10⁴ + 4·10⁴ at BOS from layer 1 on
    with pytest.raises(DSparkTrtError) as e:
        check_target_fp16(model.half())
    message = str(e.value)
    assert "\n" not in message and "overflows fp16: the output of decoder layer 1 is non-finite" in message
    assert "export with --dtype bf16 or fp32" in message
    # through the export pipeline: refused before the target graph is exported
    target_dir = tmp_path / "target"
    model.float().save_pretrained(target_dir)
    config = DSparkConfig.from_pretrained(tiny_pair.drafter)
    step = TargetForExport.check(config, target_dir, dtype="fp16", max_context=64, validate=False)
    with pytest.raises(DSparkTrtError, match="overflows fp16"):
        step(tmp_path / "out")
    assert not (tmp_path / "out" / "onnx" / "target.onnx").exists()


@pytest.mark.onnx
@pytest.mark.slow  # exports and validates the tiny target in fp16 (~10 s)
def test_fp16_target_graph_keeps_massive_activations_finite(tiny_pair, tmp_path):
    from dspark_trt import load_drafter
    from dspark_trt.export.target_onnx import export_target_onnx
    from dspark_trt.export.target_graph import target_shape
    from dspark_trt.export.validate_target import validate_target_onnx
    from dspark_trt.runtime.targets.onnxruntime import OnnxRuntimeTarget

    model = planted(tiny_pair).half()  # massive activations of 3·10⁴ at token 0: they fit fp16
    line = check_target_fp16(model)
    assert line.startswith("fp16 range: largest activation 3e+04")
    path = export_target_onnx(model, LAYER_IDS, tmp_path / "target.onnx")
    report = validate_target_onnx(path, model, LAYER_IDS, dtype="fp16")  # raises on a mismatch
    assert report.ok
    s = target_shape(model.config)
    target = OnnxRuntimeTarget(path, num_layers=s.num_layers, num_key_value_heads=s.num_key_value_heads,
                               head_dim=s.head_dim, hidden_size=s.hidden_size, vocab_size=s.vocab_size,
                               layer_ids=LAYER_IDS, dtype="fp16")
    target.set_taps(LAYER_IDS)
    prompts = [calibration_prompt(model.config, length=9)[0], torch.tensor([5, 0, 9])]  # BOS first; 0 mid-prompt
    out = target.prefill(prompts)
    valid = target.valid  # [B, T] slots holding prompt tokens
    taps = out.taps[valid]  # [tokens, m·d] fp16
    assert taps.dtype == torch.float16 and bool(torch.isfinite(taps).all()) and bool(torch.isfinite(out.logits).all())
    assert float(taps.abs().max()) > 2.5e4  # the massive activations reach the drafter
    drafter = load_drafter(tiny_pair.drafter, dtype="fp16", target_dir=tiny_pair.target)  # context fusion in fp32
    T = out.taps.shape[1]
    k, v = drafter.context_kv(out.taps, torch.arange(T).expand(2, T))
    assert bool(torch.isfinite(k).all() and torch.isfinite(v).all())
