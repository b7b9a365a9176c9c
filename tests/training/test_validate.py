"""Validation while training: the simulated acceptance equals the reference's rounds, the held-out split is
disjoint from the training prompts, and the checkpoint written is the best validation step's."""

from __future__ import annotations

import importlib
import json

import pytest
import torch
from safetensors.torch import load_file

from dspark_trt.training import DistillSettings, DrafterShape, distill

pytestmark = pytest.mark.usefixtures("one_thread")

SHAPE = DrafterShape(markov_rank=8, block_size=4)


def settings(**kw) -> DistillSettings:
    base = dict(steps=6, new_tokens=16, random_prompts=6, batch=3, anchors=4, threads=1, val_prompts=4, val_every=2,
                val_anchors=4, data_batch=16)
    return DistillSettings(**{**base, **kw})


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from dspark_trt.synthetic import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("val") / "pair", seed=0, target_init_std=0.2)


def test_simulated_acceptance_equals_the_reference_rounds(distilled_pair):
    """Each validation round equals a real greedy round: the reference drafter's ``draft`` (its own Markov walk,
    dense) from the context before the anchor, verified against the target's greedy text."""
    from transformers import AutoModelForCausalLM

    from dspark_trt.config import hf_hidden_state_indices
    from dspark_trt.loader import load_drafter
    from dspark_trt.training.data import Job, stack_rows, write_rows
    from dspark_trt.training.validate import greedy_acceptance, validation_anchors

    drafter = load_drafter(distilled_pair.drafter, target_dir=distilled_pair.target).to(torch.float32).eval()
    c = drafter.config
    target = AutoModelForCausalLM.from_pretrained(distilled_pair.target, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, c.vocab_size - 1, (5, 4), generator=gen).tolist()
    rows = write_rows(target, [Job(tuple(p), True) for p in prompts], new_tokens=24,
                      hf_indices=hf_hidden_state_indices(c.target_layer_ids), top=4, batch=5)
    data = stack_rows(rows)
    t2d = torch.arange(c.vocab_size)
    N = c.num_draft_tokens
    got = greedy_acceptance(drafter, data, t2d, anchors=5, chunk=2)
    seq, anchors = validation_anchors(data["lengths"], data["starts"], N, 5)
    accepted = []
    with torch.no_grad():
        for r, ps in zip(seq.tolist(), anchors.tolist()):
            for p in ps:
                k, v = drafter.context_kv(data["taps"][r: r + 1, :p].float(), torch.arange(p).view(1, p))
                walk = drafter.draft(data["ids"][r, p].view(1), k, v, torch.tensor([p]))
                label = data["ids"][r, p + 1: p + 1 + N]  # the target's greedy text
                if len(label) < N:  # the last token written has no features; its label is the top-1 there
                    label = torch.cat((label, data["top_ids"][r, p + len(label): p + N, 0]))
                accepted.append(int((walk.tokens[0] == label).to(torch.int64).cumprod(0).sum()))
    assert got["rounds"] == len(accepted) == 25
    assert got["acceptance_length"] == pytest.approx(1 + sum(accepted) / len(accepted), abs=1e-9)
    assert 1.3 < got["acceptance_length"]  # a distilled drafter: rounds are really accepted
    per_slot = [sum(a > j for a in accepted) / len(accepted) for j in range(N)]
    assert got["slots"] == pytest.approx(per_slot, abs=1e-4)


