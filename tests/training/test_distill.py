"""``dspark distill`` on a tiny target: determinism, resume, a loadable checkpoint, a falling loss."""

from __future__ import annotations

import importlib
import json

import pytest
import torch
from safetensors.torch import load_file

from dspark_trt.errors import DSparkTrtError
from dspark_trt.training import DistillSettings, DrafterShape, distill
from dspark_trt.training.distill import work_dir

pytestmark = pytest.mark.usefixtures("one_thread")

distill_module = importlib.import_module("dspark_trt.training.distill")

SHAPE = DrafterShape(markov_rank=8, block_size=4)


def settings(**kw) -> DistillSettings:
    base = dict(steps=8, new_tokens=16, random_prompts=6, batch=3, anchors=4, threads=1, val_prompts=4, val_every=0)
    return DistillSettings(**{**base, **kw})


def weights(path):
    return load_file(str(path / "model.safetensors"))


@pytest.fixture(scope="module")
def peaky_pair(tmp_path_factory):
    """The tiny Qwen3 pair with a peakier target (a random 0.02-std target is nearly uniform)."""
    from dspark_trt.synthetic import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("distill") / "pair", seed=0, target_init_std=0.2)


@pytest.fixture(scope="module")
def first_run(peaky_pair, tmp_path_factory):
    return distill(peaky_pair.target, tmp_path_factory.mktemp("a") / "drafter", shape=SHAPE, settings=settings(),
                   progress=False)


def test_same_seed_same_weights_other_seed_other_weights(peaky_pair, first_run, tmp_path):
    again = distill(peaky_pair.target, tmp_path / "b", shape=SHAPE, settings=settings(), progress=False)
    a, b = weights(first_run), weights(again)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    other = distill(peaky_pair.target, tmp_path / "c", shape=SHAPE, settings=settings(seed=1), progress=False)
    c = weights(other)
    assert not torch.equal(a["fc.weight"], c["fc.weight"])


@pytest.mark.slow
def test_interrupted_run_resumes_to_the_same_weights(peaky_pair, first_run, tmp_path, monkeypatch):
    out = tmp_path / "resumed"
    real_step = distill_module.distill_step
    calls = []

    def failing_step(drafter, data, t2d, step, s):
        calls.append(step)
        if step == 5:
            raise KeyboardInterrupt
        return real_step(drafter, data, t2d, step, s)

    monkeypatch.setattr(distill_module, "distill_step", failing_step)
    with pytest.raises(KeyboardInterrupt):
        distill(peaky_pair.target, out, shape=SHAPE, settings=settings(checkpoint_every_s=0.0), progress=False)
    assert not out.exists() and (work_dir(out) / "state.pt").is_file()  # nothing half-written, a checkpoint kept
    monkeypatch.setattr(distill_module, "distill_step", real_step)
    calls.clear()
    resumed = []
    monkeypatch.setattr(distill_module, "distill_step",
                        lambda d, data, t2d, step, s: (resumed.append(step), real_step(d, data, t2d, step, s))[1])
    distill(peaky_pair.target, out, shape=SHAPE, settings=settings(checkpoint_every_s=0.0), progress=False)
    assert resumed == [5, 6, 7]  # from the last checkpoint (after step 4), not from scratch
    a, b = weights(first_run), weights(out)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not work_dir(out).exists()


def test_finished_run_is_left_alone_and_other_settings_are_refused(peaky_pair, first_run):
    before = (first_run / "model.safetensors").stat().st_mtime_ns
    distill(peaky_pair.target, first_run, shape=SHAPE, settings=settings(), progress=False)
    assert (first_run / "model.safetensors").stat().st_mtime_ns == before
    with pytest.raises(DSparkTrtError, match="--force"):
        distill(peaky_pair.target, first_run, shape=SHAPE, settings=settings(seed=3), progress=False)


