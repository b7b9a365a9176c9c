"""SmolLM2-135M-Instruct as a real target: its directory, its ONNX export against transformers, and greedy
speculative decoding from the export equal to transformers' own greedy output.

The SmolLM2 directory is built once per machine (``$DSPARK_TRT_CACHE``), its export once per test run.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from dspark_trt.models.smollm2 import BUILD, STAMP, cached_smollm2_target, write_smollm2_target

pytestmark = [pytest.mark.slow]

PROMPTS = [("chat", "What is the capital of Italy?"), ("chat", "Write a haiku about rain."),
           ("text", "def add(a, b):\n"), ("text", "The three primary colors are")]


@pytest.fixture(scope="session")
def smollm2():
    return cached_smollm2_target()


@pytest.fixture(scope="session")
def smollm2_model(smollm2):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def smollm2_export(smollm2, tmp_path_factory):
    """An untrained drafter with SmolLM2's shapes + the fp32 ONNX export of the pair (validated by the export)."""
    from filelock import FileLock

    from dspark_trt.export.pipeline import ExportOptions, export_model
    from dspark_trt.training import DrafterShape
    from dspark_trt.training.distill import write_initial_drafter

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # this run's workers share it
    with FileLock(str(root / "smollm2-export.lock")):
        out = root / "smollm2-export"
        if not (out / "manifest.json").is_file():
            drafter = write_initial_drafter(smollm2, root / "smollm2-drafter", shape=DrafterShape(
                markov_rank=16, block_size=4, draft_vocab_size=4096), force=True)
            export_model(drafter, out, ExportOptions(topk=64, dtype="fp32", engine="none", max_context=512),
                         target_dir=smollm2, force=True)
    return out


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
def test_exported_target_matches_transformers(smollm2_export, smollm2_model, smollm2):
    """Prefill of two chat prompts of different lengths, a verify of 4 tokens, a per-request rollback and a
    second verify: logits element-wise (fp32), taps norm-wise, on the exported target vs transformers."""
    from transformers import AutoTokenizer

    from dspark_trt.runtime.ort_target import OnnxRuntimeTarget
    from dspark_trt.runtime.target import HFTarget
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
