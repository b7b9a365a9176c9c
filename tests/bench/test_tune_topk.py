"""``dspark tune-topk``: the (k, M) sweep, the modelled tokens/s, the recommendation and --write."""

from __future__ import annotations

import json
import shutil

import pytest

from dspark_trt.bench.tune_topk import load_prompts, recommend
from dspark_trt.cli.main import main
from tests.runtime.runtime_helpers import random_prompts

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def setup(distilled_pair, tmp_path):
    drafter = tmp_path / "drafter"
    shutil.copytree(distilled_pair.drafter, drafter)
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(random_prompts(3, 256, seed=4, min_len=3, max_len=8)))
    return drafter, distilled_pair.target, prompts


def test_sweep_rows_model_and_recommend(setup, tmp_path, capsys):
    drafter, target, prompts = setup
    plot = tmp_path / "tune.png"
    argv = ["tune-topk", str(drafter), "--target", str(target), "--prompts", str(prompts), "--topk", "1,4",
            "--markov-topm", "0,8", "--max-new-tokens", "12", "--json", "--plot", str(plot)]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    rows, best = out["rows"], out["recommended"]
    assert [(r["topk"], r["markov_topm"]) for r in rows] == [(1, 0), (1, 8), (4, 0), (4, 8)]
    t_v = rows[0]["verify_ms_model"]
    for r in rows:
        assert r["acceptance_length"] >= 1 and r["draft_ms"] > 0 and r["verify_ms"] > 0
        assert r["modelled_tokens_per_second"] == pytest.approx(
            1e3 * r["acceptance_length"] / (r["draft_ms"] + t_v), rel=1e-3)
    assert best == recommend(rows)
    assert best["modelled_tokens_per_second"] == max(r["modelled_tokens_per_second"] for r in rows)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # at k = 1 the union can only add candidates: acceptance does not drop (greedy, the same prompts)
    assert rows[1]["acceptance_length"] >= rows[0]["acceptance_length"] - 1e-9


def test_write_records_the_default_and_the_decoder_uses_it(setup, capsys):
    from dspark_trt.runtime import SpeculativeDecoder

    drafter, target, prompts = setup
    before = json.loads((drafter / "config.json").read_text())
    argv = ["tune-topk", str(drafter), "--target", str(target), "--prompts", str(prompts), "--topk", "2",
            "--markov-topm", "4", "--max-new-tokens", "6", "--write"]
    assert main(argv) == 0
    assert "recommended: --topk 2 --markov-topm 4" in capsys.readouterr().out
    after = json.loads((drafter / "config.json").read_text())
    assert after["draft_topk"] == 2 and after["draft_markov_topm"] == 4
    assert after["dspark_tune_topk"]["previous"] == {"draft_topk": before.get("draft_topk"),
                                                     "draft_markov_topm": before.get("draft_markov_topm")}
    assert {k: v for k, v in after.items() if k not in ("draft_topk", "draft_markov_topm", "dspark_tune_topk")} \
        == {k: v for k, v in before.items() if k not in ("draft_topk", "draft_markov_topm")}
    dec = SpeculativeDecoder.from_pretrained(drafter, target, device="cpu", dtype="fp32")
    assert dec.default_topk == 2 and dec.config.draft_markov_topm == 4
    p = [[5, 6, 7]]
    assert dec.generate(p, 8).tokens == dec.generate(p, 8, topk=2, markov_topm=4).tokens


def test_prompt_files(tmp_path):
    lines = tmp_path / "p.txt"
    lines.write_text("hello there\n\nsecond prompt\n")
    assert load_prompts(lines) == ["hello there", "second prompt"]
    held = tmp_path / "h.json"
    held.write_text(json.dumps({"heldout": [{"kind": "chat", "text": "a", "input_ids": [1, 2]}, {"text": "b"}]}))
    assert load_prompts(held) == [[1, 2], "b"]


@pytest.mark.parametrize("extra, message", [
    (["--prompts", "missing.json"], "--prompts missing.json: no such file"),
    (["--topk", "0"], "must be in [1, 257]"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
])
def test_bad_input_is_one_line(setup, capsys, extra, message):
    drafter, target, prompts = setup
    argv = ["tune-topk", str(drafter), "--target", str(target), "--prompts", str(prompts), *extra]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.fixture(scope="module", params=["gated", "rnn"])
def head_pair(request, tmp_path_factory):
    from dspark_trt.synthetic import write_tiny_checkpoint

    out = tmp_path_factory.mktemp(request.param)
    ck = write_tiny_checkpoint(out / "pair", seed=5, markov_head_type=request.param, vocab_size=257, markov_rank=8)
    prompts = out / "prompts.json"
    prompts.write_text(json.dumps(random_prompts(2, 257, seed=4, min_len=3, max_len=6)))
    return request.param, ck.drafter, ck.target, prompts


def test_a_gated_or_rnn_drafter_sweeps_top_k_alone(head_pair, capsys):
    """The default grid's union widths are dropped for a gated / RNN head (the union is vanilla-only)."""
    head, drafter, target, prompts = head_pair
    argv = ["tune-topk", str(drafter), "--target", str(target), "--prompts", str(prompts), "--topk", "1,16",
            "--max-new-tokens", "6", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(r["topk"], r["markov_topm"]) for r in out["rows"]] == [(1, 0), (16, 0)]
    assert out["recommended"]["markov_topm"] == 0 and all(r["acceptance_length"] >= 1 for r in out["rows"])
    assert main([*argv[:-1], "--markov-topm", "0"]) == 0  # M = 0 asked for explicitly is fine too
    assert "recommended: --topk" in capsys.readouterr().out


def test_a_union_width_for_a_gated_or_rnn_drafter_is_refused_with_the_reason(head_pair, capsys):
    head, drafter, target, prompts = head_pair
    argv = ["tune-topk", str(drafter), "--target", str(target), "--prompts", str(prompts), "--topk", "4",
            "--markov-topm", "0,8", "--max-new-tokens", "4"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"--markov-topm 0,8: the candidate union is defined for the vanilla Markov head only, and this drafter's " \
           f"is {head}" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    from dspark_trt.bench.tune_topk import sweep
    from dspark_trt.errors import DSparkTrtError
    from dspark_trt.runtime import SpeculativeDecoder

    decoder = SpeculativeDecoder.from_pretrained(drafter, target, device="cpu", dtype="fp32")
    with pytest.raises(DSparkTrtError, match=f"vanilla Markov head only, and this drafter's is {head}"):
        sweep(decoder, [[5, 6, 7]], (4,), (0, 8))  # the API refuses too, before decoding anything


def test_union_widths():
    from dspark_trt.bench.tune_topk import DEFAULT_TOPMS, union_widths
    from dspark_trt.errors import DSparkTrtError

    assert union_widths("vanilla") == DEFAULT_TOPMS and union_widths("vanilla", (0, 4)) == (0, 4)
    assert union_widths("gated") == (0,) and union_widths("rnn", (0,)) == (0,)
    with pytest.raises(DSparkTrtError, match="vanilla Markov head only"):
        union_widths("rnn", (2,))
