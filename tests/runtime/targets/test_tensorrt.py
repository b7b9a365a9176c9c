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
