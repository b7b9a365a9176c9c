"""Preset checkpoints on disk: the project's own checks and loaders accept them, determinism, pairs, atomicity."""

from __future__ import annotations

import errno
import json

import pytest
import torch

from dspark_trt import load_drafter
from dspark_trt.checkpoint import SafetensorsCheckpoint, check_checkpoint
from dspark_trt.config import DSparkConfig
from dspark_trt.errors import DSparkTrtError
from dspark_trt.synthetic import preset_checkpoint
from dspark_trt.synthetic.preset_checkpoint import MARKER, write_preset
from dspark_trt.synthetic.presets import drafter_parameter_formula, get_preset, scaled

DRAFTER = "dspark_qwen3_8b_block7"
#: the preset's family at test width (tests that check mechanics, not size)
NARROW = dict(hidden_size=64, intermediate_size=96, head_dim=16, num_attention_heads=4, num_key_value_heads=2)


def drafts(model):
    """Reference drafts of a loaded drafter on random taps (greedy and sampled rows)."""
    c = model.config
    dtype = next(model.parameters()).dtype
    gen = torch.Generator().manual_seed(0)
    taps = torch.randn(2, 6, c.num_taps * c.hidden_size, generator=gen).to(dtype)  # [B, T, m·d]
    k, v = model.context_kv(taps, torch.arange(6).expand(2, 6))
    return model.draft(torch.tensor([5, 7]), k, v, torch.tensor([6, 4]), topk=16,
                       temperature=torch.tensor([0.0, 1.0]), seed=torch.tensor([1, 2]))


def checked(drafter_dir, *, target_available=False):
    config = DSparkConfig.from_pretrained(drafter_dir)
    with SafetensorsCheckpoint(drafter_dir) as ck:
        shapes = ck.shapes()
    return config, shapes, check_checkpoint(config, shapes, model_dir=str(drafter_dir), target_available=target_available)


@pytest.mark.slow
@pytest.mark.parametrize("format, shard_size", [("deepseek", None), ("speculators", "150MB")],
                         ids=["deepseek-single-file", "speculators-sharded"])
def test_the_preset_at_full_width_passes_the_checkpoint_contract(tmp_path, format, shard_size):
    """hidden 4096, intermediate 12288, 32/8 heads, rank 256, 5 taps — one draft layer, V = 1024 (≈ 0.57 GB)."""
    out = write_preset(DRAFTER, tmp_path / "d", format=format, layers=1, vocab=1024, shard_size=shard_size)
    config, shapes, from_target = checked(out.drafter, target_available=format == "speculators")
    assert (config.hidden_size, config.intermediate_size, config.num_attention_heads, config.num_key_value_heads,
            config.markov_rank, config.num_taps) == (4096, 12288, 32, 8, 256, 5)
    assert config.num_target_layers == (36 if format == "deepseek" else None)  # speculators: read from the target
    assert out.parameters == drafter_parameter_formula(scaled(get_preset(DRAFTER), layers=1, vocab=1024), format)
    assert {dtype for _, dtype in shapes.values()} == {"BF16"}
    if format == "deepseek":
        assert from_target == [] and (out.drafter / "model.safetensors").is_file()
        model = load_drafter(out.drafter, dtype="bf16")  # self-contained: no target
        res = drafts(model)
        assert res.tokens.shape == (2, 7) and bool(torch.isfinite(res.cand_logits).all())
        assert bool(torch.isfinite(res.confidence).all())
    else:
        assert from_target == ["embed_tokens.weight", "lm_head.weight"]
        index = json.loads((out.drafter / "model.safetensors.index.json").read_text())
        assert sorted(index["weight_map"]) == sorted(shapes) and len(set(index["weight_map"].values())) > 1


