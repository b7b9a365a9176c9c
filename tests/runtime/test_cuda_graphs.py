"""CUDA graphs per bucket: bucket choice, padding/unpadding, the fallback — pure parts on the CPU; replay on a GPU.

The padded path is the same code with or without capture (``mode="eager"``), so on the CPU a padded run
through the torch backend must give the unpadded round's results; the ``gpu`` tests check that replay gives
eager's tokens.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from dspark_trt import load_drafter
from dspark_trt.errors import DSparkTrtError
from dspark_trt.reference.markov import MarkovWalkResult
from dspark_trt.runtime.drafters.torch import TorchDrafterBackend
from dspark_trt.runtime.cuda_graphs import (BucketPolicy, GraphKey, GraphRunner, InputSpec, PadPlan, batch_buckets,
                                            bound_context_plan, cache_rows, choose_bucket, context_buckets,
                                            loaded_library_path, unpad_tree)
from dspark_trt.plugins.walk_compare import by_candidate_id


# ------------------------------------------------------------------------------------------------ buckets
def test_batch_buckets_are_powers_of_two_up_to_the_max():
    assert batch_buckets(1) == (1,)
    assert batch_buckets(8) == (1, 2, 4, 8)
    assert batch_buckets(6) == (1, 2, 4, 6)
    assert batch_buckets(64) == (1, 2, 4, 8, 16, 32, 64)
    with pytest.raises(DSparkTrtError):
        batch_buckets(0)


def test_context_buckets_start_small_and_end_at_the_max():
    assert context_buckets(1000, smallest=128) == (128, 256, 512, 1000)
    assert context_buckets(64, smallest=128) == (64,)
    assert context_buckets(4096)[-1] == 4096


@pytest.mark.parametrize("n,want", [(0, 1), (1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (8, 8)])
def test_choose_bucket_takes_the_smallest_that_fits(n, want):
    assert choose_bucket(n, batch_buckets(8)) == want


def test_a_batch_beyond_the_largest_bucket_is_a_one_line_error():
    with pytest.raises(DSparkTrtError, match="exceeds the largest captured batch bucket 8") as e:
        choose_bucket(9, batch_buckets(8))
    assert "\n" not in str(e.value)


def test_policy_plans_batch_and_context_together():
    plan = BucketPolicy(max_batch=8, max_context=1024).plan(3, 300)
    assert (plan.batch, plan.bucket, plan.context, plan.context_bucket) == (3, 4, 300, 512)
    assert plan.padded and not BucketPolicy(8, 1024).plan(4, 128).padded
    assert BucketPolicy(max_batch=4).plan(3) == PadPlan(3, 4)


# ------------------------------------------------------------------------------------------------ padding
def test_load_pads_batch_and_context_with_their_fills():
    spec = InputSpec("kv", (2, 0, 0, 3), torch.float32, batch_dim=1, context_dim=2, batch_fill=-1, context_fill=-2)
    plan = PadPlan(batch=2, bucket=4, context=3, context_bucket=5)
    static = torch.full(plan.shape(spec), float("nan"))
    assert static.shape == (2, 4, 5, 3)
    value = torch.randn(2, 2, 3, 3)
    plan.load(spec, static, value)
    assert torch.equal(static[:, :2, :3], value)
    assert (static[:, :2, 3:] == -2).all() and (static[:, 2:] == -1).all()


def test_load_keeps_the_new_slots_last_after_the_context_padding():
    # attention_mask [B, P + Q]: past slots padded in the middle, the Q new tokens stay at the end
    spec = InputSpec("attention_mask", (0, 0), torch.int64, batch_dim=0, context_dim=1, batch_fill=1,
                     context_fill=0, context_extra=2)
    plan = PadPlan(batch=1, bucket=2, context=3, context_bucket=4)
    static = torch.full(plan.shape(spec), 7, dtype=torch.int64)
    plan.load(spec, static, torch.tensor([[1, 0, 1, 1, 1]]))
    assert static.tolist() == [[1, 0, 1, 0, 1, 1], [1, 1, 1, 1, 1, 1]]


def test_load_rejects_a_shape_that_is_not_the_plans():
    spec = InputSpec("anchor", (0,), torch.int64)
    with pytest.raises(DSparkTrtError, match="anchor has shape"):
        PadPlan(3, 4).load(spec, torch.zeros(4, dtype=torch.int64), torch.zeros(2, dtype=torch.int64))


def test_unpad_returns_copies_of_the_real_rows():
    plan = PadPlan(2, 4)
    static = torch.arange(8).view(4, 2)
    tree = MarkovWalkResult(tokens=static, cand_ids=static, cand_logits=static.float(), confidence=None)
    out = unpad_tree(tree, plan)
    assert out.tokens.tolist() == [[0, 1], [2, 3]] and out.confidence is None
    static.zero_()  # the next replay overwrites the static buffer: the result must not change
    assert out.tokens.tolist() == [[0, 1], [2, 3]]
    assert unpad_tree({"a": (static, 3)}, plan)["a"][1] == 3


def test_graph_key_is_frozen_and_hashable():
    k = GraphKey("draft", 4, 256, (512,))
    assert {k: 1}[GraphKey("draft", 4, 256, (512,))] == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        k.batch = 8  # type: ignore[misc]


def test_loaded_library_path_reads_proc_maps():
    maps = ("7f00-7f01 r-xp 00000000 08:01 12 /usr/lib/libc.so.6\n"
            "7f02-7f03 r-xp 00000000 08:01 13 /venv/nvidia/cu13/lib/libcudart.so.13\n")
    assert loaded_library_path(maps, "cudart") == "/venv/nvidia/cu13/lib/libcudart.so.13"
    assert loaded_library_path(maps, "cublas") is None


# ------------------------------------------------------------------------------------------------ runner
def test_runner_on_cpu_runs_the_padded_path_eagerly_once_per_key():
    calls = []

    def fn(x, key):
        calls.append((key, tuple(x["v"].shape)))
        return x["v"] * 2

    runner = GraphRunner(fn, (InputSpec("v", (0, 3), torch.float32),), role="draft", device="cpu", mode="graph")
    assert runner.mode == "eager"  # no CUDA: the same padded path, no capture
    v = torch.randn(3, 3)
    out = runner(PadPlan(3, 4), {"v": v})
    assert torch.equal(out, v * 2) and calls == [(GraphKey("draft", 4), (4, 3))]
    runner(PadPlan(2, 4), {"v": v[:2]})
    assert list(runner.entries) == [GraphKey("draft", 4)]  # one static buffer set per bucket


def test_a_failed_capture_warns_once_and_that_key_runs_eagerly():
    runner = GraphRunner(lambda x, k: x["v"] + 1, (InputSpec("v", (0,), torch.float32),), role="draft", device="cpu")
    a, b = (runner._new_entry(PadPlan(1, n), ()) for n in (1, 2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runner.fall_back(a, RuntimeError("operation not permitted when stream is capturing\nmore"))
        runner.fall_back(b, RuntimeError("again"))
    assert len(caught) == 1 and "draft round failed (RuntimeError: operation not permitted" in str(caught[0].message)
    assert a.eager_reason.startswith("RuntimeError") and a.graph is None and b.eager_reason == "RuntimeError: again"
    runner.entries[a.key] = a
    runner.mode = "graph"  # even in graph mode, a key that failed runs its round eagerly
    assert runner(PadPlan(1, 1), {"v": torch.tensor([2.0])}).tolist() == [3.0]


def test_clearing_the_cuda_error_without_a_cuda_runtime_is_a_no_op():
    from dspark_trt.runtime.cuda_graphs import clear_cuda_error

    if torch.cuda.is_available():
        pytest.skip("a CUDA runtime is loaded")
    assert clear_cuda_error() is None


def test_bound_inputs_are_the_callers_buffers_never_copied():
    """A bound input (the target's K/V cache) reaches the round as the caller's very tensor; the other inputs
    are padded into the bucket's buffers as usual."""
    seen = []

    def fn(x, key):
        seen.append(x["cache"])
        return x["ids"].float().sum(1, keepdim=True) + x["cache"].sum((1, 2)).view(-1, 1)

    specs = (InputSpec("ids", (0, 2), torch.int64), InputSpec("cache", (0, 0, 3), torch.float32, 0, 1, bound=True))
    runner = GraphRunner(fn, specs, role="target", device="cpu")
    cache = torch.randn(4, 8, 3)  # 4 rows (the batch bucket), 8 slots (the capacity)
    out = runner(PadPlan(3, 4, 5, 8), {"ids": torch.ones(3, 2, dtype=torch.int64), "cache": cache})
    assert seen[-1] is cache and "cache" not in runner._new_entry(PadPlan(3, 4, 5, 8), ()).inputs
    torch.testing.assert_close(out, 2 + cache[:3].sum((1, 2)).view(3, 1))
    with pytest.raises(DSparkTrtError, match=r"bound input cache is \(4, 8, 3\).*binds \(4, 16, 3\)"):
        runner(PadPlan(3, 4, 5, 16), {"ids": torch.ones(3, 2, dtype=torch.int64), "cache": cache})
    with pytest.raises(DSparkTrtError, match="not contiguous"):
        runner(PadPlan(3, 4, 5, 8), {"ids": torch.ones(3, 2, dtype=torch.int64),
                                     "cache": torch.randn(4, 3, 8).transpose(1, 2)})


def test_an_unindexed_device_is_the_current_one():
    """The backends are configured with ``"cuda"``; a tensor there reports ``cuda:<index>``, and
    ``torch.device("cuda") != torch.device("cuda:0")``: comparing them as is refused every bound cache
    (the TensorRT target's and drafter's) on the GPU."""
    from dspark_trt.runtime.cuda_graphs import same_device

    assert torch.device("cuda") != torch.device("cuda:0")  # why the helper exists
    assert same_device("cuda:0", "cuda", current=0) and same_device("cuda", "cuda:1", current=1)
    assert not same_device("cuda:1", "cuda", current=0) and not same_device("cuda:0", "cuda:1", current=0)
    assert same_device("cpu", torch.device("cpu")) and not same_device("cpu", "cuda:0", current=0)


def test_a_moved_bound_buffer_drops_the_captured_graph():
    from dspark_trt.runtime.cuda_graphs import GraphEntry, rebind

    a, b = torch.zeros(2, 4), torch.zeros(2, 4)
    entry = GraphEntry(GraphKey("target", 2, 4), {"ids": torch.zeros(2)})
    assert not rebind(entry, {"cache": a})  # first binding, nothing captured yet
    entry.graph = object()  # captured with ``a``
    assert not rebind(entry, {"cache": a}) and entry.inputs["cache"] is a
    assert rebind(entry, {"cache": b}) and entry.inputs["cache"] is b  # moved: capture again


def test_runner_needs_every_input():
    runner = GraphRunner(lambda x, k: x, (InputSpec("v", (0,), torch.float32),), role="t", device="cpu")
    with pytest.raises(DSparkTrtError, match="missing inputs"):
        runner(PadPlan(1, 1), {})


# ----------------------------------------------------------------------------- torch backend, padded path
@pytest.fixture(scope="module")
def drafter(random_pair):
    return load_drafter(random_pair.drafter, target_dir=random_pair.target)


def _round_inputs(drafter, B, T, seed=0, device="cpu"):
    c = drafter.config
    g = torch.Generator().manual_seed(seed)
    taps = torch.randn(B, T, c.num_taps * c.hidden_size, generator=g)
    k, v = drafter.context_kv(taps, torch.arange(T).expand(B, T))
    ctx_len = torch.randint(1, T + 1, (B,), generator=g)
    ctx_len[0] = T
    anchor = torch.randint(0, c.vocab_size, (B,), generator=g)
    temperature = torch.tensor([0.0, 1.0, 0.7, 0.0, 1.3][:B])
    seeds = torch.randint(0, 2**40, (B,), generator=g)
    return [t.to(device) for t in (anchor, k, v, ctx_len, temperature, seeds)]


@pytest.mark.parametrize("B,T,topk", [(3, 9, 16), (1, 5, None), (5, 130, 2500)])
def test_a_padded_round_gives_the_unpadded_results(drafter, B, T, topk):
    anchor, k, v, ctx_len, temperature, seeds = _round_inputs(drafter, B, T)
    plain = TorchDrafterBackend(drafter, graphs="off", walk_fn=None)
    padded = TorchDrafterBackend(drafter, graphs="eager", max_batch=8, max_context=512)
    # the reference walk on both sides: the CPU kernels' candidate order is not part of the contract
    from dspark_trt.reference.markov import walk_candidates
    plain.walk_fn = padded.walk_fn = walk_candidates
    kw = dict(topk=topk, temperature=temperature, seed=seeds)
    want = by_candidate_id(plain.draft(anchor, k, v, ctx_len, **kw))  # order among near-equal values may differ
    got = by_candidate_id(padded.draft(anchor, k, v, ctx_len, **kw))
    (key,) = padded._runner.entries
    assert key.batch == (4 if B == 3 else 8 if B == 5 else 1) and key.context == (128 if T < 128 else 256)
    assert got.tokens.shape == want.tokens.shape == (B, drafter.config.num_draft_tokens)
    assert torch.equal(got.tokens, want.tokens)
    assert torch.equal(got.cand_ids, want.cand_ids)
    torch.testing.assert_close(got.cand_logits, want.cand_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.confidence, want.confidence, rtol=1e-5, atol=1e-6)


def test_a_cache_of_the_bucket_s_rows_is_bound_in_its_own_bucket():
    k = torch.zeros(2, 4, 3, 160, 8)  # [L, rows, H_kv, capacity, D]: a DrafterState's buffers, heads first
    plan = dict(batch_dim=1, context_dim=3, max_batch=8, max_context=512)
    assert bound_context_plan(3, k, k.clone(), **plan) == PadPlan(3, 4, 160, 160)
    assert bound_context_plan(4, k, k.clone(), **plan) == PadPlan(4, 4, 160, 160)
    assert bound_context_plan(2, k, k.clone(), **plan) is None  # 2 requests keep 2 rows: not this cache
    assert bound_context_plan(3, k, k.clone(), **{**plan, "max_context": 128}) is None  # past the buckets
    assert bound_context_plan(3, k, k.clone(), **{**plan, "max_batch": 2}) is None
    assert bound_context_plan(3, k, k.transpose(2, 3).contiguous().transpose(2, 3), **plan) is None  # a strided view
    assert bound_context_plan(3, k, k[:, :, :, :128], **plan) is None  # K and V of different shapes
    assert cache_rows(3, 8) == 4 and cache_rows(9, 8) == 9
    # TensorRT binds addresses that are multiples of 256 bytes: every layer's block must start at one
    from dspark_trt.runtime.tensorrt_engine import aligned_empty

    def cache(capacity):  # [L, rows, H_kv, capacity, D] bf16 at an aligned address: a layer is capacity·64 bytes
        return aligned_empty((2, 1, 1, capacity, 32), torch.bfloat16).zero_()

    assert bound_context_plan(1, cache(129), cache(129), **plan) == PadPlan(1, 1, 129, 129)
    assert bound_context_plan(1, cache(129), cache(129), **plan, alignment=256) is None  # layer 1 at 8256 bytes
    assert bound_context_plan(1, cache(128), cache(128), **plan, alignment=256) == PadPlan(1, 1, 128, 128)
    shifted = aligned_empty((2 * 128 * 32 + 32,), torch.bfloat16).zero_()[32:].view(2, 1, 1, 128, 32)  # +64 bytes
    assert bound_context_plan(1, cache(128), shifted, **plan) == PadPlan(1, 1, 128, 128)
    assert bound_context_plan(1, cache(128), shifted, **plan, alignment=256) is None


@pytest.mark.parametrize("B,T,topk", [(3, 9, 16), (5, 130, 2500)])
def test_a_drafter_state_of_the_bucket_s_rows_is_bound_not_copied(drafter, B, T, topk):
    """With graphs, a ``DrafterState`` of ``state_rows(B)`` rows is the round's context itself: the bucket is its
    (rows, capacity), the runner's ``ctx_k``/``ctx_v`` are its buffers (the same storage: nothing copied), and the
    drafts equal the plain round's over the caller's tensors — with the spare rows poisoned. When the cache moves
    (it grew), the graphs bound to the old buffers are dropped and the new ones bound; a caller's own tensors
    of B rows are still copied into a context bucket."""
    from dspark_trt.reference.markov import walk_candidates
    from dspark_trt.runtime.drafter_state import DrafterState

    c = drafter.config
    anchor, k, v, ctx_len, temperature, seeds = _round_inputs(drafter, B, T)
    plain = TorchDrafterBackend(drafter, graphs="off")
    padded = TorchDrafterBackend(drafter, graphs="eager", max_batch=8, max_context=512)
    plain.walk_fn = padded.walk_fn = walk_candidates
    rows = padded.state_rows(B)
    assert rows == (4 if B == 3 else 8) and plain.state_rows(B) == B
    state = DrafterState(c.num_hidden_layers, B, T, c.num_key_value_heads, c.head_dim, dtype=k.dtype,
                         device=k.device, rows=rows)
    state.append(k, v, ctx_len)
    state.k[:, B:], state.v[:, B:] = 1e3, -1e3  # the spare rows: never a real request's context
    kw = dict(topk=topk, temperature=temperature, seed=seeds)
    want = by_candidate_id(plain.draft(anchor, k, v, ctx_len, **kw))
    got = by_candidate_id(padded.draft(anchor, *state.context(), state.ctx_len, **kw))
    assert padded._runner is None  # nothing went through the copying path
    (entry,) = padded._bound_runner.entries.values()
    assert (entry.key.batch, entry.key.context) == (rows, state.capacity)
    assert entry.inputs["ctx_k"].data_ptr() == state.k.data_ptr()
    assert entry.inputs["ctx_v"].data_ptr() == state.v.data_ptr()
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.cand_ids, want.cand_ids)
    torch.testing.assert_close(got.cand_logits, want.cand_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.confidence, want.confidence, rtol=1e-5, atol=1e-6)
    state._grow(state.capacity + 1)  # the cache moves to the next bucket
    again = by_candidate_id(padded.draft(anchor, *state.context(), state.ctx_len, **kw))
    (entry,) = padded._bound_runner.entries.values()  # the old bucket's graph is gone with the old buffers
    assert entry.key.context == state.capacity and entry.inputs["ctx_k"].data_ptr() == state.k.data_ptr()
    assert torch.equal(again.tokens, want.tokens)
    padded.draft(anchor, k, v, ctx_len, **kw)
    assert padded._runner is not None and len(padded._runner.entries) == 1
    copying = TorchDrafterBackend(drafter, graphs="eager", max_batch=8, max_context=512, bind_context=False)
    copying.walk_fn = walk_candidates  # the same state, copied into a context bucket as before
    assert torch.equal(copying.draft(anchor, *state.context(), state.ctx_len, **kw).tokens, want.tokens)
    assert copying._bound_runner is None and copying._runner is not None


