"""``dspark bench report`` and the held-out prompts of a pair (figures are reported, never asserted)."""

from __future__ import annotations

import json
import shutil

import pytest

from dspark_trt.cli.main import main

pytestmark = pytest.mark.usefixtures("one_thread")

HELDOUT = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10, 11], [12, 13, 14]]


@pytest.fixture
def pair_with_prompts(distilled_pair, tmp_path):
    """The distilled tiny pair laid out as ``dspark smollm2`` lays out a pair, with held-out prompts."""
    root = tmp_path / "pair"
    shutil.copytree(distilled_pair.drafter, root / "drafter")
    shutil.copytree(distilled_pair.target, root / "target")
    (root / "prompts.json").write_text(json.dumps({"heldout": [{"kind": "text", "text": "", "input_ids": p}
                                                               for p in HELDOUT]}))
    return root


def test_e2e_uses_the_pairs_heldout_prompts_in_batches(pair_with_prompts, capsys):
    args = ["bench", "e2e", "--drafter", str(pair_with_prompts / "drafter"), "--target", str(pair_with_prompts / "target"),
            "--max-new-tokens", "6", "--repeats", "1", "--json"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["requests"], report["batch_size"]) == (5, 1)  # all held-out prompts, one at a time
    assert report["same_tokens"] is True
    assert main(args + ["--batch-size", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["requests"], report["batch_size"]) == (4, 2)  # whole batches only
    assert main(args + ["--heldout", "3"]) == 0
    assert json.loads(capsys.readouterr().out)["requests"] == 3  # the first 3 held-out prompts
    assert main(args + ["--heldout", "0"]) == 1
    assert "--heldout must be >= 1" in capsys.readouterr().err
    assert main(args + ["--input-ids", "1 2"]) == 0  # given prompts win
    assert json.loads(capsys.readouterr().out)["requests"] == 1


def test_e2e_refuses_a_broken_prompt_file(pair_with_prompts, capsys):
    (pair_with_prompts / "prompts.json").write_text("{}")
    code = main(["bench", "e2e", "--drafter", str(pair_with_prompts / "drafter"), "--target",
                 str(pair_with_prompts / "target"), "--max-new-tokens", "4", "--repeats", "1"])
    assert code == 1 and "held-out prompt file" in capsys.readouterr().err


@pytest.fixture
def pair_with_distill_record(pair_with_prompts):
    """``pair_with_prompts`` whose drafter ``dspark distill`` trained (its distill.json names its prompts)."""
    from dspark_trt.training import DistillSettings, DrafterShape, distill

    shutil.rmtree(pair_with_prompts / "drafter")
    distill(pair_with_prompts / "target", pair_with_prompts / "drafter", shape=DrafterShape(markov_rank=8, block_size=4),
            settings=DistillSettings(steps=20, new_tokens=16, random_prompts=6, batch=3, anchors=4, threads=1),
            progress=False)
    return pair_with_prompts


@pytest.mark.parametrize("option, value, words", [("--sweep", "8,x", "--sweep"), ("--verify-sweep", "1,two", "--verify-sweep"),
                                                  ("--batches", "1,0", "must be > 0"), ("--temperatures", "0,hot", "hot"),
                                                  ("--skip", "sweep,plots", "unknown part")])
def test_report_refuses_bad_lists_in_one_line(pair_with_prompts, tmp_path, capsys, option, value, words):
    code = main(["bench", "report", str(pair_with_prompts), "-o", str(tmp_path / "b"), option, value])
    err = capsys.readouterr().err
    assert code == 1 and words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "b").exists()  # refused before anything ran or was written


@pytest.mark.slow
def test_report_writes_json_tables_and_plots(pair_with_distill_record, tmp_path, capsys):
    pair_with_prompts = pair_with_distill_record
    out = tmp_path / "bench"
    code = main(["bench", "report", str(pair_with_prompts), "-o", str(out), "--max-new-tokens", "6", "--prompts", "4",
                 "--sweep", "8,64,dense"])
    assert code == 0
    r = json.loads((out / "benchmarks.json").read_text())
    assert r["pair"] == ".../pair"  # the pair under /tmp: never a machine's absolute path
    assert [(m["temperature"], m["batch"]) for m in r["matrix"]] == [(0.0, 1), (0.0, 4), (1.0, 1), (1.0, 4)]
    assert all(m["same_tokens"] for m in r["matrix"] if m["temperature"] == 0)  # greedy: lossless
    assert [s["topk"] for s in r["sweep"]] == [8, 64, None]
    dropped = [s["dropped_mass"]["mean"] for s in r["sweep"]]
    assert dropped[0] >= dropped[1] >= dropped[2] and dropped[2] < 1e-6  # fewer candidates drop more; dense none
    assert all(s["same_tokens_as_first"] for s in r["sweep"])  # greedy output never depends on k
    N = r["num_draft_tokens"]
    caps = sorted({1, 2, 3, N}) + ["auto"]
    assert [(v["path"], v["verify_drafts"]) for v in r["verify_sweep"]] == [("torch", c) for c in caps]
    assert all(v["same_tokens"] for v in r["verify_sweep"])  # greedy: the cap never changes the output
    assert [v["per_position_acceptance"][v["verify_drafts"]:] == [0.0] * (N - v["verify_drafts"])
            for v in r["verify_sweep"] if v["verify_drafts"] != "auto"] == [True] * 4  # later slots never verified
    assert [(v["path"], v["verify_drafts"]) for v in r["seen"]] == [("torch", c) for c in caps]
    assert all(v["same_tokens"] for v in r["seen"])  # the drafter's training prompts, decoded losslessly too
    assert sorted(int(n) for n in r["verify_cost"]) == list(range(1, r["num_draft_tokens"] + 2))
    assert all(sec > 0 for sec in r["verify_cost"].values())
    for png in ("acceptance_vs_topk.png", "tokens_per_second_vs_topk.png", "per_position_acceptance.png",
                "speedup.png", "verify_cost.png", "speedup_vs_acceptance.png"):
        assert (out / png).stat().st_size > 1000
    tables = (out / "tables.md").read_text()
    assert "| dense |" in tables and "speed-up" in tables and "| tokens verified |" in tables
    assert "| drafts verified per round |" in tables and "trained on" in tables


def test_report_paths_are_portable(tmp_path, monkeypatch):
    from pathlib import Path

    from dspark_trt.bench.report import portable_path

    monkeypatch.chdir(tmp_path)
    assert portable_path("out/smollm2") == "out/smollm2"  # as given
    assert portable_path(tmp_path / "out" / "pair") == "out/pair"  # under the working directory
    assert portable_path(Path.home() / "pairs" / "sm") == "~/pairs/sm"  # the home directory (not below tmp_path)
    assert portable_path("/somewhere/else/sm3") == ".../sm3"


def test_the_shipped_benchmark_record_holds_no_absolute_path():
    from pathlib import Path

    import dspark_trt

    record = Path(dspark_trt.__file__).resolve().parents[1] / "docs" / "benchmarks" / "benchmarks.json"
    text = json.loads(record.read_text())
    from tests.test_standalone import MACHINE_PATH

    assert not Path(text["pair"]).is_absolute() and not MACHINE_PATH.search(record.read_text())
