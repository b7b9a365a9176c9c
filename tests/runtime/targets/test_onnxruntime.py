"""OnnxRuntimeTarget side by side with HFTarget (same model): right-padded prefill (whole and chunked),
verify/commit rollback with per-request rejections, holes, compaction, select, cache growth; the graph reading
the cache in place (no copy per step); and its one-line errors."""

from __future__ import annotations

import shutil

import pytest
import torch

from dspark_trt.errors import DSparkTrtError
from dspark_trt.runtime import HFTarget
from dspark_trt.runtime.targets.onnxruntime import OnnxRuntimeTarget

pytestmark = [pytest.mark.onnx, pytest.mark.slow]
TOL = dict(atol=2e-5, rtol=2e-5)


@pytest.fixture(scope="module")
def pair_of_targets(qwen3_topk_export, random_pair):
    ort = OnnxRuntimeTarget.from_export(qwen3_topk_export, threads=1)
    hf = HFTarget.from_pretrained(random_pair.target, dtype="fp32", device="cpu")
    for t in (ort, hf):
        t.set_taps([1, 2, 4])
    return ort, hf


def test_from_export_reads_the_manifest(pair_of_targets):
    ort, hf = pair_of_targets
    assert (ort.vocab_size, ort.hidden_size, ort.num_layers) == (hf.vocab_size, hf.hidden_size, hf.num_layers)
    assert ort.eos_token_ids == hf.eos_token_ids and ort.dtype == torch.float32


def test_right_padded_prefill_matches_hf(pair_of_targets):
    ort, hf = pair_of_targets
    prompts = [torch.tensor(p) for p in ([5, 6, 7, 8, 9, 10], [100], [42, 43, 44])]
    a, b = ort.prefill(prompts), hf.prefill(prompts)
    assert ort.lengths.tolist() == hf.lengths.tolist() == [6, 1, 3]
    torch.testing.assert_close(a.logits, b.logits, **TOL)
    valid = hf.valid.unsqueeze(-1).expand_as(b.taps)
    torch.testing.assert_close(a.taps[valid], b.taps[valid], **TOL)


@pytest.mark.parametrize("compact_ratio", [2.0, 1.0])
def test_rounds_with_rejections_match_hf(pair_of_targets, compact_ratio):
    """Verify + partial commit, different keeps per request (holes), a request dropped halfway; ratio 1.0
    compacts after nearly every round."""
    ort, hf = pair_of_targets
    ort.compact_ratio = hf.compact_ratio = compact_ratio
    g = torch.Generator().manual_seed(1)
    prompts = [torch.tensor(p) for p in ([5, 6, 7], [9], [11, 12, 13, 14, 15])]
    ort.prefill(prompts), hf.prefill(prompts)
    for round_ in range(7):
        B = ort.lengths.numel()
        Q = 2 + round_ % 3
        fed = torch.randint(0, 2400, (B, Q), generator=g)  # [B, Q]
        a, b = ort.verify(fed), hf.verify(fed)
        torch.testing.assert_close(a.logits, b.logits, **TOL)
        torch.testing.assert_close(a.taps, b.taps, **TOL)
        keep = torch.tensor([(round_ + i) % (Q + 1) for i in range(B)])  # 0 … Q kept, per request
        ort.commit(keep), hf.commit(keep)
        assert ort.lengths.tolist() == hf.lengths.tolist()
        assert ort.cached_slots() == hf.cached_slots()
        if round_ == 3:
            rows = torch.tensor([0, 2])
            ort.select(rows), hf.select(rows)
    ort.compact_ratio = hf.compact_ratio = 2.0


def test_single_request_rollback_is_by_length(pair_of_targets):
    ort, _ = pair_of_targets
    ort.prefill([torch.tensor([1, 2, 3])])
    ort.verify(torch.tensor([[4, 5, 6, 7]]))
    ort.commit(torch.tensor([2]))
    assert ort.cached_slots() == 5 and ort.lengths.tolist() == [5]  # exact rollback, no holes
    logits = ort.verify(torch.tensor([[8]])).logits
    ort.commit(torch.tensor([1]))
    fresh = OnnxRuntimeTarget.from_export(ort.onnx_path.parents[1], threads=1)
    fresh.set_taps([1, 2, 4])
    torch.testing.assert_close(fresh.prefill([torch.tensor([1, 2, 3, 4, 5, 8])]).logits[0], logits[0, 0], **TOL)


def test_buffers_grow_past_their_capacity(pair_of_targets):
    ort, hf = pair_of_targets
    prompt = [torch.arange(100) + 3]
    ort.prefill(prompt), hf.prefill(prompt)
    capacity = ort.cache.capacity
    assert capacity == 128  # the prompt and a round's headroom, in the first bucket
    for n in (12, 12):  # 100 → 112 → 124 stays within the bucket; the second round does not fit it any more
        fed = torch.arange(n).view(1, n) + 500
        torch.testing.assert_close(ort.verify(fed).logits, hf.verify(fed).logits, **TOL)
        ort.commit(torch.tensor([n])), hf.commit(torch.tensor([n]))
    assert ort.cache.capacity == 128
    fed = torch.arange(8).view(1, 8) + 900
    torch.testing.assert_close(ort.verify(fed).logits, hf.verify(fed).logits, **TOL)
    assert ort.cache.capacity == 160
    ort.commit(torch.tensor([8])), hf.commit(torch.tensor([8]))


