"""The text store: written once per key and row, appended to for a larger budget, corruption detected."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from dspark_trt.training import DistillSettings, DrafterShape, distill
from dspark_trt.training.data import Job
from dspark_trt.training.store import TextStore, row_key

pytestmark = pytest.mark.usefixtures("one_thread")

SHAPE = DrafterShape(markov_rank=8, block_size=4)


def settings(**kw) -> DistillSettings:
    base = dict(steps=1, new_tokens=12, random_prompts=6, batch=3, anchors=4, threads=1, val_prompts=3, val_every=0,
                data_batch=4)
    return DistillSettings(**{**base, **kw})


def summary(out) -> dict:
    return json.loads((out / "distill.json").read_text())


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from dspark_trt.synthetic import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("store") / "pair", seed=0, target_init_std=0.2)


def entry_bytes(store_dir) -> dict:
    return {p.name: p.read_bytes() for p in sorted((store_dir / "entries").iterdir())}


def test_same_key_writes_nothing_and_a_larger_budget_appends(pair, tmp_path):
    data = tmp_path / "text"
    a = distill(pair.target, tmp_path / "a", shape=SHAPE, settings=settings(data_dir=str(data)), progress=False)
    first = summary(a)["data"]
    assert first["rows_written"] == 9 and first["sequences"] == 6 and first["validation_sequences"] == 3
    assert first["tokens"] == summary(a)["tokens"] > 6 * 6
    store_dir = data / first["key"]
    before = entry_bytes(store_dir)
    b = distill(pair.target, tmp_path / "b", shape=SHAPE, settings=settings(data_dir=str(data), steps=2),
                progress=False)
    again = summary(b)["data"]
    assert again["rows_written"] == 0 and again["entries_written"] == [] and again["entries"] == first["entries"]
    assert entry_bytes(store_dir) == before
    warm = distill(pair.target, tmp_path / "warm", shape=SHAPE,
                   settings=settings(data_dir=str(data), init_from=str(a)), progress=False)
    assert summary(warm)["data"]["rows_written"] == 0  # --init-from runs reuse the text
    more = distill(pair.target, tmp_path / "more", shape=SHAPE, settings=settings(data_dir=str(data), random_prompts=9),
                   progress=False)
    grown = summary(more)["data"]
    assert grown["rows_written"] == 3 and grown["sequences"] == 9  # the 6 first prompts are the same: held
    after = entry_bytes(store_dir)
    assert {k: after[k] for k in before} == before and len(after) == len(before) + 2  # appended, never rewritten


def test_the_default_store_lies_beside_the_drafter(pair, tmp_path):
    out = distill(pair.target, tmp_path / "d", shape=SHAPE, settings=settings(), progress=False)
    assert (tmp_path / "dspark-text" / summary(out)["data"]["key"] / "store.json").is_file()


def test_the_key_changes_with_what_changes_the_text(pair, tmp_path):
    data = tmp_path / "text"
    base = summary(distill(pair.target, tmp_path / "a", shape=SHAPE, settings=settings(data_dir=str(data)),
                           progress=False))["data"]
    for i, change in enumerate([{"temperature": 0.9}, {"top_k": 5}, {"top_p": 0.95}, {"new_tokens": 10}]):
        other = summary(distill(pair.target, tmp_path / f"o{i}", shape=SHAPE,
                                settings=settings(data_dir=str(data), **change), progress=False))["data"]
        assert other["key"] != base["key"] and other["rows_written"] == 9, change
    # the greedy share changes which rows are asked for, not the key: greedy rows already held are reused
    share = summary(distill(pair.target, tmp_path / "g", shape=SHAPE,
                            settings=settings(data_dir=str(data), greedy_share=1.0), progress=False))["data"]
    assert share["key"] == base["key"] and share["rows_written"] == 3  # the 3 sampled rows of the 6 become greedy
    # the target's identity is its weights: another target, another key
    key = dict(target={"weights": "a"}, taps=[1], top=4, new_tokens=8, sampling={}, eos=[], avoid=[])
    assert TextStore(data, key).name != TextStore(data, {**key, "target": {"weights": "b"}}).name
    assert row_key(Job((1, 2), False, 3)) != row_key(Job((1, 2), False, 4)) != row_key(Job((1, 2), True))


def test_a_corrupted_or_partial_entry_is_detected_and_written_again(pair, tmp_path, caplog):
    data = tmp_path / "text"
    a = distill(pair.target, tmp_path / "a", shape=SHAPE, settings=settings(data_dir=str(data)), progress=False)
    store_dir = data / summary(a)["data"]["key"]
    entries = sorted((store_dir / "entries").glob("*.pt"))
    assert len(entries) == 3  # 9 rows, 4 per batch
    blob = bytearray(entries[0].read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    entries[0].write_bytes(bytes(blob))  # a flipped byte
    entries[1].with_suffix(".json").unlink()  # a partial write: rows without their sidecar
    with caplog.at_level(logging.WARNING, logger="dspark"):
        b = distill(pair.target, tmp_path / "b", shape=SHAPE, settings=settings(data_dir=str(data)), progress=False)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and {"digest mismatch" in w for w in warnings} == {True, False}
    assert any("000001" in w and "partial" in w for w in warnings)
    assert all("\n" not in w for w in warnings)
    assert summary(b)["data"]["rows_written"] == 8  # the two entries' rows, written again
    from safetensors.torch import load_file

    x, y = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert all(torch.equal(x[k], y[k]) for k in x)  # the same text again, the same drafter
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dspark"):
        c = distill(pair.target, tmp_path / "c", shape=SHAPE, settings=settings(data_dir=str(data)), progress=False)
    assert summary(c)["data"]["rows_written"] == 0 and not caplog.records  # healed