def test_checkpoint_loads_and_decodes_losslessly(peaky_pair, first_run):
    from dspark_trt.loader import load_drafter
    from dspark_trt.runtime import SpeculativeDecoder

    drafter = load_drafter(first_run, target_dir=peaky_pair.target)
    c = drafter.config
    assert (c.num_hidden_layers, c.markov_rank, c.num_draft_tokens, c.source_format) == (1, 8, 4, "deepseek")
    target_emb = load_file(str(peaky_pair.target / "model.safetensors"))["model.embed_tokens.weight"]
    assert torch.equal(drafter.embed_tokens.weight, target_emb)  # frozen, copied from the target
    dec = SpeculativeDecoder.from_pretrained(first_run, peaky_pair.target, device="cpu")
    prompts = [[3, 14, 15], [92, 65, 35, 89]]
    spec = dec.generate(prompts, max_new_tokens=12, eos_token_id=[])
    base = dec.generate(prompts, max_new_tokens=12, eos_token_id=[], draft=False)
    assert spec.tokens == base.tokens


@pytest.mark.slow
def test_loss_falls(peaky_pair, tmp_path):
    out = distill(peaky_pair.target, tmp_path / "long", shape=SHAPE, settings=settings(steps=60, lr=3e-3),
                  progress=False)
    history = json.loads((out / "distill.json").read_text())["history"]
    first = sum(h["ce"] for h in history[:5]) / 5
    last = sum(h["ce"] for h in history[-5:]) / 5
    assert last < 0.8 * first


def test_reduced_draft_vocabulary_keeps_the_most_frequent_tokens(peaky_pair, tmp_path):
    from dspark_trt.loader import load_drafter

    out = distill(peaky_pair.target, tmp_path / "reduced", shape=DrafterShape(markov_rank=8, block_size=4,
                  draft_vocab_size=300), settings=settings(steps=2), progress=False)
    drafter = load_drafter(out, target_dir=peaky_pair.target)
    ids = torch.arange(300) + drafter.d2t  # draft id → target id
    assert drafter.config.draft_vocab_size == 300 and bool((ids[1:] > ids[:-1]).all())
    assert drafter.config.mask_token_id in ids.tolist()  # kept so that it maps (it is never proposed in practice)
    target_head = load_file(str(peaky_pair.target / "model.safetensors"))["lm_head.weight"]
    assert torch.equal(drafter.lm_head.weight, target_head[ids])


def test_cli_refuses_minutes_and_steps_together(peaky_pair, tmp_path, capsys):
    from dspark_trt.cli.main import main

    code = main(["distill", "--target", str(peaky_pair.target), "-o", str(tmp_path / "x"), "--steps", "3",
                 "--minutes", "1"])
    assert code == 1 and "not both" in capsys.readouterr().err
    code = main(["distill", "--target", str(tmp_path), "-o", str(tmp_path / "x")])
    assert code == 1 and "no config.json" in capsys.readouterr().err


def test_anchors_lie_in_the_written_text():
    from dspark_trt.training.distill import sample_anchors

    lengths = torch.tensor([30, 12, 9, 40])
    starts = torch.tensor([20, 11, 0, 5])  # row 1 has no room after its prompt (11 > 12 - 4)
    rows, p = sample_anchors(lengths, starts, 4, 64, 8, torch.Generator().manual_seed(0))
    assert set(rows.tolist()) == {0, 2, 3}
    lo = starts.clamp_min(1)[rows].view(-1, 1)
    hi = (lengths[rows] - 4).view(-1, 1)
    assert bool(((p >= lo) & (p <= hi)).all())
    assert set(p[rows == 2].flatten().tolist()) == set(range(1, 6))  # the whole range is drawn
    with pytest.raises(DSparkTrtError, match="--new-tokens"):
        sample_anchors(torch.tensor([5]), torch.tensor([4]), 4, 2, 2, torch.Generator())


def test_init_from_starts_from_the_drafter_and_keeps_its_draft_vocabulary(peaky_pair, tmp_path):
    from dspark_trt.config import DSparkConfig
    from dspark_trt.training.drafter_init import shape_of

    reduced = DrafterShape(markov_rank=8, block_size=4, draft_vocab_size=300)
    first = distill(peaky_pair.target, tmp_path / "first", shape=reduced, settings=settings(steps=3), progress=False)
    shape = shape_of(DSparkConfig.from_pretrained(first))
    # other text (seed 5) would choose another draft vocabulary and other starting weights ...
    fresh = distill(peaky_pair.target, tmp_path / "fresh", shape=shape, settings=settings(steps=0, seed=5),
                    progress=False)
    a, f = weights(first), weights(fresh)
    assert not torch.equal(a["d2t"], f["d2t"]) and not torch.equal(a["fc.weight"], f["fc.weight"])
    # ... but --init-from keeps the drafter's: with 0 steps the result is the drafter itself
    warm = distill(peaky_pair.target, tmp_path / "warm", shape=shape,
                   settings=settings(steps=0, seed=5, init_from=str(first)), progress=False)
    w = weights(warm)
    assert a.keys() == w.keys() and all(torch.equal(a[k], w[k]) for k in a)
    trained = distill(peaky_pair.target, tmp_path / "trained", shape=shape,
                      settings=settings(steps=2, seed=5, init_from=str(first)), progress=False)
    t = weights(trained)
    assert torch.equal(t["d2t"], a["d2t"]) and not torch.equal(t["fc.weight"], a["fc.weight"])