@pytest.mark.parametrize("format", ["deepseek", "speculators"])
@pytest.mark.parametrize("shard_size", [None, "200kB"], ids=["single-file", "sharded"])
def test_each_format_and_layout_loads_with_finite_reference_drafts(tmp_path, format, shard_size):
    out = write_preset(DRAFTER, tmp_path / "pair", format=format, layers=1, target_layers=8, vocab=1000,
                       shard_size=shard_size, target_shard_size=shard_size, with_target=True, **NARROW)
    assert sorted(p.name for p in out.path.iterdir()) == ["drafter", MARKER, "target"]
    assert out.nbytes == sum(f.stat().st_size for f in out.path.rglob("*") if f.is_file())
    marker = json.loads((out.path / MARKER).read_text())
    assert marker["parameters"] == out.parameters and marker["preset"] == DRAFTER and marker["seed"] == 0
    config, shapes, from_target = checked(out.drafter, target_available=True)
    assert config.source_format == format and config.target_layer_ids == (1, 2, 3, 4, 5)
    assert from_target == ([] if format == "deepseek" else ["embed_tokens.weight", "lm_head.weight"])
    for part in (out.drafter, out.target):
        index = part / "model.safetensors.index.json"
        assert index.is_file() == (shard_size is not None)
        if index.is_file():  # the index covers every tensor exactly once, and only the shards it names exist
            weight_map = json.loads(index.read_text())["weight_map"]
            with SafetensorsCheckpoint(part) as ck:
                assert sorted(weight_map) == ck.keys()
            assert sorted(set(weight_map.values())) == sorted(p.name for p in part.glob("*.safetensors"))
    # a speculators drafter finds ../target by itself, as the tiny pair's does
    model = load_drafter(out.drafter, dtype="bf16", target_dir=None if format == "speculators" else out.target)
    res = drafts(model)
    assert bool(torch.isfinite(res.cand_logits).all()) and bool(torch.isfinite(res.confidence).all())


def test_same_seed_same_bytes_and_the_formats_load_to_the_same_drafter(tmp_path):
    kw = dict(layers=2, target_layers=8, vocab=700, with_target=True, **NARROW)
    a = write_preset(DRAFTER, tmp_path / "a", seed=5, **kw)
    b = write_preset(DRAFTER, tmp_path / "b", seed=5, **kw)
    c = write_preset(DRAFTER, tmp_path / "c", seed=6, **kw)
    files = sorted(p.relative_to(a.path) for p in a.path.rglob("*") if p.is_file() and p.name != MARKER)
    assert len(files) > 5
    for f in files:
        assert (a.path / f).read_bytes() == (b.path / f).read_bytes(), f
    assert (a.drafter / "model.safetensors").read_bytes() != (c.drafter / "model.safetensors").read_bytes()
    # sharding moves bytes between files, never changes them
    s = write_preset(DRAFTER, tmp_path / "s", seed=5, shard_size="100kB", **kw)
    with SafetensorsCheckpoint(a.drafter) as one, SafetensorsCheckpoint(s.drafter) as many:
        assert one.keys() == many.keys()
        assert all(torch.equal(one.get(k), many.get(k)) for k in one.keys())
        # a DeepSeek drafter's embed_tokens / lm_head are its target's, as in a release
        with SafetensorsCheckpoint(a.target) as target:
            assert torch.equal(one.get("embed_tokens.weight"), target.get("model.embed_tokens.weight"))
            assert torch.equal(one.get("lm_head.weight"), target.get("lm_head.weight"))
    sp = write_preset(DRAFTER, tmp_path / "sp", seed=5, format="speculators", **kw)
    ds_model, sp_model = load_drafter(a.drafter, target_dir=a.target), load_drafter(sp.drafter)
    assert sp_model.config.replace(source_format="deepseek") == ds_model.config
    r_ds, r_sp = drafts(ds_model), drafts(sp_model)
    assert torch.equal(r_ds.tokens, r_sp.tokens) and torch.equal(r_ds.cand_logits, r_sp.cand_logits)


