"""Atomic outputs: complete or absent, never merged, ordinary permissions."""

from __future__ import annotations

import os
import stat

import pytest

from dspark_trt.atomic import atomic_output_dir, atomic_write_bytes, atomic_write_text
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


def test_force_replaces_instead_of_merging(tmp_path):
    out = tmp_path / "out"
    with atomic_output_dir(out) as tmp:
        (tmp / "old").write_text("1")
    with pytest.raises(DSparkTrtError, match="pass --force"):
        with atomic_output_dir(out) as tmp:
            pass
    with atomic_output_dir(out, force=True) as tmp:
        (tmp / "new").write_text("2")
    assert sorted(p.name for p in out.iterdir()) == ["new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_file_in_the_way_is_refused(tmp_path):
    (tmp_path / "f").write_text("mine")
    with pytest.raises(DSparkTrtError, match="exists and is not a directory"):
        with atomic_output_dir(tmp_path / "f", force=True):
            pass


def test_outputs_get_ordinary_permissions(tmp_path):
    mask = os.umask(0o022)
    try:
        with atomic_output_dir(tmp_path / "out") as tmp:
            atomic_write_text(tmp / "t.json", "{}")
            atomic_write_bytes(tmp / "e.plan", b"\x00\x01")
    finally:
        os.umask(mask)
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "out" / "t.json").stat().st_mode) == 0o644
    assert (tmp_path / "out" / "e.plan").read_bytes() == b"\x00\x01"
