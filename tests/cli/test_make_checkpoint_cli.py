"""`dspark make-checkpoint`: --list, a write through the CLI, one-line errors (exit 1) and usage errors (exit 2)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dspark_trt.cli.main import main
from dspark_trt.synthetic import presets
from dspark_trt.synthetic.preset_checkpoint import MARKER


def dspark(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "dspark_trt.cli.main", "make-checkpoint", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd)


def test_list_shows_every_preset_with_parameters_and_bytes(capsys):
    assert main(["make-checkpoint", "--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in presets.PRESETS)
    assert "2.37 B (2,371,081,729)" in out and "4.74 GB" in out  # the drafter in DeepSeek format, bf16
    assert "8.19 B (8,190,735,360)" in out and "16.38 GB" in out  # the Qwen3-8B-shaped target
    assert main(["make-checkpoint", "--list", "--dtype", "fp32"]) == 0
    assert "9.48 GB" in capsys.readouterr().out


def test_writes_a_pair_through_the_cli(tmp_path, capsys, monkeypatch):
    from dspark_trt import load_drafter

    narrow = presets.scaled(presets.get_preset("dspark_qwen3_8b_block7"), hidden_size=64, intermediate_size=96,
                            head_dim=16, num_attention_heads=4, num_key_value_heads=2)
    monkeypatch.setitem(presets.PRESETS, "narrow_block7", narrow)  # the CLI has no width flags: a narrow preset
    assert main(["make-checkpoint", "narrow_block7", str(tmp_path / "p"), "--with-target", "--layers", "1",
                 "--target-layers", "6", "--vocab", "400", "--format", "speculators", "--shard-size", "100kB",
                 "--dtype", "fp32", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert f"drafter: {tmp_path / 'p' / 'drafter'}" in out and f"target:  {tmp_path / 'p' / 'target'}" in out
    model = load_drafter(tmp_path / "p" / "drafter")  # speculators: finds ../target
    c = model.config
    assert (c.vocab_size, c.num_hidden_layers, c.num_target_layers, c.target_layer_ids) == (400, 1, 6, (0, 1, 2, 4, 5))
    assert (tmp_path / "p" / "drafter" / "model.safetensors.index.json").is_file()


def test_user_errors_are_one_line_exit_1_and_write_nothing(tmp_path, capsys):
    proc = dspark("qwen3_32b", tmp_path / "x")  # as a program: exit 1, one line, no traceback
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        f"error: unknown checkpoint preset 'qwen3_32b': use one of {', '.join(presets.PRESETS)} "
        f"(dspark make-checkpoint --list shows their sizes)"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("mine")
    assert main(["make-checkpoint", "dspark_qwen3_8b_block7", str(mine), "--force", "--layers", "1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"no {MARKER}" in err[0]
    assert [p.name for p in mine.iterdir()] == ["keep.txt"]
    assert main(["make-checkpoint", "dspark_qwen3_8b_block7", str(tmp_path / "y"), "--target-layers", "3"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: a 3-layer target cannot feed 5 distinct tapped layers: use at least 5 target layers (--target-layers)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


@pytest.mark.parametrize("argv", [["make-checkpoint"], ["make-checkpoint", "qwen3_8b"]])
def test_missing_preset_or_directory_is_a_usage_error(argv, capsys):
    assert main(argv) == 2
    assert "give PRESET and OUT_DIR (or --list)" in capsys.readouterr().err