def test_a_step_reads_the_cache_in_place(pair_of_targets):
    """Every past_key_l / past_value_l fed to onnxruntime is the cache's own layer block (same memory, no copy,
    no conversion), and a verify within the capacity allocates no cache buffer."""
    ort, _ = pair_of_targets
    ort.prefill([torch.arange(40) + 3])
    seen, run = [], ort.graph.run

    def recording_run(feeds):
        seen.append({name: (t.data_ptr(), t.dtype, t.is_contiguous()) for name, t in feeds.items()})
        return run(feeds)

    allocations = ort.cache.allocations
    ort.graph.run = recording_run
    try:
        for _ in range(3):
            ort.verify(torch.tensor([[7, 8, 9]]))
            ort.commit(torch.tensor([2]))
    finally:
        del ort.graph.run
    assert ort.cache.allocations == allocations and len(seen) == 3
    for feeds in seen:
        for layer in range(ort.num_layers):
            assert feeds[f"past_key_{layer}"] == (ort.cache.k[layer].data_ptr(), ort.cache.dtype, True)
            assert feeds[f"past_value_{layer}"] == (ort.cache.v[layer].data_ptr(), ort.cache.dtype, True)


@pytest.mark.parametrize("chunk", [1, 2, 4])
def test_chunked_prefill_matches_hf(pair_of_targets, chunk):
    """Prompts of 6, 1 and 3 tokens prefilled in chunks of ``chunk`` tokens, then a round: as transformers."""
    ort, hf = pair_of_targets
    default, ort.prefill_chunk = ort.prefill_chunk, chunk
    try:
        prompts = [torch.tensor(p) for p in ([5, 6, 7, 8, 9, 10], [100], [42, 43, 44])]
        a, b = ort.prefill(prompts), hf.prefill(prompts)
        torch.testing.assert_close(a.logits, b.logits, **TOL)
        valid = hf.valid.unsqueeze(-1).expand_as(b.taps)
        torch.testing.assert_close(a.taps[valid], b.taps[valid], **TOL)
        fed = torch.tensor([[1, 2], [3, 4], [5, 6]])
        torch.testing.assert_close(ort.verify(fed).logits, hf.verify(fed).logits, **TOL)
        ort.commit(torch.tensor([2, 1, 0])), hf.commit(torch.tensor([2, 1, 0]))
    finally:
        ort.prefill_chunk = default


def test_a_prompt_past_the_bound_is_refused_before_any_work(pair_of_targets):
    ort, _ = pair_of_targets
    ort.max_context = 16
    calls, run = [], ort.graph.run
    ort.graph.run = lambda feeds: calls.append(1) or run(feeds)
    try:
        with pytest.raises(DSparkTrtError, match="a prompt of 17 tokens exceeds the export's bound of 16 tokens"):
            ort.prefill([torch.arange(17), torch.arange(3)])
        ort.prefill([torch.arange(14)])
        with pytest.raises(DSparkTrtError, match="needs 17 KV slots but the export's bound is 16"):
            ort.verify(torch.tensor([[1, 2, 3]]))
    finally:
        ort.max_context = None
        del ort.graph.run
    assert len(calls) == 1  # the prefill of 14 tokens; the refusals ran nothing


def test_the_taps_are_the_graphs(pair_of_targets):
    ort, _ = pair_of_targets
    with pytest.raises(DSparkTrtError, match=r"exported target taps layers \[1, 2, 4\] but the drafter needs "
                                             r"\[0, 2, 4\]"):
        ort.set_taps([0, 2, 4])
    with pytest.raises(DSparkTrtError, match="verify called twice"):
        ort.prefill([torch.tensor([1, 2])])
        ort.verify(torch.tensor([[3]]))
        ort.verify(torch.tensor([[3]]))


def test_a_truncated_graph_is_a_one_line_error(qwen3_topk_export, tmp_path):
    out = tmp_path / "export"
    shutil.copytree(qwen3_topk_export, out)
    path = out / "onnx" / "target.onnx"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])
    with pytest.raises(DSparkTrtError, match="target.onnx .*damaged or incomplete: re-export it"):
        OnnxRuntimeTarget.from_export(out)


def test_an_export_with_the_stacked_cache_interface_is_refused_in_one_line(qwen3_topk_export, tmp_path):
    import json

    out = tmp_path / "export"
    shutil.copytree(qwen3_topk_export, out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["target"]["kv_interface"] == "per-layer-capacity-v1"
    del manifest["target"]["kv_interface"]  # what an export of the stacked past_key graph recorded
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DSparkTrtError, match=r"K/V interface stacked past_key \[L, B, H, P, D\], this dspark-trt "
                                             r"runs per-layer-capacity-v1; re-export the target"):
        OnnxRuntimeTarget.from_export(out)


def test_greedy_tokens_equal_transformers_across_buckets_and_chunks(qwen3_topk_export):
    """Long-ish prompts that cross capacity buckets (128, 160, 320) and prefill chunks (64 tokens), then rounds
    that grow the cache: the exported pair's greedy tokens are transformers', speculative and target-only."""
    from dspark_trt.bench.e2e import _transformers_twin
    from dspark_trt.runtime import SpeculativeDecoder

    dec = SpeculativeDecoder.from_export(qwen3_topk_export, backend="onnxruntime", device="cpu", threads=1)
    dec.target.prefill_chunk = 64
    twin = _transformers_twin(dec, qwen3_topk_export)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 2400, (n,), generator=g).tolist() for n in (1, 127, 150, 300)]
    for draft in (True, False):
        got = dec.generate(prompts, max_new_tokens=24, draft=draft)
        want = twin.generate(prompts, max_new_tokens=24, draft=draft)
        assert got.tokens == want.tokens and all(len(t) == 24 for t in got.tokens)
    assert dec.target.cache.capacity == 384  # 300 + 24 slots, plus holes: buckets 128 → … → 384