def test_padded_greedy_round_without_temperature_matches(drafter):
    anchor, k, v, ctx_len, _, _ = _round_inputs(drafter, 2, 7, seed=4)
    plain = TorchDrafterBackend(drafter, graphs="off")
    padded = TorchDrafterBackend(drafter, graphs="eager")
    from dspark_trt.reference.markov import walk_candidates
    plain.walk_fn = padded.walk_fn = walk_candidates
    want = plain.draft(anchor, k, v, ctx_len, topk=16, temperature=None, seed=None)
    got = padded.draft(anchor, k, v, ctx_len, topk=16, temperature=None, seed=None)
    assert torch.equal(got.tokens, want.tokens)


def test_beyond_the_buckets_the_round_runs_unpadded(drafter):
    anchor, k, v, ctx_len, temperature, seeds = _round_inputs(drafter, 3, 9)
    backend = TorchDrafterBackend(drafter, graphs="eager", max_batch=2)
    backend.draft(anchor, k, v, ctx_len, topk=16, temperature=temperature, seed=seeds)
    assert backend._runner is None


def test_bad_graph_mode_is_refused(drafter):
    with pytest.raises(DSparkTrtError, match="graphs='always'"):
        TorchDrafterBackend(drafter, graphs="always")  # type: ignore[arg-type]


