"""SmolLM2-135M-Instruct as a real target: its directory, its ONNX export against transformers, and greedy
speculative decoding from the export equal to transformers' own greedy output.

The SmolLM2 directory is built once per machine (``$DSPARK_TRT_CACHE``). Its fp32 export is the SmolLM2
walk-through's (``smollm2_walkthrough``, tests/conftest.py: run once per test run), its bf16 export is made here
once per run; the tests that use an export share xdist groups, so that one worker runs each chain in a row.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from dspark_trt.models.smollm2 import BUILD, STAMP, cached_smollm2_target, write_smollm2_target

pytestmark = [pytest.mark.slow]
FP32 = pytest.mark.xdist_group("smollm2")  # the walk-through's export (tests/test_example_smollm2.py runs it)
BF16 = pytest.mark.xdist_group("smollm2-bf16")

PROMPTS = [("chat", "What is the capital of Italy?"), ("chat", "Write a haiku about rain."),
           ("text", "def add(a, b):\n"), ("text", "The three primary colors are")]


@pytest.fixture(scope="session")
def smollm2():
    return cached_smollm2_target()


@pytest.fixture(scope="session")
def smollm2_model(smollm2):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()


def _shared_root(tmp_path_factory):
    """This run's shared temporary directory (xdist workers share it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def smollm2_drafter(smollm2, tmp_path_factory):
    """An untrained drafter with SmolLM2's shapes (written once per run; its quality is not the point)."""
    from filelock import FileLock

    from dspark_trt.training import DrafterShape
    from dspark_trt.training.distill import write_initial_drafter

    root = _shared_root(tmp_path_factory)
    with FileLock(str(root / "smollm2-drafter.lock")):
        out = root / "smollm2-drafter"
        if not (out / "config.json").is_file():
            write_initial_drafter(smollm2, out, shape=DrafterShape(markov_rank=16, block_size=4, draft_vocab_size=4096),
                                  force=True)
    return out


def export_pair(smollm2, drafter, root, dtype: str):
    """``dspark-export DRAFTER --target SMOLLM2 --dtype DTYPE`` (top-k 64, no engine, context 512) once per run;
    the export validates both graphs and fails (exit 3) on a mismatch."""
    from filelock import FileLock

    from dspark_trt.cli.main import main

    with FileLock(str(root / f"smollm2-export-{dtype}.lock")):
        out = root / ("smollm2-export" if dtype == "fp32" else f"smollm2-export-{dtype}")
        if not (out / "manifest.json").is_file():
            status = main(["export", str(drafter), "--target", str(smollm2), "-o", str(out), "--dtype", dtype,
                           "--topk", "64", "--engine", "none", "--max-context", "512", "--force"])
            assert status == 0, f"dspark-export --dtype {dtype} of the SmolLM2 pair exited {status}"
    return out


@pytest.fixture(scope="session")
def smollm2_export(smollm2_walkthrough):
    """The walk-through's export: its 3-step drafter + SmolLM2, top-k 512, fp32 (validated by the export)."""
    export = smollm2_walkthrough.out / "export"
    assert (export / "manifest.json").is_file(), \
        f"the SmolLM2 walk-through wrote no export: {smollm2_walkthrough.stderr[-3000:]}"
    return export


