"""The TensorRT target's K/V binding, pure parts on the CPU: the cache keeps a batch bucket of rows, a verify
round replays the bucket that *is* the cache's shape (rows × capacity) and a prefill chunk runs with exact
shapes; and that binding — padded requests, capacity mask, the cache bound in place — computed by the exported
target graph in onnxruntime gives the unpadded target's logits and K/V (the engine itself runs on GPU hosts)."""

from __future__ import annotations

import pytest
import torch

from dspark_trt.errors import DSparkTrtError
from dspark_trt.runtime.cuda_graphs import PadPlan
from dspark_trt.runtime.targets.tensorrt import cache_rows, profile_new_tokens, step_plan


def test_the_cache_keeps_a_batch_bucket_of_rows():
    assert [cache_rows(b, 8) for b in (1, 2, 3, 4, 5, 8)] == [1, 2, 4, 4, 8, 8]
    assert cache_rows(11, 8) == 11  # past the buckets: exactly the batch (those calls run eagerly)
    assert cache_rows(5, 6) == 6


def test_a_verify_round_replays_the_bucket_that_is_the_cache():
    plan, replay = step_plan(3, 700, 8, 768, 4, max_batch=8, max_graph_tokens=16)
    assert replay and plan == PadPlan(batch=3, bucket=4, context=700, context_bucket=768)


@pytest.mark.parametrize("batch,new,rows,logits", [(3, 512, 4, 1), (11, 8, 11, None), (3, 8, 8, None), (3, 5, 4, 1)])
def test_prefill_chunks_and_unbucketed_batches_run_with_exact_shapes(batch, new, rows, logits):
    plan, replay = step_plan(batch, 100, new, 640, rows, max_batch=8, max_graph_tokens=16, logits=logits)
    assert not replay and plan == PadPlan(batch, batch, 640, 640)  # the real rows, the whole capacity


def test_a_step_that_does_not_fit_the_cache_is_refused():
    with pytest.raises(DSparkTrtError, match="after 769 slots .* does not fit the cache .4 rows, 768 slots.; reserve"):
        step_plan(3, 769, 8, 768, 4, max_batch=8, max_graph_tokens=16)
    with pytest.raises(DSparkTrtError, match="for 5 requests does not fit"):
        step_plan(5, 10, 1, 128, 4, max_batch=8, max_graph_tokens=16)


def test_prefill_chunks_follow_the_engine_profile():
    assert profile_new_tokens({"build": {"dynamic_ranges": {"Q": [1, 8, 256], "P": [1, 1024, 8192]}}}, 512) == 256
    assert profile_new_tokens({"build": {}}, 512) == 512


