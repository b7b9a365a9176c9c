"""Atomic outputs: complete or absent, never merged, only earlier outputs replaced, ordinary permissions."""

from __future__ import annotations

import os
import stat

import pytest

from dspark_trt.atomic import (atomic_output_dir, atomic_output_file, atomic_write_bytes, atomic_write_text,
                               check_output_file)
from dspark_trt.errors import DSparkTrtError


def test_directory_appears_only_when_complete(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with atomic_output_dir(out) as tmp:
            (tmp / "half").write_text("x")
            raise RuntimeError("crash")
    assert list(tmp_path.iterdir()) == []
    with atomic_output_dir(out) as tmp:
        (tmp / "a").write_text("1")
    assert (out / "a").read_text() == "1"


def test_force_replaces_an_earlier_output_instead_of_merging(tmp_path):
    out = tmp_path / "out"
    with atomic_output_dir(out) as tmp:
        (tmp / "old").write_text("1")
        (tmp / "manifest.json").write_text("{}")
    with pytest.raises(DSparkTrtError, match="holds an earlier output; pass --force"):
        with atomic_output_dir(out) as tmp:
            pass
    with atomic_output_dir(out, force=True) as tmp:
        (tmp / "new").write_text("2")
    assert sorted(p.name for p in out.iterdir()) == ["new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("force", [False, True])
def test_force_never_replaces_a_directory_that_is_not_an_earlier_output(tmp_path, force):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(DSparkTrtError, match="holds no earlier dspark output .no manifest.json.; --force replaces "
                                             "only an earlier output or an empty directory"):
        with atomic_output_dir(out, force=force):
            raise AssertionError("must not run")
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"


def test_the_marker_is_per_writer(tmp_path):
    out = tmp_path / "out"
    with atomic_output_dir(out, marker="onnx_export.json") as tmp:
        (tmp / "onnx_export.json").write_text("{}")
    with pytest.raises(DSparkTrtError, match="no manifest.json"):
        with atomic_output_dir(out, force=True):
            pass
    with atomic_output_dir(out, force=True, marker="onnx_export.json") as tmp:
        (tmp / "x").write_text("")
    assert [p.name for p in out.iterdir()] == ["x"]


def test_the_working_directory_as_output(tmp_path, monkeypatch):
    """``-o .``: the directory stays (the shell is in it), its entries are swapped; nothing left behind."""
    monkeypatch.chdir(tmp_path)
    inode = tmp_path.stat().st_ino
    with atomic_output_dir(".") as tmp:
        assert tmp.parent == tmp_path
        (tmp / "manifest.json").write_text("1")
    with atomic_output_dir(".", force=True) as tmp:
        (tmp / "manifest.json").write_text("2")
        (tmp / "sub").mkdir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json", "sub"]
    assert (tmp_path / "manifest.json").read_text() == "2" and tmp_path.stat().st_ino == inode


def test_a_failure_in_place_keeps_the_earlier_output(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text("earlier")
    with pytest.raises(RuntimeError):
        with atomic_output_dir(out, force=True) as tmp:
            (tmp / "manifest.json").write_text("new")
            raise RuntimeError("crash")
    assert [p.name for p in out.iterdir()] == ["manifest.json"] and (out / "manifest.json").read_text() == "earlier"


def test_a_path_below_a_file_is_one_line(tmp_path):
    (tmp_path / "f").write_text("mine")
    for call in (lambda: atomic_output_dir(tmp_path / "f" / "sub").__enter__(),
                 lambda: atomic_write_text(tmp_path / "f" / "sub" / "x.json", "{}"),
                 lambda: check_output_file(tmp_path / "f" / "x.png")):
        with pytest.raises(DSparkTrtError, match=f"{tmp_path / 'f'} is a file, not a directory"):
            call()
    assert (tmp_path / "f").read_text() == "mine"


def test_file_outputs(tmp_path):
    with pytest.raises(DSparkTrtError, match="is a directory; give a file path"):
        check_output_file(tmp_path, force=True)
    (tmp_path / "a.png").write_text("old")
    with pytest.raises(DSparkTrtError, match="exists; pass --force"):
        check_output_file(tmp_path / "a.png")
    assert check_output_file(tmp_path / "a.png", force=True) == tmp_path / "a.png"
    with pytest.raises(RuntimeError):
        with atomic_output_file(tmp_path / "a.png") as tmp:
            assert tmp.suffix == ".png"
            tmp.write_text("half")
            raise RuntimeError("crash")
    assert [p.name for p in tmp_path.iterdir()] == ["a.png"] and (tmp_path / "a.png").read_text() == "old"


def test_a_file_in_the_way_is_refused(tmp_path):
    (tmp_path / "f").write_text("mine")
    with pytest.raises(DSparkTrtError, match="exists and is not a directory"):
        with atomic_output_dir(tmp_path / "f", force=True):
            pass


def test_outputs_get_ordinary_permissions(tmp_path):
    """Files made private by their writer (tempfile, safetensors >= 0.6) still follow the user's umask."""
    import torch
    from safetensors.torch import save_file

    mask = os.umask(0o022)
    try:
        with atomic_output_dir(tmp_path / "out") as tmp:
            atomic_write_text(tmp / "t.json", "{}")
            atomic_write_bytes(tmp / "e.plan", b"\x00\x01")
            (tmp / "sub").mkdir(mode=0o700)
            save_file({"w": torch.zeros(2)}, str(tmp / "sub" / "model.safetensors"))
        with atomic_output_file(tmp_path / "plot.png") as tmp:
            tmp.write_bytes(b"png")
    finally:
        os.umask(mask)
    out = tmp_path / "out"
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in [out, *out.rglob("*"), tmp_path / "plot.png"]}
    assert modes == {"out": 0o755, "t.json": 0o644, "e.plan": 0o644, "sub": 0o755, "model.safetensors": 0o644,
                     "plot.png": 0o644}
    assert (out / "e.plan").read_bytes() == b"\x00\x01"


def test_force_replaces_only_the_entries_the_writer_owns(tmp_path):
    """``owned``: an earlier export's own entries are replaced (old ones the new output lacks included); whatever
    else the user keeps in the directory stays, untouched."""
    out = tmp_path / "out"
    owned = ("manifest.json", "onnx", "engines")
    with atomic_output_dir(out, owned=owned) as tmp:
        (tmp / "onnx").mkdir()
        (tmp / "onnx" / "old.onnx").write_text("old")
        (tmp / "engines").mkdir()
        (tmp / "manifest.json").write_text("{\"v\": 1}")
    (out / "notes.txt").write_text("mine")
    (out / "triton").mkdir()
    with atomic_output_dir(out, force=True, owned=owned) as tmp:
        (tmp / "onnx").mkdir()
        (tmp / "onnx" / "new.onnx").write_text("new")
        (tmp / "manifest.json").write_text("{\"v\": 2}")
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "notes.txt", "onnx", "triton"]
    assert [p.name for p in (out / "onnx").iterdir()] == ["new.onnx"]  # replaced, not merged
    assert (out / "notes.txt").read_text() == "mine" and (out / "manifest.json").read_text() == "{\"v\": 2}"


def test_a_failed_swap_puts_every_old_entry_back_and_moves_the_marker_first_and_last(tmp_path, monkeypatch):
    """The swap renames the old marker away first and the new marker in last (a directory with a marker always
    holds a complete output); a rename that fails midway puts the earlier output back as it was."""
    import dspark_trt.atomic as atomic

    out = tmp_path / "out"
    with atomic_output_dir(out) as tmp:
        for name in ("a", "b", "manifest.json"):
            (tmp / name).write_text(f"old {name}")
    renames = []
    real_rename = os.rename

    def rename(src, dst):
        renames.append((os.path.basename(src), os.path.basename(os.path.dirname(dst))))
        real_rename(src, dst)

    monkeypatch.setattr(atomic.os, "rename", rename)
    with atomic_output_dir(out, force=True) as tmp:
        for name in ("a", "manifest.json", "z"):
            (tmp / name).write_text(f"new {name}")
    names = [src for src, _ in renames]
    assert names[0] == "manifest.json" and names[-1] == "manifest.json"  # old marker out first, new one in last
    calls = []

    def failing_rename(src, dst):
        calls.append(src)
        if len(calls) == 5:  # the old entries are aside and one new entry is in: the disk/rename fails
            raise OSError(28, "No space left on device")
        real_rename(src, dst)

    monkeypatch.setattr(atomic.os, "rename", failing_rename)
    with pytest.raises(OSError):
        with atomic_output_dir(out, force=True) as tmp:
            for name in ("x", "y", "manifest.json"):
                (tmp / name).write_text(f"newer {name}")
    monkeypatch.setattr(atomic.os, "rename", real_rename)
    assert {p.name: p.read_text() for p in out.iterdir()} == {"a": "new a", "manifest.json": "new manifest.json",
                                                              "z": "new z"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