def test_init_from_with_another_shape_is_refused(peaky_pair, first_run, tmp_path, capsys):
    from dspark_trt.cli.main import main

    with pytest.raises(DSparkTrtError, match=r"markov_rank 8≠16"):
        distill(peaky_pair.target, tmp_path / "x", shape=DrafterShape(markov_rank=16, block_size=4),
                settings=settings(init_from=str(first_run)), progress=False)
    assert not (tmp_path / "x").exists()
    base = ["distill", "--target", str(peaky_pair.target), "-o", str(tmp_path / "y"), "--steps", "1"]
    code = main(base + ["--init-from", str(first_run), "--layers", "2"])
    err = capsys.readouterr().err
    assert code == 1 and "drop --layers" in err and "Traceback" not in err
    code = main(base + ["--init-from", str(tmp_path)])
    assert code == 1 and "config.json" in capsys.readouterr().err
    code = main(base + ["--position-decay", "0"])
    assert code == 1 and "--position-decay" in capsys.readouterr().err
    assert not (tmp_path / "y").exists()
    assert main(base + ["--position-decay", "2", "--threads", "1"]) == 0  # reaches the settings
    assert json.loads((tmp_path / "y" / "distill.json").read_text())["key"]["settings"]["position_decay"] == 2.0



def test_a_context_window_wider_than_the_text_trains_like_full_attention(peaky_pair, first_run, tmp_path):
    """The recipe's window (256 rows by default) is wider than every training context here (≤ 22 tokens), so
    the weights equal full attention's; a window of 2 rows changes them. The config says which is which, and
    ``shape_of`` reads the window back (``--init-from`` keeps it)."""
    from dataclasses import replace

    from dspark_trt.config import DSparkConfig
    from dspark_trt.training.drafter_init import shape_of

    full = distill(peaky_pair.target, tmp_path / "full", shape=replace(SHAPE, context_window=None),
                   settings=settings(), progress=False)
    narrow = distill(peaky_pair.target, tmp_path / "narrow", shape=replace(SHAPE, context_window=2),
                     settings=settings(), progress=False)
    a, f, n = weights(first_run), weights(full), weights(narrow)
    assert a.keys() == f.keys() and all(torch.equal(a[k], f[k]) for k in a)
    assert not torch.equal(a["fc.weight"], n["fc.weight"])
    windowed, whole = DSparkConfig.from_pretrained(first_run), DSparkConfig.from_pretrained(full)
    assert all(windowed.layer_attention(i) == (256, False) for i in range(windowed.num_hidden_layers))
    assert whole.bidirectional_full_attention and not windowed.bidirectional_full_attention
    assert shape_of(windowed).context_window == 256 and shape_of(whole).context_window is None
    assert shape_of(DSparkConfig.from_pretrained(narrow)).context_window == 2


def test_shape_of_refuses_a_pattern_the_recipe_does_not_train(tiny_causal_pair):
    from dspark_trt.config import DSparkConfig
    from dspark_trt.training.drafter_init import shape_of

    with pytest.raises(DSparkTrtError, match="not the recipe's pattern"):
        shape_of(DSparkConfig.from_pretrained(tiny_causal_pair.drafter))


