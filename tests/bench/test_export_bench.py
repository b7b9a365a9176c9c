"""``dspark bench export``: a measured export of the tiny pair reports its phases, memory and bytes."""

from __future__ import annotations

import json

from dspark_trt.bench.export import PHASE, table, tree_rss
from dspark_trt.cli.main import main


def test_phase_lines_parse():
    m = PHASE.search("[I] [2/5] write ONNX weights ...")
    assert m and m.group(3) == "write ONNX weights" and m.group(4) == "..."
    assert PHASE.search("[I] [2/5] write ONNX weights done in 3.2s").group(4).startswith("done")
    m = PHASE.search("[I] [2/5] write ONNX weights done in 3.2s (peak resident memory so far 1.25 GB)")
    assert m.group(3) == "write ONNX weights" and m.group(4) == "done in 3.2s"


def test_tree_rss_counts_this_process():
    import os

    anon, file = tree_rss(os.getpid())
    assert anon > 10 << 20 and file > 0


def test_bench_export_tiny(tiny_pair, tmp_path, capsys):
    rc = main(["bench", "export", "-o", str(tmp_path / "out"), str(tiny_pair.drafter), "--target",
               str(tiny_pair.target), "--skip-target", "--topk", "off", "--dtype", "fp32", "--engine", "none"])
    assert rc == 0
    report = json.loads((tmp_path / "out" / "export.json").read_text())
    names = [p["name"] for p in report["phases"]]
    assert names[:4] == ["start-up", "trace ONNX graphs", "write ONNX weights", "validate ONNX"], names
    assert report["checkpoint_bytes"] == (tiny_pair.drafter / "model.safetensors").stat().st_size
    assert report["bytes_written"] > 0.5 * report["checkpoint_bytes"]  # fp32 graphs hold the weights once or more
    assert 0 < report["peak_rss"] < 4e9 and report["ru_maxrss"] > 0
    assert all(p["seconds"] >= 0 for p in report["phases"])
    assert "| write ONNX weights |" in (tmp_path / "out" / "export.md").read_text() == table(report) + "\n"
    assert "peak RSS" in capsys.readouterr().out
    titles = report["validation"]  # what was validated, read from the export's manifest before it is removed
    assert len(titles) == 1 and titles[0].startswith("validation") and "the full graphs" in titles[0], titles
    assert f"- {titles[0]}" in table(report)
