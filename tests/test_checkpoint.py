"""The checkpoint contract: one test per violation, every violation reported at once, lazy/sharded loading."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dspark_trt import load_drafter
from dspark_trt.checkpoint import SafetensorsCheckpoint, expected_tensors
from dspark_trt.errors import CheckpointContractError, DSparkTrtError
from dspark_trt.synthetic import write_tiny_checkpoint


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    small = dict(vocab_size=300, hidden_size=32, intermediate_size=48, head_dim=8, markov_rank=8)
    return {
        "full": write_tiny_checkpoint(root / "full", **small),
        "reduced": write_tiny_checkpoint(root / "reduced", draft_vocab_size=120, **small),
    }


def edited(pair, tmp_path, *, tensors=None, config=None):
    """A copy of the pair's drafter with its tensors and/or config.json edited."""
    out = tmp_path / "drafter"
    shutil.copytree(pair.drafter, out)
    if tensors:
        state = load_file(out / "model.safetensors")
        tensors(state)
        save_file(state, out / "model.safetensors")
    if config:
        raw = json.loads((out / "config.json").read_text())
        config(raw)
        (out / "config.json").write_text(json.dumps(raw))
    return out


def violation(path, target=None) -> str:
    with pytest.raises(CheckpointContractError) as info:
        load_drafter(path, target_dir=target)
    assert len(info.value.violations) >= 1
    return str(info.value)


def test_a_valid_checkpoint_loads(pairs):
    model = load_drafter(pairs["full"].drafter)
    assert model.config.num_hidden_layers == 2 and model.confidence_head is not None
    assert not any(p.requires_grad for p in model.parameters())


def test_missing_tensor(pairs, tmp_path):
    path = edited(pairs["full"], tmp_path, tensors=lambda s: s.pop("fc.weight"))
    assert "missing tensor fc.weight (expected shape [32, 96])" in violation(path)


def test_unexpected_tensor(pairs, tmp_path):
    path = edited(pairs["full"], tmp_path, tensors=lambda s: s.update({"layers.2.mlp.up_proj.weight": torch.zeros(1)}))
    assert "unexpected tensor layers.2.mlp.up_proj.weight (config.json has num_hidden_layers=2)" in violation(path)


def test_w1_sized_by_the_draft_vocabulary(pairs, tmp_path):
    """W1 embeds the predecessor's *target* id: [V, r], even with a reduced draft vocabulary (vLLM #47093)."""
    fn = lambda s: s.update({"markov_head.markov_w1.weight": torch.zeros(120, 8)})
    path = edited(pairs["reduced"], tmp_path, tensors=fn)
    assert "markov_head.markov_w1.weight has shape [120, 8], expected [300, 8]" in violation(path)


def test_w2_shape(pairs, tmp_path):
    path = edited(pairs["full"], tmp_path, tensors=lambda s: s.update({"markov_head.markov_w2.weight": torch.zeros(8, 300)}))
    assert "markov_head.markov_w2.weight has shape [8, 300], expected [300, 8]" in violation(path)


def test_fc_shape_follows_the_number_of_taps(pairs, tmp_path):
    path = edited(pairs["full"], tmp_path, config=lambda c: c.update(target_layer_ids=[1, 2]))
    assert "fc.weight has shape [32, 96], expected [32, 64]" in violation(path)


def test_confidence_head_shape_and_missing_bias(pairs, tmp_path):
    def fn(s):
        s["confidence_head.proj.weight"] = torch.zeros(1, 32)  # without the Markov part
        s.pop("confidence_head.proj.bias")
    message = violation(edited(pairs["full"], tmp_path, tensors=fn))
    assert "confidence_head.proj.weight has shape [1, 32], expected [1, 40]" in message
    assert "missing tensor confidence_head.proj.bias" in message


def test_reduced_vocab_needs_d2t(pairs, tmp_path):
    path = edited(pairs["reduced"], tmp_path, tensors=lambda s: s.pop("d2t"))
    assert "must include a d2t token mapping" in violation(path)


def test_reduced_vocab_needs_its_own_lm_head(pairs, tmp_path):
    path = edited(pairs["reduced"], tmp_path, tensors=lambda s: s.pop("lm_head.weight"))
    assert "must include lm_head weights" in violation(path, target=pairs["reduced"].target)


def test_shared_weights_absent_need_the_target(pairs, tmp_path):
    path = edited(pairs["full"], tmp_path, tensors=lambda s: (s.pop("embed_tokens.weight"), s.pop("lm_head.weight")))
    message = violation(path)
    assert "embed_tokens.weight is absent: DSpark drafters share it with the target" in message
    assert "lm_head.weight is absent" in message
    model = load_drafter(path, target_dir=pairs["full"].target)  # and they come from the target
    reference = load_drafter(pairs["full"].drafter)
    assert torch.equal(model.embed_tokens.weight, reference.embed_tokens.weight)
    assert torch.equal(model.lm_head.weight, reference.lm_head.weight)


def test_target_layer_ids_out_of_range(pairs, tmp_path):
    path = edited(pairs["full"], tmp_path, config=lambda c: c.update(target_layer_ids=[1, 2, 6]))
    assert "target_layer_ids [1, 2, 6] contain [6] outside [-1, 5]" in violation(path)