@pytest.mark.onnx
@pytest.mark.slow
def test_the_bucketed_binding_gives_the_unpadded_results(qwen3_topk_export):
    from dspark_trt.artifact.export_dir import read_manifest
    from dspark_trt.artifact.target_io import past_names
    from dspark_trt.runtime.cuda_graphs import GraphRunner
    from dspark_trt.runtime.kv_cache import KVCache
    from dspark_trt.runtime.targets.exported import capacity_mask
    from dspark_trt.runtime.targets.onnxruntime import OnnxRuntimeTarget
    from dspark_trt.runtime.tensorrt_engine import input_specs, io_tensors, output_batch_dims
    from dspark_trt.runtime.targets.tensorrt import mask_symbol, target_fills

    ort = OnnxRuntimeTarget.from_export(qwen3_topk_export, threads=1)
    ort.set_taps([1, 2, 4])
    ort.prefill([torch.arange(5) + 7, torch.tensor([40, 41]), torch.arange(7) + 90])  # 3 requests, right-padded
    S, Q = ort.cached_slots(), 3
    tensors = io_tensors(read_manifest(qwen3_topk_export)["target"]["io"])
    keys, values = past_names(ort.num_layers)
    cache = KVCache(num_layers=ort.num_layers, kv_heads=ort.num_key_value_heads, head_dim=ort.head_dim,
                    dtype=torch.float32)
    cache.reserve(cache_rows(3, 8), S + Q, used=0)  # the TensorRT layout: 4 rows, row 3 a padded request
    cache.k[:, :3, :, :S], cache.v[:, :3, :, :S] = ort.cache.k[:, :, :, :S], ort.cache.v[:, :, :, :S]
    cache.k[:, 3], cache.v[:, 3] = 3.0, -3.0  # a departed request's stale (finite) rows
    tokens = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    positions = ort.lengths.view(3, 1) + torch.arange(Q)
    mask = torch.cat((ort.valid, torch.ones(3, Q, dtype=torch.bool)), dim=1).to(torch.int64)  # [3, S + Q]

    plan, replay = step_plan(3, S, Q, cache.capacity, cache.batch, max_batch=8, max_graph_tokens=16)
    assert replay and (plan.bucket, plan.context_bucket) == (4, cache.capacity)
    specs = input_specs(tensors, "B", "P", target_fills(), {"attention_mask": (mask_symbol(tensors), Q)},
                        {"Q": Q, "K": Q}, bound=keys + values)
    runner = GraphRunner(lambda x, key: ort.graph.run(x), specs, role="target", device="cpu", mode="eager",
                         output_batch_dims=output_batch_dims(tensors))
    layer_k, layer_v = cache.layers()
    feeds = {"input_ids": tokens, "position_ids": positions, "attention_mask": mask,
             "logits_index": torch.arange(Q).expand(3, Q), **dict(zip(keys, layer_k)), **dict(zip(values, layer_v))}
    padded = runner(plan, feeds)

    exact_plan, replay = step_plan(3, S, Q, cache.capacity, cache.batch, max_batch=8, max_graph_tokens=2)
    assert not replay
    exact = ort.graph.run({**feeds, "attention_mask": capacity_mask(mask, S, exact_plan.context_bucket),
                           **{k: t[:3] for k, t in zip(keys, layer_k)}, **{v: t[:3] for v, t in zip(values, layer_v)}})

    ref = ort.verify(tokens)  # the unpadded target, its own cache
    for out in (padded, exact):
        torch.testing.assert_close(out["logits"], ref.logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out["taps"], ref.taps, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out["new_key"], ort.cache.k[:, :, :, S:S + Q], atol=1e-6, rtol=1e-6)
    ort.commit(torch.tensor([0, 0, 0]))


# -- Gemma-4: two caches, the ring bound as the global slots are -------------------------------------------------
def test_the_gemma4_engine_profile_fixes_w_to_the_runtimes_ring():
    """A Gemma-4 export's target engine is built for the ring the runtime binds (``gemma4.ring`` slots per request,
    whatever the context); an engine whose W range misses it is refused in one line."""
    from dspark_trt.export.pipeline import target_build_config
    from dspark_trt.export.engine_build import EngineBuildConfig
    from dspark_trt.runtime.targets.tensorrt import check_ring_profile

    gemma4 = {"sliding_window": 1024, "ring": 1087}
    cfg = target_build_config(EngineBuildConfig("tensorrt", max_batch_size=4), 256, ring=1087)
    assert all(r["W"] == (1, 1087, 1087) for r in cfg.profile_ranges)  # prefill and verify profiles
    assert cfg.dynamic_ranges["P"] == (1, 256, 256)  # the global layers' capacity still follows the context
    check_ring_profile({"build": cfg.describe()}, gemma4)
    old = target_build_config(EngineBuildConfig("tensorrt", max_batch_size=4), 256)  # W profiled as P (≤ 256)
    with pytest.raises(DSparkTrtError, match="takes W \\[1, 256, 256\\], the Gemma-4 runtime binds a ring of 1087") as e:
        check_ring_profile({"build": old.describe()}, gemma4)
    assert "\n" not in str(e.value) and "dspark build-engine" in str(e.value)


