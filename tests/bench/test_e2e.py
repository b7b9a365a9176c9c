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
    code = main(["bench", "e2e", "--drafter", str(distilled_pair.drafter), "--target", str(distilled_pair.target),
                 "--input-ids", "1 2 3", "--max-new-tokens", "8", "--repeats", "1"])
    out = capsys.readouterr().out
    assert code == 0 and "speculative" in out and "target only" in out and "speedup" in out