def test_auto_is_off_on_cpu(drafter):
    assert TorchDrafterBackend(drafter).graphs == "off"


# ------------------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.triton
@pytest.mark.parametrize("B", [1, 3, 4, 8])
def test_graph_replay_equals_eager_token_for_token(random_pair, B):
    drafter = load_drafter(random_pair.drafter, target_dir=random_pair.target, device="cuda", dtype="bf16")
    graphed = TorchDrafterBackend(drafter, graphs="graph")
    eager = TorchDrafterBackend(drafter, graphs="eager")
    for seed in range(3):  # replays with new inputs and new noise keys
        anchor, k, v, ctx_len, temperature, seeds = _round_inputs(drafter, B, 40 + seed, seed=seed, device="cuda")
        kw = dict(topk=16, temperature=temperature, seed=seeds)
        want = eager.draft(anchor, k, v, ctx_len, **kw)
        got = graphed.draft(anchor, k, v, ctx_len, **kw)
        assert torch.equal(got.tokens, want.tokens)
    entry = next(iter(graphed._runner.entries.values()))
    assert entry.graph is not None and entry.eager_reason is None


@pytest.mark.gpu
@pytest.mark.triton
def test_a_bound_graph_reads_the_cache_as_it_is_now(random_pair):
    """Captured once for the ``DrafterState``'s (rows, capacity) with its buffers bound: the rows appended in
    place after the capture are what each replay reads (replay == the padded eager round over the same state,
    round after round), and nothing goes through the copying runner."""
    from dspark_trt.runtime.drafter_state import DrafterState

    drafter = load_drafter(random_pair.drafter, target_dir=random_pair.target, device="cuda", dtype="bf16")
    c = drafter.config
    graphed = TorchDrafterBackend(drafter, graphs="graph")
    eager = TorchDrafterBackend(drafter, graphs="eager")
    B = 3
    anchor, k, v, ctx_len, temperature, seeds = _round_inputs(drafter, B, 40, device="cuda")
    state = DrafterState(c.num_hidden_layers, B, 64, c.num_key_value_heads, c.head_dim, dtype=k.dtype,
                         device=k.device, rows=graphed.state_rows(B))
    state.append(k, v, ctx_len)
    kw = dict(topk=16, temperature=temperature, seed=seeds)
    g = torch.Generator(device="cuda").manual_seed(5)
    for _ in range(4):
        want = eager.draft(anchor, *state.context(), state.ctx_len, **kw)
        got = graphed.draft(anchor, *state.context(), state.ctx_len, **kw)
        assert torch.equal(got.tokens, want.tokens)
        new = torch.randn(c.num_hidden_layers, B, 3, c.num_key_value_heads, c.head_dim, generator=g, device="cuda")
        state.append(new.to(k.dtype), -new.to(k.dtype), torch.full((B,), 3, device="cuda"))  # in place
    (entry,) = graphed._bound_runner.entries.values()
    assert entry.graph is not None and entry.key.batch == 4 and graphed._runner is None