def test_validation_prompts_are_held_out(pair):
    from dspark_trt.training.distill import training_prompts, validation_prompts
    from dspark_trt.training.prompt_bank import (CODE_TASKS, SUBJECTS, VALIDATION_SUBJECTS, VALIDATION_TASKS,
                                                 prompt_bank, validation_bank)
    from dspark_trt.training.prompts import HELDOUT_PROMPTS, TRAIN_PROMPTS

    val = validation_bank(10**6)
    train = prompt_bank(10**6, holdout=True)
    assert len(val) > 200 and len(train) > 9000
    assert not {t for _, t in val} & ({t for _, t in train} | {t for _, t in TRAIN_PROMPTS} | {t for _, t in HELDOUT_PROMPTS})
    for _, text in train:  # not even the subject: split by prompt and subject, never by token
        assert not any(s in text for s in VALIDATION_SUBJECTS) and not any(t in text for t, _ in VALIDATION_TASKS), text
    assert any(s in t for s in VALIDATION_SUBJECTS for _, t in val) and set(VALIDATION_SUBJECTS) < set(SUBJECTS)
    assert set(VALIDATION_TASKS) < set(CODE_TASKS)
    # a larger budget appends: the first prompts of a larger bank are a smaller bank
    assert prompt_bank(3000, holdout=True)[:500] == prompt_bank(500, holdout=True)
    # random prompts (a target without a tokenizer): other prompts than the training ones
    s = settings(random_prompts=40, val_prompts=40)
    tr = training_prompts(None, s, 50, 49)
    assert not {tuple(p) for p in validation_prompts(None, s, 50, 49, tr)} & {tuple(p) for p in tr}


def test_the_written_weights_are_the_best_validation_steps(pair, tmp_path, monkeypatch):
    validate_module = importlib.import_module("dspark_trt.training.validate")
    real = validate_module.greedy_acceptance
    out = distill(pair.target, tmp_path / "real", shape=SHAPE, settings=settings(), progress=False)
    summary = json.loads((out / "distill.json").read_text())
    v = summary["validation"]
    assert [p["step"] for p in v["curve"]] == [0, 2, 4, 6] and v["sequences"] == 4
    values = [p["acceptance_length"] for p in v["curve"]]
    assert v["best_acceptance_length"] == max(values) and v["best_step"] == v["curve"][values.index(max(values))]["step"]
    assert (out / "validation.png").is_file() or importlib.util.find_spec("matplotlib") is None

    # a curve that peaks in the middle: the step-2 weights are written, not the last
    designed = iter([1.1, 1.6, 1.3, 1.2])
    states = []

    def spy(drafter, data, t2d, **kw):
        states.append({k: t.detach().clone() for k, t in drafter.state_dict().items()})
        return {**real(drafter, data, t2d, **kw), "acceptance_length": next(designed)}

    monkeypatch.setattr(validate_module, "greedy_acceptance", spy)
    best = distill(pair.target, tmp_path / "best", shape=SHAPE, settings=settings(), progress=False)
    v = json.loads((best / "distill.json").read_text())["validation"]
    assert v["best_step"] == 2 and v["best_acceptance_length"] == 1.6
    written = load_file(str(best / "model.safetensors"))
    assert all(torch.equal(written[k], states[1][k]) for k in written)
    assert not torch.equal(written["fc.weight"], states[3]["fc.weight"])  # the last step's weights were others


@pytest.mark.slow
def test_a_resumed_run_keeps_its_curve_and_best_weights(pair, tmp_path, monkeypatch):
    distill_module = importlib.import_module("dspark_trt.training.distill")
    whole = distill(pair.target, tmp_path / "whole", shape=SHAPE, settings=settings(), progress=False)
    real_step = distill_module.distill_step

    def failing_step(drafter, data, t2d, step, s):
        if step == 5:
            raise KeyboardInterrupt
        return real_step(drafter, data, t2d, step, s)

    monkeypatch.setattr(distill_module, "distill_step", failing_step)
    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        distill(pair.target, out, shape=SHAPE, settings=settings(checkpoint_every_s=0.0), progress=False)
    monkeypatch.setattr(distill_module, "distill_step", real_step)
    distill(pair.target, out, shape=SHAPE, settings=settings(checkpoint_every_s=0.0), progress=False)
    a, b = (json.loads((d / "distill.json").read_text())["validation"] for d in (whole, out))
    assert a["curve"] == b["curve"] and a["best_step"] == b["best_step"]
    x, y = load_file(str(whole / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert all(torch.equal(x[k], y[k]) for k in x)