def test_directory_is_a_standard_llama(smollm2):
    config = json.loads((smollm2 / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == \
        ("llama", 30, 576, 49152)
    assert "quantization_config" not in config
    assert json.loads((smollm2 / STAMP).read_text()) == BUILD
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2)
    assert tok.chat_template and tok.eos_token == "<|im_end|>"


def test_build_is_idempotent(smollm2):
    before = (smollm2 / "model.safetensors").stat().st_mtime_ns
    assert write_smollm2_target(smollm2) == smollm2
    assert (smollm2 / "model.safetensors").stat().st_mtime_ns == before


def test_refuses_a_foreign_directory(tmp_path):
    from dspark_trt.errors import DSparkTrtError

    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(DSparkTrtError, match="--force"):
        write_smollm2_target(tmp_path)
    assert (tmp_path / "keep.txt").read_text() == "mine"


def _rowwise_relative_error(got: torch.Tensor, ref: torch.Tensor, width: int) -> float:
    """max over positions and tap blocks of ‖Δ‖ / ‖ref‖ (SmolLM2's first positions carry activations of ~1e3
    in a few channels, so an element-wise atol says nothing there; a norm-wise relative error does)."""
    g = got.float().unflatten(-1, (-1, width))
    r = ref.float().unflatten(-1, (-1, width))
    return float(((g - r).norm(dim=-1) / r.norm(dim=-1).clamp_min(1e-6)).max())


@pytest.mark.onnx
@FP32
def test_exported_target_matches_transformers(smollm2_export, smollm2_model, smollm2):
    """Prefill of two chat prompts of different lengths, a verify of 4 tokens, a per-request rollback and a
    second verify: logits element-wise (fp32), taps norm-wise, on the exported target vs transformers."""
    from transformers import AutoTokenizer

    from dspark_trt.runtime.targets.onnxruntime import OnnxRuntimeTarget
    from dspark_trt.runtime.targets.hf import HFTarget
    from dspark_trt.training.prompts import render_prompts

    manifest = json.loads((smollm2_export / "manifest.json").read_text())
    layer_ids = manifest["target"]["layer_ids"]
    assert manifest["target"]["num_layers"] == 30 and manifest["target"]["vocab_size"] == 49152
    got = OnnxRuntimeTarget.from_export(smollm2_export, device="cpu")
    ref = HFTarget(smollm2_model)
    got.set_taps(layer_ids)
    ref.set_taps(layer_ids)
    tok = AutoTokenizer.from_pretrained(smollm2)
    prompts = [torch.tensor(p) for p in render_prompts(PROMPTS[:2], tok)]
    g, r = got.prefill(prompts), ref.prefill(prompts)
    torch.testing.assert_close(g.logits.float(), r.logits.float(), atol=2e-4, rtol=1e-4)
    for b, p in enumerate(prompts):
        assert _rowwise_relative_error(g.taps[b, : len(p)], r.taps[b, : len(p)], 576) < 1e-4
    nxt = torch.stack([r.logits[b].argmax() for b in range(2)])
    tokens = torch.stack([nxt, nxt + 1, nxt + 2, nxt + 3], dim=1)  # [B, 4]
    g, r = got.verify(tokens), ref.verify(tokens)
    torch.testing.assert_close(g.logits.float(), r.logits.float(), atol=2e-4, rtol=1e-4)
    assert _rowwise_relative_error(g.taps, r.taps, 576) < 1e-4
    keep = torch.tensor([3, 1])
    got.commit(keep)
    ref.commit(keep)
    assert got.lengths.tolist() == ref.lengths.tolist()
    g, r = got.verify(tokens[:, :3]), ref.verify(tokens[:, :3])
    torch.testing.assert_close(g.logits.float(), r.logits.float(), atol=2e-4, rtol=1e-4)
    assert _rowwise_relative_error(g.taps, r.taps, 576) < 1e-4


@pytest.mark.onnx
@FP32
def test_greedy_speculative_from_the_export_equals_transformers_greedy(smollm2_export, smollm2_model, smollm2):
    from transformers import AutoTokenizer

    from dspark_trt.runtime import SpeculativeDecoder
    from dspark_trt.training.prompts import render_prompts

    tok = AutoTokenizer.from_pretrained(smollm2)
    prompts = render_prompts(PROMPTS, tok)
    dec = SpeculativeDecoder.from_export(smollm2_export, backend="onnxruntime", device="cpu")
    new = 20
    out = dec.generate(prompts, max_new_tokens=new, eos_token_id=[])
    assert out.stats.rounds > 0 and out.stats.drafted > 0
    for p, got in zip(prompts, out.tokens):
        ids = torch.tensor([p])
        with torch.no_grad():  # transformers' own greedy argmax, EOS included (generate's min_new_tokens masks it)
            for _ in range(new):
                ids = torch.cat((ids, smollm2_model(input_ids=ids).logits[:, -1].argmax(-1, keepdim=True)), dim=1)
        ref = ids[0, len(p):].tolist()
        assert got == ref, (tok.decode(p), tok.decode(got), tok.decode(ref))


@pytest.mark.onnx
@pytest.mark.parametrize("dtype", [pytest.param("fp32", marks=FP32),  # fp16 too by `dspark bench export`
                                   pytest.param("bf16", marks=BF16)])  # (docs/export.md): 4 min
def test_the_real_pair_exports_at_every_dtype(dtype, smollm2, smollm2_drafter, tmp_path_factory, request):
    """SmolLM2 (30 layers, massive activations of ~2.6·10⁴) passes its own export validation: the drafter's
    checks and the target's (the bf16/fp16 target tolerance grows with depth and the row's scale: docs/export.md,
    "Precision"; the fp16 tolerance's mechanism is tested on the tiny target with planted massive activations,
    tests/export/test_target_precision.py)."""
    from dspark_trt.cli.export import add_arguments

    parser = __import__("argparse").ArgumentParser()
    add_arguments(parser)
    offered = next(a for a in parser._actions if "--dtype" in a.option_strings).help
    assert offered.startswith("fp32 | fp16 | bf16"), offered  # the list: fp32, bf16 here, fp16 by the bench
    out = request.getfixturevalue("smollm2_export") if dtype == "fp32" else \
        export_pair(smollm2, smollm2_drafter, _shared_root(tmp_path_factory), dtype)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["dtype"] == dtype and manifest["target"]["dtype"] == dtype
    target_lines = manifest["target"]["validation"]
    assert len(target_lines) == 8 and all(line.strip().startswith("ok") for line in target_lines[1:]), target_lines


@pytest.mark.onnx
@BF16
def test_bf16_validation_still_fails_taps_shifted_by_one_layer(smollm2, smollm2_drafter, tmp_path_factory,
                                                               monkeypatch):
    """The derived bf16 tolerance is loose enough for two bf16 implementations of SmolLM2, not for a graph that
    taps one layer deeper than declared (validated as if its taps were each one layer shallower). One validation
    run (SmolLM2 in bf16 on both sides): it raises, and its report, kept aside, says which checks failed."""
    from dspark_trt.errors import ValidationMismatch
    from dspark_trt.export import validate_target
    from dspark_trt.export.target_onnx import load_target_model

    reports = []

    class KeptReport(validate_target.ValidationReport):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            reports.append(self)

    out = export_pair(smollm2, smollm2_drafter, _shared_root(tmp_path_factory), "bf16")
    layer_ids = json.loads((out / "manifest.json").read_text())["target"]["layer_ids"]
    model = load_target_model(smollm2, torch.bfloat16)
    shifted = [i - 1 for i in layer_ids]
    monkeypatch.setattr(validate_target, "ValidationReport", KeptReport)  # after the export's own validation
    with pytest.raises(ValidationMismatch, match="taps"):
        validate_target.validate_target_onnx(out / "onnx" / "target.onnx", model, shifted, dtype="bf16")
    (failed,) = reports
    assert [c.name for c in failed.checks if not c.ok] == [c.name for c in failed.checks if "taps" in c.name]