def test_pickle_weights_are_refused(tmp_path, pairs):
    out = tmp_path / "pickled"
    out.mkdir()
    shutil.copy(pairs["full"].drafter / "config.json", out)
    torch.save({"fc.weight": torch.zeros(1)}, out / "pytorch_model.bin")
    with pytest.raises(DSparkTrtError, match="refuses pickle files because loading them can execute arbitrary code"):
        load_drafter(out)


def test_every_violation_is_reported_at_once_sorted(pairs, tmp_path):
    def fn(s):
        s.pop("norm.weight")
        s.pop("fc.weight")
        s["surprise"] = torch.zeros(1)
    with pytest.raises(CheckpointContractError) as info:
        load_drafter(edited(pairs["full"], tmp_path, tensors=fn))
    v = info.value.violations
    assert len(v) == 3 and v == sorted(v)
    assert "(3 problems)" in str(info.value) and "\n" not in str(info.value)


def test_training_only_tensors_are_ignored(pairs, tmp_path):
    fn = lambda s: s.update({"t2d": torch.ones(300, dtype=torch.bool), "mask_embedding": torch.zeros(32)})
    load_drafter(edited(pairs["full"], tmp_path, tensors=fn))


def test_absent_confidence_head_disables_confidence(pairs, tmp_path):
    fn = lambda s: (s.pop("confidence_head.proj.weight"), s.pop("confidence_head.proj.bias"))
    model = load_drafter(edited(pairs["full"], tmp_path, tensors=fn))
    assert model.confidence_head is None and not model.config.enable_confidence_head
    c = model.config
    k = torch.zeros(c.num_hidden_layers, 1, 3, c.num_key_value_heads, c.head_dim)
    assert model.draft(torch.tensor([1]), k, k, torch.tensor([3]), topk=4).confidence is None


