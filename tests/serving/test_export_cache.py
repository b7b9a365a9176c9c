"""The export cache's key: content digests (with their memo), export options; no export runs here (the
``dspark serve CHECKPOINT`` tests in test_dspark_serve.py export for real and reuse the entry)."""

from __future__ import annotations

import os
import shutil

import pytest

from dspark_trt.errors import DSparkTrtError
from dspark_trt.serving import export_cache
from dspark_trt.serving.export_cache import _DigestIndex, cache_entry, directory_digest


def test_directory_digest_follows_contents_and_names(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"\x00" * 100)
    first = directory_digest(d)
    assert directory_digest(d) == first
    (d / ".cache").mkdir()
    (d / ".cache" / "junk").write_text("ignored")
    assert directory_digest(d) == first  # hidden entries do not count
    (d / "model.safetensors").write_bytes(b"\x01" + b"\x00" * 99)
    changed = directory_digest(d)
    assert changed != first
    (d / "model.safetensors").rename(d / "weights.safetensors")
    assert directory_digest(d) != changed  # same bytes, another name


def test_the_memo_rereads_only_changed_files(tmp_path, monkeypatch):
    d = tmp_path / "ckpt"
    d.mkdir()
    for name in ("a.json", "b.safetensors"):
        (d / name).write_bytes(name.encode() * 1000)
    reads = []
    real = export_cache.file_sha256
    monkeypatch.setattr(export_cache, "file_sha256", lambda p: reads.append(p.name) or real(p))
    index = _DigestIndex(tmp_path / "digests.json")
    first = directory_digest(d, index)
    index.save()
    assert sorted(reads) == ["a.json", "b.safetensors"]
    reads.clear()
    again = _DigestIndex(tmp_path / "digests.json")  # a second start reads the saved memo
    assert directory_digest(d, again) == first and reads == []
    (d / "b.safetensors").write_bytes(b"changed")
    st = (d / "b.safetensors").stat()
    os.utime(d / "b.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert directory_digest(d, again) != first and reads == ["b.safetensors"]
    assert directory_digest(d, again) == directory_digest(d)  # the memo agrees with a full read


def test_cache_entry_changes_with_inputs_and_options(tmp_path, tiny_pair):
    from dspark_trt.export.pipeline import ExportOptions

    cache = tmp_path / "cache"
    fp32 = ExportOptions(dtype="fp32", engine="none")
    path, key = cache_entry(tiny_pair.drafter, target_dir=tiny_pair.target, options=fp32, cache_dir=cache)
    assert path.parent == cache / "exports" and key[:16] in path.name
    assert cache_entry(tiny_pair.drafter, target_dir=tiny_pair.target, options=fp32, cache_dir=cache)[1] == key
    assert cache_entry(tiny_pair.drafter, target_dir=tiny_pair.target, options=ExportOptions(dtype="bf16",
                       engine="none"), cache_dir=cache)[1] != key
    assert cache_entry(tiny_pair.drafter, target_dir=tiny_pair.target, options=ExportOptions(
        dtype="fp32", engine="none", topk=16), cache_dir=cache)[1] != key
    target = shutil.copytree(tiny_pair.target, tmp_path / "target")
    assert cache_entry(tiny_pair.drafter, target_dir=target, options=fp32, cache_dir=cache)[1] == key  # contents
    (target / "generation_config.json").write_text('{"eos_token_id": 1}')
    assert cache_entry(tiny_pair.drafter, target_dir=target, options=fp32, cache_dir=cache)[1] != key
    assert not (cache / "exports").exists()  # nothing exported


def test_not_a_checkpoint_is_one_line(tmp_path):
    from dspark_trt.errors import DSparkTrtError
    from dspark_trt.export.pipeline import ExportOptions

    (tmp_path / "x").mkdir()
    with pytest.raises(DSparkTrtError):
        cache_entry(tmp_path / "x", target_dir=tmp_path / "x", options=ExportOptions(), cache_dir=tmp_path / "c")
    assert not (tmp_path / "c" / "exports").exists()


def test_serve_caches_live_below_the_one_cache_root(tmp_path, monkeypatch):
    from dspark_trt.serving.environment import server_environment
    from dspark_trt.serving.export_cache import export_cache_dir

    monkeypatch.delenv("DSPARK_TRT_CACHE", raising=False)
    monkeypatch.delenv("DSPARK_TRITON_ENV", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert export_cache_dir() == tmp_path / "xdg" / "dspark-trt" / "serve"
    with pytest.raises(DSparkTrtError, match="not built") as e:
        server_environment(build=False)
    assert str(tmp_path / "xdg" / "dspark-trt" / "triton-env-py") in str(e.value)