@pytest.mark.onnx
@pytest.mark.slow
def test_the_gemma4_bucketed_binding_gives_the_unpadded_results(gemma4_export):
    """``Gemma4TensorRTTarget``'s binding on the CPU: its input specs (both caches bound, W fixed to the ring,
    padded requests with an empty ring) and feeds, a padded bucket of 4 rows for 3 requests (one of them past the
    window) run through ``GraphRunner`` with the exported Gemma-4 graph in onnxruntime as the engine, give the
    unpadded target's logits, taps and new K/V — replayed (bucket) and exact-shape alike; the new K/V written into
    the TensorRT-layout caches equal the onnxruntime target's."""
    from dspark_trt.artifact.export_dir import read_manifest
    from dspark_trt.runtime.cuda_graphs import GraphRunner
    from dspark_trt.runtime.targets.exported import capacity_mask
    from dspark_trt.runtime.targets.gemma4 import cache_names, graph_feeds, new_caches, ring_size, write_new
    from dspark_trt.runtime.targets.onnxruntime import OnnxRuntimeTarget
    from dspark_trt.runtime.targets.tensorrt import gemma4_specs
    from dspark_trt.runtime.tensorrt_engine import io_tensors, output_batch_dims

    ort = OnnxRuntimeTarget.from_export(gemma4_export, threads=1)
    ort.set_taps([1, 3, 4])
    gen = torch.Generator().manual_seed(4)
    ort.prefill([torch.randint(0, 600, (n,), generator=gen) for n in (20, 3, 13)])  # past the window (8)
    S, Q = ort.cached_slots(), 3
    section = read_manifest(gemma4_export)["target"]
    g, tensors = section["gemma4"], io_tensors(section["io"])
    names = cache_names(g)
    caches = new_caches(g, torch.float32, torch.device("cpu"))
    caches.reserve(cache_rows(3, 8), S + Q, used=0)  # the TensorRT layout: 4 rows, row 3 a padded request
    glob, slid = ort.cache.glob, ort.cache.slid
    caches.glob.k[:, :3, :, :S], caches.glob.v[:, :3, :, :S] = glob.k[:, :, :, :S], glob.v[:, :, :, :S]
    caches.slid.k[:, :3], caches.slid.v[:, :3], caches.slid.pos[:3] = slid.k, slid.v, slid.pos
    caches.glob.k[:, 3], caches.glob.v[:, 3], caches.slid.k[:, 3] = 3.0, -3.0, 5.0  # a departed request's stale rows
    caches.slid.pos[3] = torch.arange(ring_size(g))  # ... and its stale positions: the fill hides them
    tokens = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    positions = ort.lengths.view(3, 1) + torch.arange(Q)
    mask = torch.cat((ort.valid, torch.ones(3, Q, dtype=torch.bool)), dim=1).to(torch.int64)  # [3, S + Q]

    plan, replay = step_plan(3, S, Q, caches.capacity, caches.batch, max_batch=8, max_graph_tokens=16)
    assert replay and (plan.bucket, plan.context_bucket) == (4, caches.capacity)
    specs = {s.name: s for s in gemma4_specs(tensors, g, Q)}
    assert all(specs[n].bound for group in names for n in group) and specs["window_positions"].shape == (0, 71)
    assert specs["window_positions"].batch_fill == -1 and not specs["window_positions"].bound
    runner = GraphRunner(lambda x, key: ort.graph.run(x), tuple(specs.values()), role="target", device="cpu",
                         mode="eager", output_batch_dims=output_batch_dims(tensors))
    common = {"input_ids": tokens, "position_ids": positions, "logits_index": torch.arange(Q).expand(3, Q)}
    padded = runner(plan, {**common, "attention_mask": mask, **graph_feeds(caches, names, positions[:, 0])})
    exact = ort.graph.run({**common, "attention_mask": capacity_mask(mask, S, caches.capacity),
                           **graph_feeds(caches, names, positions[:, 0], rows=3)})

    ring_before = ort.cache.slid.pos.clone()
    ref = ort.verify(tokens)  # the unpadded target, its own caches
    assert not torch.equal(ring_before, ort.cache.slid.pos)  # the verify wrote its tokens into the ring
    for out in (padded, exact):
        torch.testing.assert_close(out["logits"], ref.logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out["taps"], ref.taps, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out["new_key_global"], ort.cache.glob.k[:, :, :, S:S + Q], atol=1e-6, rtol=1e-6)
    write_new(caches, padded, S, positions, mask[:, S:] != 0)
    assert torch.equal(caches.slid.pos[:3], ort.cache.slid.pos) and torch.equal(caches.slid.pos[3], torch.arange(71))
    torch.testing.assert_close(caches.slid.k[:, :3], ort.cache.slid.k, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(caches.glob.v[:, :3, :, :S + Q], ort.cache.glob.v[:, :, :, :S + Q], atol=1e-6,
                               rtol=1e-6)
    ort.commit(torch.tensor([0, 0, 0]))


def test_the_gemma4_tensorrt_target_is_refused_in_one_line_without_tensorrt(gemma4_export):
    from tests.conftest import have_tensorrt
    from dspark_trt.runtime.targets.tensorrt import TensorRTTarget

    if have_tensorrt():
        pytest.skip("full TensorRT is importable here: the GPU tests run the engine")
    with pytest.raises(DSparkTrtError) as e:
        TensorRTTarget.from_export(gemma4_export)
    assert "\n" not in str(e.value) and "tensorrt" in str(e.value).lower()