def test_the_target_is_a_hugging_face_qwen3_with_a_tokenizer(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = write_preset("qwen3_8b", tmp_path / "t", layers=2, vocab=512, shard_size="100kB", **NARROW)
    assert out.drafter is None and out.target == out.path
    assert sorted(p.name for p in out.target.glob("model-*")) == [
        f"model-{i:05d}-of-{len(list(out.target.glob('model-*'))):05d}.safetensors"
        for i in range(1, len(list(out.target.glob("model-*"))) + 1)]
    config = json.loads((out.target / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["eos_token_id"] is None  # 151645 ≥ 512
    model = AutoModelForCausalLM.from_pretrained(out.target, dtype=torch.bfloat16, local_files_only=True)
    assert model.config.num_hidden_layers == 2 and model.dtype == torch.bfloat16
    ids = AutoTokenizer.from_pretrained(out.target, local_files_only=True).encode("héllo")
    assert ids == list("héllo".encode())  # the byte-level tokenizer
    logits = model(input_ids=torch.tensor([ids])).logits  # [1, T, V]
    assert logits.shape == (1, len(ids), 512) and bool(torch.isfinite(logits).all())


def test_force_replaces_only_an_earlier_output(tmp_path):
    kw = dict(layers=1, vocab=300, **NARROW)
    out = tmp_path / "d"
    write_preset(DRAFTER, out, **kw)
    with pytest.raises(DSparkTrtError, match="holds an earlier output; pass --force"):
        write_preset(DRAFTER, out, **kw)
    write_preset(DRAFTER, out, force=True, shard_size="50kB", **kw)
    assert (out / "model.safetensors.index.json").is_file() and not (out / "model.safetensors").exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(DSparkTrtError, match=f"no {MARKER}"):
        write_preset(DRAFTER, mine, force=True, **kw)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_not_enough_free_disk_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    import shutil

    real = shutil.disk_usage
    monkeypatch.setattr(preset_checkpoint.shutil, "disk_usage",
                        lambda p: real(p)._replace(free=10**9))  # the machine's real disk, 1 GB free
    with pytest.raises(DSparkTrtError) as e:
        write_preset(DRAFTER, tmp_path / "new" / "d")
    assert str(e.value) == (f"not enough free disk for {tmp_path / 'new' / 'd'}: the checkpoint needs 4.75 GB, "
                            f"{tmp_path} has 1.00 GB free; free some space, choose another directory, or write a "
                            f"smaller model (--layers, --target-layers, --vocab)")
    assert list(tmp_path.iterdir()) == []


def test_a_disk_that_fills_up_leaves_nothing_behind(tmp_path, monkeypatch):
    real = preset_checkpoint.write_sharded
    calls = []

    def fill_up(where, *args, **kwargs):  # the drafter is written, then the disk is full
        calls.append(where)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(where, *args, **kwargs)

    monkeypatch.setattr(preset_checkpoint, "write_sharded", fill_up)
    with pytest.raises(DSparkTrtError) as e:
        write_preset(DRAFTER, tmp_path / "pair", with_target=True, layers=1, target_layers=5, vocab=300, **NARROW)
    assert str(e.value).startswith(f"the disk filled up while writing {tmp_path / 'pair'} (nothing was left behind): "
                                   f"the checkpoint needs ")
    assert len(calls) == 2 and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kwargs, message", [
    (dict(preset="qwen3_8b", with_target=True), "qwen3_8b is a target preset"),
    (dict(preset="qwen3_8b", vocab=100), "a target needs vocab_size >= 257"),
    (dict(preset=DRAFTER, format="eagle"), "unknown checkpoint format 'eagle'"),
    (dict(preset=DRAFTER, dtype="int8"), "unknown dtype 'int8'"),
    (dict(preset=DRAFTER, target_shard_size="1GB"), "--target-shard-size needs --with-target"),
    (dict(preset=DRAFTER, shard_size="lots"), "shard size 'lots' is not a size"),
])
def test_bad_options_are_one_line_errors_and_write_nothing(tmp_path, kwargs, message):
    with pytest.raises(DSparkTrtError) as e:
        write_preset(out_dir=tmp_path / "x", **kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("head", ["gated", "rnn"])
def test_gated_and_rnn_presets_write_load_and_draft(tmp_path, head):
    """The head presets at test width: written, checked, loaded, finite drafts that the head changes."""
    out = write_preset(f"{DRAFTER}_{head}", tmp_path / "d", layers=1, target_layers=8, vocab=600, **NARROW)
    config, shapes, _ = checked(out.drafter)
    assert config.markov_head_type == head
    proj = "gate_proj" if head == "gated" else "joint_proj"
    assert {f"markov_head.{proj}.weight", f"markov_head.{proj}.bias"} <= set(shapes)
    model = load_drafter(out.drafter, dtype="bf16")
    res = drafts(model)
    assert bool(torch.isfinite(res.cand_logits).all()) and bool(torch.isfinite(res.confidence).all())
    with torch.no_grad():
        getattr(model.markov_head, proj).weight.zero_()
    assert not torch.equal(drafts(model).cand_logits, res.cand_logits)  # the projection is read
