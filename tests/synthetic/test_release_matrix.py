"""The release matrix (issue 46): one preset per public release, its published counts at full size, its source row in
docs/checkpoints.md; the Gemma-4 pair written as transformers / DeepSpec name it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dspark_trt.checkpoint import check_checkpoint
from dspark_trt.errors import DSparkTrtError
from dspark_trt.synthetic.preset_checkpoint import write_preset
from dspark_trt.synthetic.presets import (PRESETS, DrafterPreset, drafter_parameter_formula, drafter_tensor_shapes,
                                        get_preset, parameter_count, target_parameter_formula, target_tensor_shapes)

DOC = Path(__file__).resolve().parents[2] / "docs" / "checkpoints.md"
NARROW = dict(hidden_size=64, intermediate_size=96, head_dim=16, num_attention_heads=4, num_key_value_heads=2)
GEMMA_NARROW = dict(NARROW, global_head_dim=32, sliding_window=8)
#: the releases issue 46 names → the preset that stands for each
RELEASES = {
    "deepseek-ai/dspark_qwen3_4b_block7": "dspark_qwen3_4b_block7",
    "deepseek-ai/dspark_qwen3_8b_block7": "dspark_qwen3_8b_block7",
    "deepseek-ai/dspark_qwen3_14b_block7": "dspark_qwen3_14b_block7",
    "deepseek-ai/dspark_gemma4_12b_block7": "dspark_gemma4_12b_block7",
    "speculators format": "speculators_glm5_block8",
    "Model Optimizer format": "modelopt_qwen3_4b_block7",
    "block 5": "dspark_block5_taps40_42",
    "block 8": "speculators_glm5_block8",
    "no lm_head": "dspark_qwen3_8_27b_no_lm_head",
}
QWEN3_DRAFTERS = [n for n, p in PRESETS.items() if isinstance(p, DrafterPreset)]


def test_every_release_has_a_preset_and_a_source_row_in_the_docs():
    doc = DOC.read_text()
    matrix = doc.split("## The release matrix", 1)[1]
    for release, name in RELEASES.items():
        assert name in PRESETS, release
        assert f"`{name}`" in matrix, f"{name} has no row in docs/checkpoints.md's release matrix"
    for name, p in PRESETS.items():  # and every preset says where it comes from
        assert f"`{name}`" in matrix, name
    assert get_preset("speculators_glm5_block8").format == "speculators"
    assert get_preset("dspark_block5_taps40_42").block_size == 5
    assert get_preset("speculators_glm5_block8").block_size == 8


@pytest.mark.parametrize("name, count", [("qwen3_4b", 4_022_468_096), ("qwen3_14b", 14_768_307_200),
                                         ("qwen3_8b", 8_190_735_360)])
def test_targets_have_the_releases_parameter_counts(name, count):
    t = get_preset(name)
    assert parameter_count(target_tensor_shapes(t)) == target_parameter_formula(t) == count
    assert ("lm_head.weight" in target_tensor_shapes(t)) == (not t.tie_word_embeddings)
    assert get_preset("qwen3_4b").tie_word_embeddings and not get_preset("qwen3_14b").tie_word_embeddings


def test_the_speculators_preset_reproduces_the_cards_parameter_count():
    """RedHatAI's GLM-5.x speculator card: 1,249,565,313 parameters, 3 layers, taps 2/20/39/58/75 (speculators ids),
    V 154880, rank 256; the widths (6144, 64 / 16 heads of 64, 14336) are the solution that gives that count."""
    p = get_preset("speculators_glm5_block8")
    assert parameter_count(drafter_tensor_shapes(p, "speculators")) == 1_249_565_313
    assert [i + 1 for i in p.config().target_layer_ids] == [2, 20, 39, 58, 75]


@pytest.mark.parametrize("name", QWEN3_DRAFTERS)
@pytest.mark.parametrize("format", ["deepseek", "speculators"])
def test_each_drafter_preset_passes_the_checkpoint_contract_at_full_size(name, format):
    p = get_preset(name)
    shapes = drafter_tensor_shapes(p, format)
    assert parameter_count(shapes) == drafter_parameter_formula(p, format)
    needed = check_checkpoint(p.config(), {k: (list(v), "BF16") for k, v in shapes.items()}, target_available=True)
    assert set(needed) == {"embed_tokens.weight", "lm_head.weight"} - set(shapes)
    assert ("lm_head.weight" in shapes) == (format == "deepseek" and p.lm_head)


def test_the_drafter_without_lm_head_loads_the_targets(tmp_path):
    from dspark_trt.loader import load_drafter

    out = write_preset("dspark_qwen3_8_27b_no_lm_head", tmp_path / "p", with_target=True, layers=1, target_layers=6,
                       vocab=600, **NARROW)
    from safetensors import safe_open

    with safe_open(str(out.drafter / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys() and "embed_tokens.weight" in f.keys()
        drafter_embed = f.get_tensor("embed_tokens.weight")
    with safe_open(str(next(out.target.glob("*.safetensors"))), "pt") as f:
        target_head = f.get_tensor("lm_head.weight")
    model = load_drafter(out.drafter, target_dir=out.target, dtype="fp32")
    assert torch.equal(model.lm_head.weight.to(target_head.dtype), target_head)
    assert torch.equal(model.embed_tokens.weight.to(drafter_embed.dtype), drafter_embed)


def test_a_tied_targets_drafter_copies_its_embeddings_as_lm_head(tmp_path):
    from safetensors import safe_open

    out = write_preset("dspark_qwen3_4b_block7", tmp_path / "p", with_target=True, layers=1, target_layers=6,
                       vocab=600, **NARROW)
    with safe_open(str(out.drafter / "model.safetensors"), "pt") as f:
        head = f.get_tensor("lm_head.weight")
    with safe_open(str(next(out.target.glob("*.safetensors"))), "pt") as f:
        assert "lm_head.weight" not in f.keys()
        assert torch.equal(head, f.get_tensor("model.embed_tokens.weight"))


@pytest.fixture(scope="module")
def gemma_pair(tmp_path_factory):
    return write_preset("dspark_gemma4_12b_block7", tmp_path_factory.mktemp("gemma") / "pair", with_target=True,
                        layers=1, target_layers=12, vocab=600, **GEMMA_NARROW)


def test_the_gemma4_target_is_what_transformers_builds(gemma_pair):
    import transformers
    from safetensors import safe_open

    model = transformers.AutoModelForCausalLM.from_pretrained(gemma_pair.target)
    assert type(model).__name__ == "Gemma4ForCausalLM"
    cfg = model.config
    assert cfg.final_logit_softcapping == 30.0 and cfg.sliding_window == 8
    assert cfg.layer_types.count("full_attention") == 2 and cfg.layer_types[-1] == "full_attention"
    with safe_open(str(next(gemma_pair.target.glob("*.safetensors"))), "pt") as f:
        written = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    state = {k: tuple(v.shape) for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied
    assert written == state
    assert bool(torch.isfinite(model(torch.tensor([[1, 2, 3]])).logits).all())


def test_the_gemma4_drafter_is_deepspecs_and_loads_as_gemma4_layers(gemma_pair):
    import json

    from dspark_trt.loader import load_drafter

    config = json.loads((gemma_pair.drafter / "config.json").read_text())
    assert config["architectures"] == ["Gemma4DSparkModel"] and config["mask_token_id"] == 4
    assert config["layer_types"] == ["full_attention"] and config["markov_rank"] == 256
    p = get_preset("dspark_gemma4_12b_block7")
    assert p.target_layer_ids == (5, 17, 29, 41, 46) and p.target.num_hidden_layers == 48
    drafter = load_drafter(gemma_pair.drafter, target_dir=gemma_pair.target)
    c = drafter.config
    assert (c.layer_family, c.head_dim, c.final_logit_softcapping) == ("gemma4", GEMMA_NARROW["global_head_dim"], 30.0)
    with pytest.raises(DSparkTrtError, match="speculators layout"):
        drafter_tensor_shapes(p, "speculators")


def test_the_gemma4_target_preset_passes_the_target_export_checks(gemma_pair):
    """The written Gemma-4 target is one the target export takes (tests/export/test_gemma4_target.py exports it)."""
    import json

    from dspark_trt.export.target_graph import check_architecture

    config = json.loads((gemma_pair.target / "config.json").read_text())
    assert check_architecture(config) == "Gemma4ForCausalLM"
    with pytest.raises(DSparkTrtError) as e:
        check_architecture({**config, "architectures": ["Gemma4ForConditionalGeneration"]})
    assert "multimodal Gemma-4" in str(e.value) and "\n" not in str(e.value)
