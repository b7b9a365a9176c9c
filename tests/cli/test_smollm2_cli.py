"""``dspark smollm2`` / ``dspark distill`` argument errors: one line, exit 1, nothing written."""

from __future__ import annotations

from dspark_trt.cli.main import main


def test_smollm2_refuses_a_file_as_output(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("mine")
    assert main(["smollm2", str(f)]) == 1
    assert "not a directory" in capsys.readouterr().err
    assert f.read_text() == "mine"


def test_distill_refuses_bad_taps(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    assert main(["distill", "--target", str(tmp_path), "-o", str(tmp_path / "d"), "--taps", "a,b"]) == 1
    assert "--taps" in capsys.readouterr().err


def test_negative_bank_prompts_is_one_line(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    assert main(["distill", "--target", str(tmp_path), "-o", str(tmp_path / "d"), "--bank-prompts", "-1"]) == 1
    assert "--bank-prompts -1" in capsys.readouterr().err
    assert main(["smollm2", str(tmp_path / "pair"), "--bank-prompts", "-3"]) == 1
    assert "--bank-prompts -3" in capsys.readouterr().err
    assert not (tmp_path / "d").exists() and not (tmp_path / "pair").exists()
