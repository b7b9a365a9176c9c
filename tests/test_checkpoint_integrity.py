"""Checkpoint files checked before an export reads a weight: shards named by the index, truncated downloads,
an index that disagrees with its shards — one line each (exit 1 from dspark-export), nothing written."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dspark_trt.checkpoint_integrity import check_checkpoint_files, read_safetensors_header
from dspark_trt.errors import DSparkTrtError

INDEX = "model.safetensors.index.json"


def shard(src: Path, dst: Path, parts: int = 2) -> Path:
    """A copy of checkpoint ``src`` with its ``model.safetensors`` split into ``parts`` shards + an index."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    (dst / "model.safetensors").unlink()
    names = sorted(tensors)
    weight_map = {}
    for i in range(parts):
        file = f"model-{i + 1:05d}-of-{parts:05d}.safetensors"
        part = {n: tensors[n] for n in names[i::parts]}
        save_file(part, str(dst / file))
        weight_map.update({n: file for n in part})
    (dst / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return dst


@pytest.fixture
def sharded(tiny_pair, tmp_path) -> Path:
    return shard(tiny_pair.drafter, tmp_path / "sharded")


def test_a_complete_checkpoint_passes_and_is_counted(tiny_pair, sharded):
    single, split = check_checkpoint_files(tiny_pair.drafter), check_checkpoint_files(sharded)
    assert len(single.files) == 1 and len(split.files) == 2
    assert single.tensors() == split.tensors() and single.numel() == split.numel() > 0
    header = read_safetensors_header(tiny_pair.drafter / "model.safetensors")
    assert header.expected_bytes == header.actual_bytes == (tiny_pair.drafter / "model.safetensors").stat().st_size


def test_a_shard_missing_from_disk(sharded):
    (sharded / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(DSparkTrtError, match=r"1 shard named in model.safetensors.index.json is missing "
                                             r"\(model-00002-of-00002.safetensors\); download every file"):
        check_checkpoint_files(sharded)


@pytest.mark.parametrize("cut", [1, 4096, "header"])
def test_a_truncated_shard(sharded, cut):
    path = sharded / "model-00001-of-00002.safetensors"
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(20 if cut == "header" else size - cut)
    message = r"its header alone needs" if cut == "header" else rf"is truncated: {size - cut} bytes, its header " \
                                                                  rf"describes {size}"
    with pytest.raises(DSparkTrtError, match=message):
        check_checkpoint_files(sharded)


def test_an_index_that_disagrees_with_its_shards(sharded):
    index = json.loads((sharded / INDEX).read_text())
    name = next(n for n, f in index["weight_map"].items() if f.startswith("model-00001"))
    index["weight_map"][name] = "model-00002-of-00002.safetensors"
    (sharded / INDEX).write_text(json.dumps(index))
    with pytest.raises(DSparkTrtError, match=rf"places {name} in model-00002-of-00002.safetensors, which does not "
                                             rf"hold it"):
        check_checkpoint_files(sharded)


@pytest.mark.onnx
def test_dspark_export_refuses_them_in_one_line_before_writing(tiny_pair, sharded, tmp_path):
    """Through the command: exit 1, one ``error:`` line, no traceback, no output directory; the target's files
    are checked too."""
    def export(drafter, target):
        return subprocess.run([sys.executable, "-m", "dspark_trt.cli.main", "export", str(drafter), "--target",
                               str(target), "--topk", "off", "--engine", "none", "-o", str(tmp_path / "out")],
                              capture_output=True, text=True, timeout=300)

    (sharded / "model-00001-of-00002.safetensors").unlink()
    proc = export(sharded, tiny_pair.target)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "model-00001-of-00002.safetensors" in errors[0] and "missing" in errors[0]
    target = shutil.copytree(tiny_pair.target, tmp_path / "target")
    with open(target / "model.safetensors", "r+b") as f:
        f.truncate((target / "model.safetensors").stat().st_size // 2)
    proc = export(tiny_pair.drafter, target)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{target / 'model.safetensors'} is truncated" in errors[0] and "re-download it" in errors[0]
    assert not (tmp_path / "out").exists()
