"""`dspark tiny-checkpoint` and the CLI's error contract (one line, exit 1; usage exit 2)."""

from __future__ import annotations

import subprocess
import sys

from dspark_trt.cli.main import main


def test_writes_a_pair_that_loads(tmp_path, capsys):
    from dspark_trt import load_drafter

    assert main(["tiny-checkpoint", str(tmp_path / "p"), "--vocab-size", "300", "--hidden-size", "32",
                 "--markov-rank", "8", "--format", "speculators", "--bonus-anchor"]) == 0
    assert "drafter:" in capsys.readouterr().out
    config = load_drafter(tmp_path / "p" / "drafter", target_dir=tmp_path / "p" / "target").config
    assert (config.vocab_size, config.markov_rank, config.sample_from_anchor) == (300, 8, False)


def test_user_errors_are_one_line_exit_1_without_traceback(tmp_path):
    out = tmp_path / "p"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    proc = subprocess.run([sys.executable, "-m", "dspark_trt.cli.main", "tiny-checkpoint", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [f"error: output directory {out} is not empty; pass --force to "
                                                f"replace it (or choose another)"]
    assert (out / "keep.txt").read_text() == "mine"


def test_usage_errors_exit_2(capsys):
    try:
        main(["tiny-checkpoint"])
    except SystemExit as e:
        assert e.code == 2
    else:
        raise AssertionError("argparse should exit")
    assert main([]) == 2
