"""``dspark bench e2e`` reports both modes and the acceptance (numbers are reported, never asserted)."""

from __future__ import annotations

import json
import pytest

from dspark_trt.cli.main import main

pytestmark = pytest.mark.usefixtures("one_thread")


def test_e2e_report(distilled_pair, capsys):
    code = main(["bench", "e2e", "--drafter", str(distilled_pair.drafter), "--target", str(distilled_pair.target),
                 "--input-ids", "1 2 3", "--max-new-tokens", "16", "--repeats", "1", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["speculative_tokens_per_second"] > 0 and report["target_only_tokens_per_second"] > 0
    assert report["same_tokens"] is True  # greedy: speculation changed nothing
    assert 1.0 <= report["mean_acceptance_length"] <= report["num_draft_tokens"] + 1
    assert report["prompt_format"] == "ids" and report["enough_rounds"] and report["rounds"] >= 5
    code = main(["bench", "e2e", "--drafter", str(distilled_pair.drafter), "--target", str(distilled_pair.target),
                 "--input-ids", "1 2 3", "--max-new-tokens", "32", "--repeats", "1"])
    out = capsys.readouterr().out
    assert code == 0 and "speculative" in out and "target only" in out and "speedup" in out


def test_a_run_of_too_few_rounds_says_so_instead_of_ratios(distilled_pair, capsys):
    """Two new tokens: the prefill's and one round — nothing a speed-up or an acceptance could be read from."""
    args = ["bench", "e2e", "--drafter", str(distilled_pair.drafter), "--target", str(distilled_pair.target),
            "--input-ids", "1 2 3", "--max-new-tokens", "2", "--repeats", "1"]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["enough_rounds"] is False and report["rounds"] < 5
    assert report["speedup"] is None and report["mean_acceptance_length"] is None
    assert report["speculative_tokens_per_second"] is None
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "too few to measure a speed-up" in out and "speedup" not in out and "tok/s" not in out


def test_paired_runs_alternate_the_modes_batch_by_batch(distilled_pair):
    from dspark_trt.bench.e2e import paired_runs
    from dspark_trt.runtime import SpeculativeDecoder

    dec = SpeculativeDecoder.from_pretrained(distilled_pair.drafter, distilled_pair.target, device="cpu")
    calls, generate = [], dec.generate
    dec.generate = lambda prompts, **kw: calls.append((kw["draft"], kw["seed"])) or generate(prompts, **kw)
    batches = [[[1, 2, 3]], [[4, 5]], [[6, 7, 8], [9, 10]]]
    spec, base = paired_runs(dec, batches, {"max_new_tokens": 6, "temperature": 1.0}, seed=5)
    assert calls == [(True, [5]), (False, [5]), (False, [6]), (True, [6]), (True, [7, 8]), (False, [7, 8])]
    whole = generate([p for b in batches for p in b], max_new_tokens=6, temperature=1.0, seed=[5, 6, 7, 8])
    assert spec.tokens == whole.tokens  # request i keeps seed + i: the batches change nothing (T = 1)
    assert base.stats.rounds > 0 and spec.stats.speculative and not base.stats.speculative
    calls.clear()
    assert paired_runs(dec, batches[:1], {"max_new_tokens": 4}, both=False)[1] is None and calls == [(True, [0])]
