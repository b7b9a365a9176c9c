"""The streaming safetensors writer: save_file's exact bytes, chunk boundaries, shards, sizes, the chunk seeds."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from dspark_trt.checkpoint import SafetensorsCheckpoint
from dspark_trt.errors import DSparkTrtError
from dspark_trt.synthetic import safetensors_stream as st
from dspark_trt.synthetic.safetensors_stream import (TensorPlan, constant_chunks, file_bytes, parse_size, plan_shards,
                                                   random_chunks, sharded_bytes, write_safetensors, write_sharded)


def _odd_tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "b.w": torch.randn(3, 5, generator=g).to(torch.bfloat16),
        "a.x": torch.randn(7, generator=g),
        "d2t": torch.arange(5) - 2,
        "aa": torch.randn(2, 2, 3, generator=g).half(),
        "mask": torch.rand(9, generator=g) > 0.5,
        "ids": torch.arange(3, dtype=torch.int32),
        "scalar_row": torch.randn(1, generator=g),
    }


def _plan(name, t, pieces=3):
    flat = t.flatten()
    return TensorPlan(name, tuple(t.shape), t.dtype, lambda: list(torch.tensor_split(flat, pieces)))


def test_a_streamed_file_is_byte_for_byte_what_save_file_writes(tmp_path):
    tensors = _odd_tensors()
    save_file(tensors, str(tmp_path / "ref.safetensors"), metadata={"format": "pt"})
    plans = [_plan(k, v) for k, v in reversed(list(tensors.items()))]  # any plan order
    n = write_safetensors(tmp_path / "mine.safetensors", plans, metadata={"format": "pt"})
    mine = (tmp_path / "mine.safetensors").read_bytes()
    assert mine == (tmp_path / "ref.safetensors").read_bytes()
    assert n == len(mine) == file_bytes(plans, {"format": "pt"})


def test_chunks_are_drawn_per_chunk_and_the_bytes_depend_on_seed_and_key_only(tmp_path, monkeypatch):
    monkeypatch.setattr(st, "CHUNK_ELEMENTS", 1000)
    a = torch.cat(list(random_chunks(2500, torch.bfloat16, std=0.02, seed=3, key="w")()))  # [2500] bf16, 3 chunks
    assert a.shape == (2500,) and a.dtype == torch.bfloat16
    assert torch.equal(a, torch.cat(list(random_chunks(2500, torch.bfloat16, std=0.02, seed=3, key="w")())))
    # a longer tensor under the same key starts with the same chunks; another seed or key differs
    assert torch.equal(torch.cat(list(random_chunks(3100, torch.bfloat16, std=0.02, seed=3, key="w")()))[:2000], a[:2000])
    assert not torch.equal(torch.cat(list(random_chunks(2500, torch.bfloat16, std=0.02, seed=4, key="w")())), a)
    assert not torch.equal(torch.cat(list(random_chunks(2500, torch.bfloat16, std=0.02, seed=3, key="v")())), a)
    assert not torch.equal(a[:1000], a[1000:2000])  # every chunk has its own generator
    assert 0.015 < float(a.float().std()) < 0.025 and float(a.float().mean()).__abs__() < 0.005
    ones = torch.cat(list(constant_chunks(2500, torch.float16, 1.0)()))
    assert ones.shape == (2500,) and bool((ones == 1).all())


def test_sharding_keeps_order_and_limits_and_gives_an_oversized_tensor_its_own_shard():
    sizes = [10, 30, 25, 100, 5, 5, 60]  # fp32 elements → 4 bytes each
    plans = [TensorPlan(f"t{i}", (n,), torch.float32, constant_chunks(n, torch.float32, 0.0)) for i, n in enumerate(sizes)]
    shards = plan_shards(plans, 160)
    assert [[p.name for p in s] for s in shards] == [["t0", "t1"], ["t2"], ["t3"], ["t4", "t5"], ["t6"]]
    assert all(sum(p.nbytes for p in s) <= 160 or len(s) == 1 for s in shards)
    assert plan_shards(plans, None) == [plans]
    assert [p.name for s in plan_shards(plans, 1) for p in s] == [p.name for p in plans]


@pytest.mark.parametrize("shard_bytes", [None, 40, 10**9], ids=["single", "sharded", "limit-above-size"])
def test_write_sharded_round_trips_through_the_projects_reader(tmp_path, shard_bytes):
    tensors = _odd_tensors(1)
    plans = [_plan(k, v) for k, v in tensors.items()]
    files = write_sharded(tmp_path, plans, shard_bytes=shard_bytes, metadata={"format": "pt"})
    assert sum(f.stat().st_size for f in tmp_path.iterdir()) == sharded_bytes(plans, shard_bytes, metadata={"format": "pt"})
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(files)
    if shard_bytes == 40:
        index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
        shards = [f for f in files if f.endswith(".safetensors")]
        assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
        assert sorted(index["weight_map"]) == sorted(tensors)  # every tensor exactly once
        assert set(index["weight_map"].values()) == set(shards)
        assert index["metadata"]["total_size"] == sum(v.numel() * v.element_size() for v in tensors.values())
        for shard in shards:  # and each shard holds exactly the tensors the index gives it
            with safe_open(str(tmp_path / shard), framework="pt") as f:
                assert sorted(f.keys()) == sorted(k for k, v in index["weight_map"].items() if v == shard)
    else:
        assert files == ["model.safetensors"]
    with SafetensorsCheckpoint(tmp_path) as ck:
        assert ck.keys() == sorted(tensors)
        for name, t in tensors.items():
            assert torch.equal(ck.get(name), t)


@pytest.mark.parametrize("text, expected", [("2GB", 2 * 10**9), ("500MiB", 500 * 2**20), ("1.5gb", 1_500_000_000),
                                            ("123", 123), (4096, 4096), (" 4 GB ", 4 * 10**9)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["2XB", "GB", "-1GB", "0", ""])
def test_parse_size_refuses_non_sizes_in_one_line(text):
    with pytest.raises(DSparkTrtError) as e:
        parse_size(text)
    assert "\n" not in str(e.value)