@pytest.mark.gpu
def test_a_failing_capture_falls_back_to_eager_with_one_warning():
    def fn(x, key):
        y = x["v"] + 1
        if torch.cuda.is_current_stream_capturing():
            y.sum().item()  # a host sync: capture fails
        return y

    runner = GraphRunner(fn, (InputSpec("v", (0,), torch.float32),), role="draft", device="cuda")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            out = runner(PadPlan(2, 2), {"v": torch.ones(2, device="cuda")})
            assert out.tolist() == [2.0, 2.0]
        runner(PadPlan(1, 1), {"v": torch.ones(1, device="cuda")})
    assert sum("running it eagerly" in str(w.message) for w in caught) == 1
    assert [k.batch for k, _ in runner.fallbacks] == [2, 1] and not runner.captured and runner.captures == 0
    torch.cuda.synchronize()  # no sticky error left behind


def test_dropping_entries_releases_their_bound_buffers():
    import weakref

    spec = InputSpec("cache", (0, 3), torch.float32, 0, None, bound=True)
    runner = GraphRunner(lambda x, key: x["cache"].sum(1), (spec,), role="target", device="cpu")
    old = torch.zeros(2, 3)
    runner(PadPlan(2, 2), {"cache": old})
    runner(PadPlan(1, 1), {"cache": torch.zeros(1, 3)})
    gone = weakref.ref(old)
    del old
    assert gone() is not None  # an entry still binds it
    assert runner.drop(lambda key: key.batch == 2) == 1 and list(runner.entries) == [GraphKey("target", 1)]
    assert gone() is None