def test_cli_context_window(peaky_pair, tmp_path, capsys):
    """--context-window 0 = the whole context, W = W rows, a negative W is refused in one line."""
    import argparse

    from dspark_trt.cli import distill as cli
    from dspark_trt.cli.main import main

    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    base = ["--target", str(peaky_pair.target), "-o", str(tmp_path / "x")]
    assert cli._shape(p.parse_args(base)).context_window == 256
    assert cli._shape(p.parse_args(base + ["--context-window", "0"])).context_window is None
    assert cli._shape(p.parse_args(base + ["--context-window", "64"])).context_window == 64
    code = main(["distill"] + base + ["--context-window", "-3"])
    err = capsys.readouterr().err
    assert code == 1 and "--context-window -3" in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()


def test_trained_prompts_are_the_prompts_the_target_continued(peaky_pair, tmp_path, monkeypatch):
    data_module = importlib.import_module("dspark_trt.training.data")
    seen = []
    real = data_module.write_rows

    def spy(model, jobs, **kw):
        seen.append(list(jobs))
        return real(model, jobs, **kw)

    monkeypatch.setattr(data_module, "write_rows", spy)
    out = distill(peaky_pair.target, tmp_path / "d", shape=SHAPE, settings=settings(steps=2, seed=3), progress=False)
    prompts = distill_module.trained_prompts(out, peaky_pair.target)
    assert len(seen) == 1 and len(prompts) == 6
    assert prompts == [list(j.prompt) for j in seen[0][:6]]  # the training jobs, then the validation ones
    assert all(j.greedy for j in seen[0][6:]) and not {j.prompt for j in seen[0][6:]} & {tuple(p) for p in prompts}
    assert json.loads((out / "distill.json").read_text())["prompts_digest"]

    summary = json.loads((out / "distill.json").read_text())
    summary["key"]["settings"]["seed"] = 4  # the rebuild no longer gives the prompts it trained on
    (out / "distill.json").write_text(json.dumps(summary))
    with pytest.raises(DSparkTrtError, match="cannot be rebuilt"):
        distill_module.trained_prompts(out, peaky_pair.target)
    (out / "distill.json").unlink()
    assert distill_module.trained_prompts(out, peaky_pair.target) is None  # not a distilled drafter


@pytest.mark.parametrize("head", ["gated", "rnn"])
def test_gated_and_rnn_heads_train_load_and_draft(peaky_pair, tmp_path, head):
    from dspark_trt.loader import load_drafter
    from dspark_trt.runtime import SpeculativeDecoder

    shape = DrafterShape(markov_rank=8, block_size=4, markov_head_type=head)
    out = distill(peaky_pair.target, tmp_path / head, shape=shape, settings=settings(steps=24, lr=3e-3),
                  progress=False)
    history = json.loads((out / "distill.json").read_text())["history"]
    first, last = (sum(h["ce"] for h in part) for part in (history[:4], history[-4:]))
    assert last < 0.9 * first, (first, last)
    drafter = load_drafter(out, target_dir=peaky_pair.target)
    assert drafter.config.markov_head_type == head
    d, proj = drafter.config.hidden_size, drafter.markov_head.projection.weight
    hidden_part = proj[:, :d] if head == "gated" else proj[:, -d:]  # gated reads [h ; e], rnn [s ; e ; h]
    assert hidden_part.abs().max() > 0  # started at 0 (drafter_init), trained
    dec = SpeculativeDecoder.from_pretrained(out, peaky_pair.target, device="cpu")
    prompts = [[3, 14, 15], [92, 65, 35, 89]]
    spec = dec.generate(prompts, max_new_tokens=10, eos_token_id=[])
    assert spec.tokens == dec.generate(prompts, max_new_tokens=10, eos_token_id=[], draft=False).tokens


def test_cli_markov_head_type(peaky_pair, tmp_path, capsys):
    from dspark_trt.cli.main import main
    from dspark_trt.config import DSparkConfig

    out = tmp_path / "gated"
    assert main(["distill", "--target", str(peaky_pair.target), "-o", str(out), "--steps", "1", "--markov-rank", "8",
                 "--block-size", "4", "--markov-head-type", "gated", "--new-tokens", "12", "--val-prompts", "0"]) == 0
    assert DSparkConfig.from_pretrained(out).markov_head_type == "gated"
    assert main(["distill", "--target", str(peaky_pair.target), "-o", str(tmp_path / "x"), "--init-from", str(out),
                 "--markov-head-type", "rnn"]) != 0
    assert "--markov-head-type with --init-from" in capsys.readouterr().err
