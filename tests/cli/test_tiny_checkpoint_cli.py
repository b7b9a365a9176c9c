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
    for force in ([], ["--force"]):  # --force replaces only an earlier output, never the user's files
        proc = subprocess.run([sys.executable, "-m", "dspark_trt.cli.main", "tiny-checkpoint", str(out), *force],
                              capture_output=True, text=True)
        assert proc.returncode == 1
        assert proc.stderr.strip().splitlines() == [
            f"error: output directory {out} is not empty and holds no earlier dspark output (no manifest.json); "
            f"--force replaces only an earlier output or an empty directory: choose another output directory"]
        assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"


def test_the_working_directory_and_a_path_below_a_file(tmp_path):
    def tiny(*args, cwd=tmp_path):
        return subprocess.run([sys.executable, "-m", "dspark_trt.cli.main", "tiny-checkpoint", *args,
                               "--vocab-size", "64", "--hidden-size", "16", "--markov-rank", "4"],
                              capture_output=True, text=True, cwd=cwd)

    here = tmp_path / "here"
    here.mkdir()
    assert tiny(".", cwd=here).returncode == 0
    assert sorted(p.name for p in here.iterdir()) == ["drafter", "manifest.json", "target"]
    proc = tiny(".", "--force", cwd=here)  # an earlier output: replaced in place
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in here.iterdir()) == ["drafter", "manifest.json", "target"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["here"]
    (tmp_path / "notes.txt").write_text("mine")
    proc = tiny(tmp_path / "notes.txt" / "sub")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: cannot write {tmp_path / 'notes.txt' / 'sub'}: "
                                                f"{tmp_path / 'notes.txt'} is a file, not a directory; choose another path"]


def test_usage_errors_exit_2(capsys):
    try:
        main(["tiny-checkpoint"])
    except SystemExit as e:
        assert e.code == 2
    else:
        raise AssertionError("argparse should exit")
    assert main([]) == 2