def _graph_mode_runner(fn, **kw) -> GraphRunner:
    """A runner that claims graph mode on the CPU (its capture logic runs up to the first CUDA call)."""
    runner = GraphRunner(fn, (InputSpec("v", (0,), torch.float32),), role="draft", device="cpu", **kw)
    runner.mode = "graph"
    return runner


def _fails_in_warm_up(x, key):
    raise RuntimeError("CUDA error: operation not permitted when stream is capturing\ndetails")


def test_a_capture_that_fell_back_is_remembered_and_the_runner_is_not_captured():
    runner = _graph_mode_runner(_fails_in_warm_up)
    assert not runner.captured and "no draft graph was captured" in runner.why_not_captured()
    entry = runner.entries[runner.key(PadPlan(2, 2))] = runner._new_entry(PadPlan(2, 2), ())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runner._capture(entry)
    assert len(caught) == 1 and entry.graph is None and entry.eager_reason.startswith("RuntimeError: CUDA error")
    assert runner.fallbacks == [(GraphKey("draft", 2), entry.eager_reason)] and runner.captures == 0
    runner.drop(lambda key: True)  # forgetting the entry does not forget that it fell back
    assert not runner.captured
    why = runner.why_not_captured()
    assert why.startswith("the draft round fell back to eager at bucket (batch 2, context 0): RuntimeError")
    runner.captures = 1  # even with graphs captured elsewhere, one fall-back means not captured
    assert not runner.captured and "fell back" in runner.why_not_captured()
    runner.fallbacks.clear()
    assert runner.captured and runner.why_not_captured() is None
    eager = GraphRunner(_fails_in_warm_up, (), role="target", device="cpu")
    assert not eager.captured and "runs eagerly" in eager.why_not_captured()


def test_a_strict_runner_raises_when_a_capture_fails():
    runner = _graph_mode_runner(_fails_in_warm_up, strict=True)
    entry = runner._new_entry(PadPlan(1, 4), ())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning either
        with pytest.raises(DSparkTrtError, match=r"capture of the draft round at bucket \(batch 4, context 0\) "
                                                 r"failed \(RuntimeError: CUDA error") as e:
            runner._capture(entry)
    assert "graphs='eager'" in str(e.value) and "\n" not in str(e.value)
    assert runner.fallbacks == [] and entry.eager_reason is None and not runner.captured


def test_the_rounds_own_error_is_no_capture_failure():
    """A one-line DSparkTrtError of the round (a TensorRT profile refused during warm-up) propagates: eagerly
    it would raise the same, so falling back would only hide it."""
    def fn(x, key):
        raise DSparkTrtError("TensorRT could not select optimization profile 1 of the target engine")

    runner = _graph_mode_runner(fn)
    entry = runner._new_entry(PadPlan(1, 1), ())
    with pytest.raises(DSparkTrtError, match="optimization profile 1"):
        runner._capture(entry)
    assert runner.fallbacks == [] and entry.eager_reason is None