def test_sharded_checkpoint_loads_like_the_single_file(pairs, tmp_path):
    out = tmp_path / "sharded"
    out.mkdir()
    shutil.copy(pairs["full"].drafter / "config.json", out)
    state = load_file(pairs["full"].drafter / "model.safetensors")
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in shards.items():
        save_file({k: state[k] for k in keys}, out / file)
    index = {"metadata": {}, "weight_map": {k: f for f, keys in shards.items() for k in keys}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    a, b = load_drafter(out), load_drafter(pairs["full"].drafter)
    for (na, ta), (nb, tb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert na == nb and torch.equal(ta, tb)


def test_missing_shard_is_named(pairs, tmp_path):
    out = edited(pairs["full"], tmp_path)
    index = {"weight_map": {"fc.weight": "model-00009.safetensors"}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(DSparkTrtError, match="shard model-00009.safetensors named in"):
        SafetensorsCheckpoint(out).shapes()


def test_load_dtype_and_d2t_stays_integer(pairs):
    model = load_drafter(pairs["reduced"].drafter, dtype="bf16")
    assert model.fc.weight.dtype == torch.bfloat16 and model.d2t.dtype == torch.int64
    assert model.d2t_or_none is not None
    with pytest.raises(DSparkTrtError, match="unknown dtype 'int8'"):
        load_drafter(pairs["full"].drafter, dtype="int8")


def test_expected_tensors_covers_the_module_state_dict(pairs):
    model = load_drafter(pairs["reduced"].drafter)
    assert set(model.state_dict()) == set(expected_tensors(model.config))


# -- the target a speculators checkpoint names ----------------------------------------------------------------
@pytest.fixture(scope="module")
def speculators_pair(tmp_path_factory):
    small = dict(vocab_size=300, hidden_size=32, intermediate_size=48, head_dim=8, markov_rank=8)
    return write_tiny_checkpoint(tmp_path_factory.mktemp("spec") / "pair", format="speculators", **small)


def with_verifier(pair, tmp_path, name_or_path):
    return edited(pair, tmp_path, config=lambda c: c["speculators_config"]["verifier"].update(name_or_path=name_or_path))


def test_speculators_verifier_directory_is_the_default_target(speculators_pair, tmp_path, monkeypatch):
    from dspark_trt.loader import default_target_dir

    raw = json.loads((speculators_pair.drafter / "config.json").read_text())
    assert raw["speculators_config"]["verifier"]["name_or_path"] == "../target"  # relative to the drafter
    assert "num_target_layers" not in raw  # speculators never writes the verifier's depth
    assert default_target_dir(speculators_pair.drafter) == speculators_pair.drafter / "../target"
    model = load_drafter(speculators_pair.drafter)  # embed_tokens / lm_head from the recorded verifier
    assert model.config.num_target_layers == 6  # read from the target's config.json
    explicit = load_drafter(speculators_pair.drafter, target_dir=speculators_pair.target)
    assert torch.equal(model.embed_tokens.weight, explicit.embed_tokens.weight)

    absolute = with_verifier(speculators_pair, tmp_path, str(speculators_pair.target.resolve()))
    monkeypatch.chdir(tmp_path)
    assert default_target_dir(absolute) == speculators_pair.target.resolve()
    (tmp_path / "verifiers").mkdir()
    shutil.copytree(speculators_pair.target, tmp_path / "verifiers" / "t")
    cwd_relative = with_verifier(speculators_pair, tmp_path / "x", "verifiers/t")  # relative to the working dir
    assert default_target_dir(cwd_relative) == Path("verifiers/t")


@pytest.mark.parametrize("name", ["Qwen/Qwen3-8B", "/nonexistent/verifier", None])
def test_no_default_target_without_a_local_verifier(speculators_pair, tmp_path, name):
    from dspark_trt.loader import default_target_dir

    path = with_verifier(speculators_pair, tmp_path, name)
    assert default_target_dir(path) is None
    assert default_target_dir(speculators_pair.target) is None  # not a speculators config
    assert "embed_tokens.weight is absent" in violation(path)


def test_recorded_verifier_too_shallow_for_the_taps_is_refused(speculators_pair, tmp_path):
    def taps_and_verifier(c):
        c.update(aux_hidden_state_layer_ids=[2, 3, 7])  # DeepSeek ids [1, 2, 6]: a 6-layer target has ids ≤ 5
        c["speculators_config"]["verifier"]["name_or_path"] = str(speculators_pair.target.resolve())

    path = edited(speculators_pair, tmp_path, config=taps_and_verifier)
    with pytest.raises(DSparkTrtError, match=r"target_layer_ids \[1, 2, 6\] are invalid for this 6-layer target"):
        load_drafter(path)


# -- DeepSpec's Gemma-4 drafter ----------------------------------------------------------------------------------
GEMMA_NARROW = dict(hidden_size=64, intermediate_size=96, head_dim=16, global_head_dim=32, num_attention_heads=4,
                    num_key_value_heads=2, sliding_window=8)


@pytest.fixture(scope="module")
def gemma_pair(tmp_path_factory):
    from dspark_trt.synthetic import write_preset

    return write_preset("dspark_gemma4_12b_block7", tmp_path_factory.mktemp("gemma") / "pair", with_target=True,
                        layers=2, target_layers=6, vocab=600, dtype="fp32", **GEMMA_NARROW)


def test_the_gemma4_contract_is_gemma4dsparkmodels_state_dict():
    """At the release's shapes: the preset's tensor list (DeepSpec's module, layer by layer) == the contract."""
    from dspark_trt.config import DSparkConfig
    from dspark_trt.synthetic.presets import drafter_tensor_shapes, get_preset

    p = get_preset("dspark_gemma4_12b_block7")
    spec = expected_tensors(DSparkConfig.from_dict(p.config_json("bf16")))
    assert {n: s.shape for n, s in spec.items() if n != "d2t"} == drafter_tensor_shapes(p, "deepseek")
    assert spec["layers.0.self_attn.q_norm.weight"].shape == (512,)  # global_head_dim, not the sliding 256


def test_a_gemma4_drafter_loads_and_its_state_is_the_contract(gemma_pair):
    model = load_drafter(gemma_pair.drafter, target_dir=gemma_pair.target)
    assert model.config.layer_family == "gemma4" and model.config.head_dim == 32
    assert set(model.state_dict()) == set(expected_tensors(model.config))
    assert type(model.layers[1]).__name__ == "Gemma4DraftLayer"


def test_gemma4_tensors_at_the_sliding_head_size_are_named(gemma_pair, tmp_path):
    def sliding(state):
        state["layers.1.self_attn.k_norm.weight"] = torch.ones(16)
        del state["layers.0.layer_scalar"]

    message = violation(edited(gemma_pair, tmp_path, tensors=sliding), gemma_pair.target)
    assert "layers.1.self_attn.k_norm.weight has shape [16], expected [32]" in message
    assert "missing tensor layers.0.layer_scalar" in message and "\n" not in message


def test_a_k_eq_v_gemma4_drafter_has_no_v_proj(gemma_pair, tmp_path):
    def k_eq_v(raw):
        raw.update(attention_k_eq_v=True, num_global_key_value_heads=2)

    message = violation(edited(gemma_pair, tmp_path, config=k_eq_v), gemma_pair.target)
    assert "unexpected tensor layers.0.self_attn.v_proj.weight (config.json has attention_k_eq_v=true" in message


def test_a_gemma4_drafter_without_its_frozen_copies_reads_the_tied_target(gemma_pair, tmp_path):
    """DeepSpec copies embed_tokens and lm_head from the target (tied: one table); absent, both come from the
    target's model.embed_tokens.weight."""
    from safetensors import safe_open

    def drop(state):
        del state["embed_tokens.weight"], state["lm_head.weight"]

    model = load_drafter(edited(gemma_pair, tmp_path, tensors=drop), target_dir=gemma_pair.target)
    with safe_open(str(next(gemma_pair.target.glob("*.safetensors"))), "pt") as f:
        table = f.get_tensor("model.embed_tokens.weight")
        assert "lm_head.weight" not in f.keys()
    assert torch.equal(model.lm_head.weight, table) and torch.equal(model.embed_tokens.weight, table)
