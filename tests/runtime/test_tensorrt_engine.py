"""TensorRT engines in the runtime: the pure parts (version checks, buffer plans from the manifest I/O, the
padding specs) on the CPU; the engines themselves on a GPU host with TensorRT (marked, skipped here).

The padding specs derived from a real exported draft graph's I/O are run through the graph runner with
onnxruntime executing the graph (on the CPU, eagerly): a padded round gives the unpadded results.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from dspark_trt.errors import DSparkTrtError
from dspark_trt.runtime.cuda_graphs import BucketPolicy, GraphRunner
from dspark_trt.runtime.tensorrt_engine import (TENSOR_ALIGNMENT, TORCH_DTYPES, ContextCache, EngineTensor, Profile,
                                                aligned, aligned_empty, bind_inputs, check_engine_io,
                                                check_engine_version, choose_profile, engine_entry, input_specs,
                                                io_tensors, output_batch_dims, plan_io, require_tensorrt,
                                                tensorrt_available, trt_enum_name)

DRAFT_IO = {
    "inputs": [{"name": "anchor", "dtype": "int32", "shape": ["B"]},
               {"name": "ctx_key_0", "dtype": "bfloat16", "shape": ["B", 2, "T", 16]},  # per layer, heads first
               {"name": "ctx_key_1", "dtype": "bfloat16", "shape": ["B", 2, "T", 16]},
               {"name": "ctx_value_0", "dtype": "bfloat16", "shape": ["B", 2, "T", 16]},
               {"name": "ctx_value_1", "dtype": "bfloat16", "shape": ["B", 2, "T", 16]},
               {"name": "ctx_len", "dtype": "int32", "shape": ["B"]},
               {"name": "ctx_start", "dtype": "int32", "shape": ["B"]},
               {"name": "temperature", "dtype": "float32", "shape": ["B"]},
               {"name": "seed", "dtype": "int32", "shape": ["B"]}],
    "outputs": [{"name": "draft_tokens", "dtype": "int32", "shape": ["B", 7]},
                {"name": "cand_ids", "dtype": "int32", "shape": ["B", 7, 512]},
                {"name": "cand_logits", "dtype": "float32", "shape": ["B", 7, 512]}],
}
#: CONTRACT.md's target graph
TARGET_IO = {
    "inputs": [{"name": "input_ids", "dtype": "int64", "shape": ["B", "Q"]},
               {"name": "position_ids", "dtype": "int64", "shape": ["B", "Q"]},
               {"name": "attention_mask", "dtype": "int64", "shape": ["B", "PQ"]},
               {"name": "past_key", "dtype": "bfloat16", "shape": [4, "B", 8, "P", 128]},
               {"name": "past_value", "dtype": "bfloat16", "shape": [4, "B", 8, "P", 128]}],
    "outputs": [{"name": "logits", "dtype": "float32", "shape": ["B", "Q", 151936]},
                {"name": "taps", "dtype": "bfloat16", "shape": ["B", "Q", 12288]},
                {"name": "new_key", "dtype": "bfloat16", "shape": [4, "B", 8, "Q", 128]},
                {"name": "new_value", "dtype": "bfloat16", "shape": [4, "B", 8, "Q", 128]}],
}


# ----------------------------------------------------------------------------------------- version checks
def entry(version="10.13.0.35", vc=False, flavor="tensorrt"):
    return {"file": "engines/draft.plan", "flavor": flavor, "version": version,
            "build": {"version_compatible": vc, "batch": {"min": 1, "opt": 8, "max": 8}}}


def test_a_plan_runs_only_on_its_exact_version():
    assert check_engine_version(entry("10.13.0.35"), "10.13.0.35") is False
    with pytest.raises(DSparkTrtError, match="built with TensorRT 10.13.0.35 and TensorRT 10.13.2.6 is installed") as e:
        check_engine_version(entry("10.13.0.35"), "10.13.2.6")
    assert "dspark build-engine OUT --force" in str(e.value) and "\n" not in str(e.value)


def test_a_version_compatible_plan_needs_host_code_and_the_same_major():
    assert check_engine_version(entry("10.9.0.34", vc=True), "10.13.0.35") is True  # later minor: fine
    with pytest.raises(DSparkTrtError, match="version-compatible with TensorRT 10.x"):
        check_engine_version(entry("10.9.0.34", vc=True), "11.1.0.2")
    with pytest.raises(DSparkTrtError, match="version-compatible"):
        check_engine_version(entry("10.13.0.35", vc=True), "10.9.0.34")  # older runtime


def test_rtx_engines_and_missing_versions_are_refused():
    with pytest.raises(DSparkTrtError, match="tensorrt-rtx engine"):
        check_engine_version(entry(flavor="tensorrt-rtx"), "10.13.0.35")
    with pytest.raises(DSparkTrtError, match="records no TensorRT version"):
        check_engine_version(entry(version=None), "10.13.0.35")


def test_engine_entry_finds_drafter_and_target_engines():
    manifest = {"engines": {"draft.tensorrt": entry(), "context.tensorrt": entry(),
                            "target.tensorrt": {**entry(), "file": "engines/target.plan"}},
                "target": {"engines": ["engines/target.plan"]}}
    assert engine_entry(manifest, "draft")["file"] == "engines/draft.plan"
    assert engine_entry(manifest, "target")["file"] == "engines/target.plan"
    with pytest.raises(DSparkTrtError, match="no TensorRT draft engine; build it on the GPU host"):
        engine_entry({"engines": {}}, "draft")


# ------------------------------------------------------------------------------------------- buffer plans
def test_buffer_plan_of_the_draft_graph():
    plan = plan_io(io_tensors(DRAFT_IO), {"B": 4, "T": 256})
    assert plan["ctx_key_1"] == ((4, 2, 256, 16), torch.bfloat16)
    assert plan["anchor"] == ((4,), torch.int32)
    assert plan["cand_logits"] == ((4, 7, 512), torch.float32)


def test_buffer_plan_of_the_contract_target_graph():
    tensors = io_tensors(TARGET_IO)
    plan = plan_io(tensors, {"B": 2, "Q": 8, "P": 1024}, extra={"attention_mask": 1032})
    assert plan["attention_mask"] == ((2, 1032), torch.int64)
    assert plan["past_key"] == ((4, 2, 8, 1024, 128), torch.bfloat16)
    assert plan["new_value"] == ((4, 2, 8, 8, 128), torch.bfloat16)
    assert output_batch_dims(tensors) == {"logits": 0, "taps": 0, "new_key": 1, "new_value": 1}
    with pytest.raises(DSparkTrtError, match=r"attention_mask has dimension 'PQ' \(axis 1\)"):
        plan_io(tensors, {"B": 2, "Q": 8, "P": 1024})


def test_io_with_an_unbindable_dtype_is_refused():
    bad = {"inputs": [{"name": "x", "dtype": "complex64", "shape": ["B"]}], "outputs": DRAFT_IO["outputs"]}
    with pytest.raises(DSparkTrtError, match="cannot bind"):
        io_tensors(bad)
    with pytest.raises(DSparkTrtError, match="no inputs or no outputs"):
        io_tensors({"inputs": DRAFT_IO["inputs"], "outputs": []})


def test_padding_specs_from_the_manifest_io():
    specs = {s.name: s for s in input_specs(io_tensors(TARGET_IO), "B", "P", {"attention_mask": (1, 0)})}
    assert (specs["past_key"].batch_dim, specs["past_key"].context_dim) == (1, 3)
    assert (specs["input_ids"].batch_dim, specs["input_ids"].context_dim) == (0, None)
    assert specs["attention_mask"].batch_fill == 1 and specs["attention_mask"].context_fill == 0


@pytest.mark.onnx
def test_a_padded_draft_graph_round_gives_the_unpadded_results(onnx_export, tiny_pair):
    """The draft graph's own I/O → padding specs → graph runner (eager), onnxruntime executing the graph."""
    from dspark_trt.artifact.manifest import graph_io
    from dspark_trt.runtime.ort_session import OrtGraph

    path = onnx_export(tiny_pair, "fp32", 16)
    graph = OrtGraph(path / "onnx" / "draft.onnx")
    tensors = io_tensors(graph_io(path / "onnx" / "draft.onnx"))
    runner = GraphRunner(lambda x, key: graph.run(x), input_specs(tensors, "B", "T"), role="draft", device="cpu",
                         output_batch_dims=output_batch_dims(tensors))
    g = torch.Generator().manual_seed(0)
    ck = torch.randn(2, 3, 2, 11, 16, generator=g)  # [L, B, H_kv, T, D]
    cv = torch.randn_like(ck)
    feeds = {**{f"ctx_key_{i}": ck[i] for i in range(2)}, **{f"ctx_value_{i}": cv[i] for i in range(2)},
             "anchor": torch.tensor([5, 7, 9], dtype=torch.int32),
             "ctx_len": torch.tensor([11, 4, 1], dtype=torch.int32),
             "ctx_start": torch.tensor([2, 0, 0], dtype=torch.int32),
             "temperature": torch.tensor([0.0, 1.0, 0.6]),
             "seed": torch.tensor([1, 2, 3], dtype=torch.int32)}
    plan = BucketPolicy(max_batch=8, max_context=64, smallest_context=16).plan(3, 11)
    assert (plan.bucket, plan.context_bucket) == (4, 16)
    want = graph.run(feeds)
    got = runner(plan, feeds)
    assert set(got) == set(want)
    for name in want:
        assert got[name].shape == want[name].shape, name
    assert torch.equal(got["draft_tokens"], want["draft_tokens"])
    assert torch.equal(got["cand_ids"].sort(-1).values, want["cand_ids"].sort(-1).values)
    torch.testing.assert_close(got["cand_logits"].sort(-1).values, want["cand_logits"].sort(-1).values,
                               rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------- engine I/O against the manifest
TRT_NAMES = {"float32": "FLOAT", "float16": "HALF", "bfloat16": "BF16", "int32": "INT32", "int64": "INT64"}


def engine_io(io, **changes) -> list[EngineTensor]:
    """What a deserialized engine built from ``io`` reports (-1 for symbolic dimensions), with ``changes``
    {name: EngineTensor field overrides} (None: the tensor is absent)."""
    out = []
    for side, is_input in (("inputs", True), ("outputs", False)):
        for t in io[side]:
            fields = dict(name=t["name"], is_input=is_input, dtype=t["dtype"],
                          shape=tuple(d if isinstance(d, int) else -1 for d in t["shape"]))
            change = changes.get(t["name"], {})
            if change is not None:
                out.append(EngineTensor(**{**fields, **change}))
    return out


def test_trt_enum_names_map_onto_the_manifest_dtypes():
    from dspark_trt.runtime.tensorrt_engine import TRT_DTYPES

    class Member:  # a pybind11 enum member has .name; older bindings print as DataType.BF16
        name = "BF16"

    assert trt_enum_name(Member()) == "BF16" and trt_enum_name("DataType.HALF") == "HALF"
    assert {TRT_DTYPES[TRT_NAMES[k]] for k in TRT_NAMES} == set(TRT_NAMES)
    assert set(TRT_DTYPES.values()) == set(TORCH_DTYPES)  # every dtype the manifest can name, both ways


def test_an_engine_with_the_manifests_io_is_accepted():
    for io in (DRAFT_IO, TARGET_IO):
        check_engine_io(engine_io(io), io_tensors(io))
    reordered = list(reversed(engine_io(DRAFT_IO)))  # binding order is the engine's business
    check_engine_io(reordered, io_tensors(DRAFT_IO))


@pytest.mark.parametrize("changes, message", [
    ({"cand_logits": {"dtype": "float16"}}, "cand_logits is float16, the manifest says float32"),
    ({"logits": {"dtype": "bfloat16"}}, "logits is bfloat16, the manifest says float32"),
    ({"ctx_key_0": {"shape": (-1, 2, -1)}}, r"ctx_key_0 has rank 3, the manifest's shape \['B', 2, 'T', 16\] rank 4"),
    ({"draft_tokens": {"shape": (-1, 8)}}, "draft_tokens dimension 1 is 8, the manifest says 7"),
    ({"cand_ids": None}, "the manifest's output cand_ids is missing"),
    ({"seed": {"is_input": False}}, "seed is an output, the manifest has an input"),
])
def test_an_engine_whose_io_differs_from_the_manifest_is_refused_in_one_line(changes, message):
    """Output buffers are sized and typed from the manifest: another graph's plan would be written past them."""
    io = TARGET_IO if "logits" in changes else DRAFT_IO
    with pytest.raises(DSparkTrtError, match=message) as e:
        check_engine_io(engine_io(io, **changes), io_tensors(io), "the draft engine")
    assert "\n" not in str(e.value) and "dspark build-engine OUT --force" in str(e.value)
    assert str(e.value).startswith("the draft engine does not match the export's manifest: ")


def test_an_engine_input_the_manifest_lacks_is_refused():
    extra = engine_io(DRAFT_IO) + [EngineTensor("attention_mask", True, "int64", (-1, -1))]
    with pytest.raises(DSparkTrtError, match="input attention_mask is not in the manifest"):
        check_engine_io(extra, io_tensors(DRAFT_IO))


# ------------------------------------------------------------------------------------------ profiles
GiB, MiB = 1 << 30, 1 << 20
#: the target engine: profile 0 = prefill (Q up to the context), profile 1 = verify (Q <= 16), less memory
TARGET_PROFILES = [
    Profile(0, {"input_ids": ((1, 1), (8, 8192)), "attention_mask": ((1, 1), (8, 8192)),
                "past_key": ((4, 1, 8, 0, 128), (4, 8, 8, 8192, 128))}, memory=9 * GiB),
    Profile(1, {"input_ids": ((1, 1), (8, 16)), "attention_mask": ((1, 1), (8, 8192)),
                "past_key": ((4, 1, 8, 0, 128), (4, 8, 8, 8192, 128))}, memory=40 * MiB),
]


def test_verify_rounds_run_on_the_small_q_profile_and_prefill_on_the_large_one():
    verify = {"input_ids": (4, 8), "attention_mask": (4, 1032), "past_key": (4, 4, 8, 1024, 128)}
    assert choose_profile(TARGET_PROFILES, verify) == 1
    assert choose_profile(TARGET_PROFILES, {**verify, "input_ids": (4, 16)}) == 1
    prefill = {"input_ids": (2, 700), "attention_mask": (2, 700), "past_key": (4, 2, 8, 0, 128)}
    assert choose_profile(TARGET_PROFILES, prefill) == 0
    assert choose_profile(list(reversed(TARGET_PROFILES)), verify) == 1  # by memory, not by position
    assert choose_profile([], verify) == 0  # an engine read without profiles: the default one
    same = [Profile(0, TARGET_PROFILES[1].shapes, 5), Profile(1, TARGET_PROFILES[1].shapes, 5)]
    assert choose_profile(same, verify) == 0  # a tie: the lower index


def test_shapes_outside_every_profile_are_refused_in_one_line():
    with pytest.raises(DSparkTrtError, match=r"input input_ids shape \(9, 8\) is outside every profile") as e:
        choose_profile(TARGET_PROFILES, {"input_ids": (9, 8), "attention_mask": (9, 16)})
    assert "--max-batch-size" in str(e.value) and "\n" not in str(e.value)


class _BindingContext:
    """An execution context as TensorRT's Python binding behaves (``pyCore.cpp``): ``set_optimization_profile_async``
    raises RuntimeError when the C++ call returns false (``PY_ASSERT_RUNTIME_ERROR``), and returns True otherwise."""

    def __init__(self, refuse: bool):
        self.refuse, self.calls = refuse, []

    def set_device_memory(self, ptr, size):
        self.calls.append(("memory", size))

    def set_optimization_profile_async(self, profile, stream):
        self.calls.append(("profile", profile, stream))
        if self.refuse:
            raise RuntimeError("Error in set optimization profile async")
        return True

    def set_input_shape(self, name, shape):
        self.calls.append(("shape", name, shape))
        return True


def _engine_with(ctx):
    """A ``TensorRTEngine`` around a fake engine whose contexts are ``ctx`` (no TensorRT, no GPU)."""
    from types import SimpleNamespace

    from dspark_trt.runtime.tensorrt_engine import TensorRTEngine

    engine = object.__new__(TensorRTEngine)
    engine.trt = SimpleNamespace(ExecutionContextAllocationStrategy=SimpleNamespace(USER_MANAGED="user-managed"))
    engine.engine = SimpleNamespace(create_execution_context=lambda strategy: ctx)
    engine.name, engine.device, engine.profiles = "target", None, tuple(TARGET_PROFILES)
    engine.scratch, engine.scratch_bytes = torch.zeros(64, dtype=torch.uint8), 64
    engine.stream = SimpleNamespace(cuda_stream=1234)
    engine.profile_uses = {}
    return engine


PREFILL = {"input_ids": (2, 700), "attention_mask": (2, 700), "past_key": (4, 2, 8, 0, 128)}


@pytest.fixture
def no_device(monkeypatch):
    """``torch.cuda.device(engine.device)`` as a no-op: the engine's device made current, on a host without CUDA."""
    import contextlib

    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())


def test_a_context_selects_its_profile_on_the_engines_stream(no_device):
    ctx = _BindingContext(refuse=False)
    engine = _engine_with(ctx)
    assert engine.context(PREFILL) is ctx
    assert ctx.calls[:2] == [("memory", 64), ("profile", 0, 1234)] and ("shape", "input_ids", (2, 700)) in ctx.calls
    assert engine.profile_uses == {0: 1}  # what gpu-check's long-prompt row reads (profile 0 ran)


def test_a_profile_the_binding_refuses_is_a_one_line_error(no_device):
    ctx = _BindingContext(refuse=True)
    with pytest.raises(DSparkTrtError, match=r"could not select optimization profile 0 of the target engine: Error in "
                                             r"set optimization profile async") as e:
        _engine_with(ctx).context(PREFILL)
    assert "dspark build-engine OUT --engine tensorrt --force" in str(e.value) and "\n" not in str(e.value)
    assert not any(c[0] == "shape" for c in ctx.calls)


def test_a_refused_profile_during_warm_up_is_not_swallowed_by_the_graph_fallback(no_device):
    """The first (warm-up) call of a graph key creates the context: the refusal propagates from the capture."""
    from dspark_trt.runtime.cuda_graphs import InputSpec, PadPlan

    engine = _engine_with(_BindingContext(refuse=True))
    runner = GraphRunner(lambda static, key: engine.context(PREFILL), (InputSpec("v", (0,), torch.float32),),
                         role="target", device="cpu")
    runner.mode = "graph"  # what a CUDA host claims; the warm-up runs before any CUDA call
    entry = runner._new_entry(PadPlan(2, 2), ())
    with pytest.raises(DSparkTrtError, match="optimization profile 0 of the target engine"):
        runner._capture(entry)
    assert runner.fallbacks == [] and entry.eager_reason is None


# ------------------------------------------------------------------------------------ context lifetimes
class _Context:
    """A plain object standing for a context: the test watches *when* the cache lets go of it."""


def test_exact_shape_contexts_are_bounded_and_dropped_only_after_a_synchronize():
    """Work enqueued through a context keeps using its memory until it finishes: the cache synchronises the
    engine's stream before it lets go of any context (eviction or clear), and keeps at most ``capacity``."""
    events, created = [], []

    def make(key):
        ctx = _Context()
        weakref.finalize(ctx, events.append, f"drop {key}")
        created.append(key)
        return ctx

    cache = ContextCache(lambda: events.append("sync"), capacity=2)
    first = id(cache.get("a", lambda: make("a")))
    cache.get("b", lambda: make("b"))
    assert id(cache.get("a", lambda: make("a"))) == first and created == ["a", "b"]  # a hit creates nothing
    cache.get("c", lambda: make("c"))  # evicts "b", the least recently used
    gc.collect()
    assert events == ["sync", "drop b"] and len(cache) == 2 and "a" in cache and "c" in cache
    cache.clear()
    gc.collect()
    assert events[2] == "sync" and sorted(events[3:]) == ["drop a", "drop c"] and len(cache) == 0
    cache.clear()  # nothing left: nothing to wait for
    assert events.count("sync") == 2
    unbounded = ContextCache(lambda: events.append("sync"))
    for i in range(20):
        unbounded.get(i, _Context)
    assert len(unbounded) == 20 and events.count("sync") == 2
    with pytest.raises(DSparkTrtError, match="capacity 0 must be >= 1"):
        ContextCache(lambda: None, capacity=0)


# ------------------------------------------------------------------------------------------ alignment
def test_a_view_with_a_storage_offset_is_copied_into_an_aligned_buffer():
    """TensorRT needs 256-byte aligned tensor addresses: ``.contiguous()`` keeps a contiguous view where it
    starts (the old exact-shape path bound it as is)."""
    base = torch.randn(4 * 1000)
    view = base[1:1 + 999]  # contiguous, 4 bytes into its storage
    assert view.is_contiguous() and view.contiguous().data_ptr() == view.data_ptr()
    assert view.data_ptr() % TENSOR_ALIGNMENT != 0
    got = aligned(view)
    assert got.data_ptr() % TENSOR_ALIGNMENT == 0 and got.is_contiguous() and torch.equal(got, view)
    assert aligned(got) is got  # already aligned: no copy
    for dtype in TORCH_DTYPES.values():
        for shape in ((7,), (3, 5, 2), (0, 4)):
            t = aligned_empty(shape, dtype)
            assert t.shape == shape and t.dtype == dtype and t.is_contiguous()
            assert t.numel() == 0 or t.data_ptr() % TENSOR_ALIGNMENT == 0


def test_exact_shape_inputs_are_bound_aligned_contiguous_and_in_the_engine_dtype():
    """The target's prefill feeds its K/V buffers' used slots (a strided view) and the drafter's context K/V
    can be a batch slice (an offset view): both reach TensorRT as aligned contiguous copies."""
    specs = input_specs(io_tensors(TARGET_IO), "B", "P", {"attention_mask": (1, 0)})
    k = torch.randn(4, 3, 8, 40, 128, dtype=torch.bfloat16)  # [L, B, H, capacity, D]
    ids = torch.arange(2 * 33, dtype=torch.int32).view(2, 33)[:, 1:]  # offset view, int32 where the engine has int64
    feeds = {"input_ids": ids, "position_ids": ids.to(torch.int64),
             "attention_mask": torch.ones(2, 37, dtype=torch.int64),
             "past_key": k[:, 1:, :, :5], "past_value": k[:, :2, :, :5]}  # strided views of the K/V buffers
    got = bind_inputs(specs, feeds, "cpu")
    for name, t in got.items():
        assert t.is_contiguous() and t.data_ptr() % TENSOR_ALIGNMENT == 0, name
        assert t.dtype == TORCH_DTYPES[next(i["dtype"] for i in TARGET_IO["inputs"] if i["name"] == name)]
        assert torch.equal(t, feeds[name].to(t.dtype))


# ------------------------------------------------------------------------------------------ the refusal
def test_without_tensorrt_the_backend_refuses_in_one_line(tmp_path):
    if tensorrt_available() is None:
        pytest.skip("TensorRT and a GPU are present")
    from dspark_trt.runtime.drafters.base import backend_class

    cls = backend_class("tensorrt")
    with pytest.raises(DSparkTrtError, match="needs full TensorRT and a GPU") as e:
        cls(tmp_path)
    assert "\n" not in str(e.value)
    with pytest.raises(DSparkTrtError, match="needs full TensorRT and a GPU"):
        cls.from_pretrained(tmp_path)
    with pytest.raises(DSparkTrtError, match="--backend onnxruntime or torch"):
        require_tensorrt()


def test_generate_with_the_tensorrt_backend_exits_1_without_tensorrt(capsys):
    if tensorrt_available() is None:
        pytest.skip("TensorRT and a GPU are present")
    from dspark_trt.cli.main import main

    assert main(["generate", "--backend", "tensorrt", "--max-new-tokens", "2"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs full TensorRT and a GPU" in err[0]


# ------------------------------------------------------------------------------------------ the target
def test_target_padding_specs_keep_the_new_tokens_last():
    from dspark_trt.runtime.targets.tensorrt import TARGET_FILLS, mask_symbol

    tensors = io_tensors(TARGET_IO)
    assert mask_symbol(tensors) == "PQ"
    specs = {s.name: s for s in input_specs(tensors, "B", "P", TARGET_FILLS, {"attention_mask": ("PQ", 3)},
                                            {"Q": 3})}
    assert specs["input_ids"].shape == (0, 3)
    mask = specs["attention_mask"]
    assert (mask.batch_dim, mask.context_dim, mask.context_extra, mask.batch_fill, mask.context_fill) == (0, 1, 3, 1, 0)
    assert specs["past_key"].context_extra == 0 and specs["past_key"].context_dim == 3


@pytest.mark.onnx
@pytest.mark.slow
def test_a_padded_target_round_gives_the_unpadded_results(tiny_pair, tmp_path, one_thread):
    """The exported target graph (CONTRACT I/O) through the target's padding specs and the graph runner, on the
    CPU with onnxruntime: batch 3 → bucket 4, past 5 → bucket 16, Q = 3 new tokens; equal to the unpadded call.
    (Here the per-layer past is padded into the runner's buffers; the target binds its cache instead:
    tests/runtime/targets/test_tensorrt.py.)"""
    from dspark_trt.config import DSparkConfig
    from dspark_trt.artifact.manifest import graph_io
    from dspark_trt.runtime.ort_session import OrtGraph
    from dspark_trt.export.target_onnx import export_target_onnx, load_target_model
    from dspark_trt.runtime.targets.tensorrt import TARGET_FILLS, mask_symbol

    layer_ids = DSparkConfig.from_pretrained(tiny_pair.drafter).target_layer_ids
    path = export_target_onnx(load_target_model(tiny_pair.target, torch.float32), layer_ids, tmp_path / "target.onnx")
    graph = OrtGraph(path)
    tensors = io_tensors(graph_io(path))
    B, P, Q = 3, 5, 3
    runner = GraphRunner(lambda x, key: graph.run(x),
                         input_specs(tensors, "B", "P", TARGET_FILLS, {"attention_mask": (mask_symbol(tensors), Q)},
                                     {"Q": Q, "K": Q}),
                         role="target", device="cpu", output_batch_dims=output_batch_dims(tensors))
    g = torch.Generator().manual_seed(0)
    pasts = [t for t in tensors if t.name.startswith("past_")]  # past_key_<l>, past_value_<l>: [B, H, P, D]
    H, D = pasts[0].shape[1], pasts[0].shape[3]
    mask = torch.ones(B, P + Q, dtype=torch.int64)
    mask[1, 3:P] = 0  # request 1 has holes (rejected drafts), request 2 is shorter
    mask[2, 2:P] = 0
    feeds = {"input_ids": torch.randint(0, 2500, (B, Q), generator=g),
             "position_ids": torch.tensor([[5, 6, 7], [3, 4, 5], [2, 3, 4]]), "attention_mask": mask,
             "logits_index": torch.arange(Q).expand(B, Q),
             **{t.name: torch.randn(B, H, P, D, generator=g) for t in pasts}}
    plan = BucketPolicy(max_batch=8, max_context=64, smallest_context=16).plan(B, P)
    want = graph.run(feeds)
    got = runner(plan, feeds)
    assert runner.entries[next(iter(runner.entries))].inputs["attention_mask"].shape == (4, 16 + Q)
    for name in ("logits", "taps", "new_key", "new_value"):
        assert got[name].shape == want[name].shape, name
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-4)
    assert torch.equal(got["logits"].argmax(-1), want["logits"].argmax(-1))


def test_without_tensorrt_the_target_backend_refuses_in_one_line(tmp_path):
    if tensorrt_available() is None:
        pytest.skip("TensorRT and a GPU are present")
    from dspark_trt.runtime.targets.base import target_class

    cls = target_class("tensorrt")
    with pytest.raises(DSparkTrtError, match="the tensorrt target backend needs full TensorRT and a GPU") as e:
        cls.from_export(tmp_path)
    assert "\n" not in str(e.value)


@pytest.mark.tensorrt
@pytest.mark.gpu
@pytest.mark.onnx
@pytest.mark.slow
def test_from_export_with_tensorrt_generates_the_onnxruntime_tokens(tiny_pair, tmp_path):
    """The whole export on the GPU host (engines for context, draft with the AOT plugin, target), then
    SpeculativeDecoder.from_export with backend="tensorrt" (CUDA graphs) against backend="onnxruntime"."""
    from dspark_trt.export.pipeline import ExportOptions, export_model
    from dspark_trt.runtime import SpeculativeDecoder

    out = tmp_path / "export"
    export_model(tiny_pair.drafter, out, ExportOptions(topk=16, dtype="fp32", engine="tensorrt", max_context=512),
                 target_dir=tiny_pair.target)
    prompts = [[1, 2, 3, 4], [5, 6], [7, 8, 9]]
    want = SpeculativeDecoder.from_export(out, backend="onnxruntime").generate(prompts, max_new_tokens=24, topk=16)
    trt_dec = SpeculativeDecoder.from_export(out, backend="tensorrt")
    got = trt_dec.generate(prompts, max_new_tokens=24, topk=16)
    assert got.tokens == want.tokens
    # the runtime's DrafterState is the bound graph's context: captured there, and nothing copied into buckets
    assert any(e.graph is not None for e in trt_dec.backend._graphs["draft_bound"].runner.entries.values())
    assert not trt_dec.backend._graphs["draft"].runner.entries


def test_the_tensorrt_drafter_reads_its_context_dimension_from_the_per_layer_inputs():
    """The draft engine's context dimension is axis 2 of ctx_key_0 [B, H_kv, T, D]; an engine of the older
    stacked ctx_k [L, B, T, H_kv, D] graph is refused in one line (re-export), before any buffer is sized."""
    from dspark_trt.artifact.drafter_io import check_draft_interface
    from dspark_trt.runtime.drafters.tensorrt import _context_symbol

    tensors = io_tensors(DRAFT_IO)
    assert _context_symbol(tensors) == "T"
    specs = {s.name: s for s in input_specs(tensors, "B", "T")}
    assert (specs["ctx_key_1"].batch_dim, specs["ctx_key_1"].context_dim) == (0, 2)
    check_draft_interface([t.name for t in tensors], "OUT")
    old = {**DRAFT_IO, "inputs": [{"name": "ctx_k", "dtype": "bfloat16", "shape": [2, "B", "T", 2, 16]}]
           + [t for t in DRAFT_IO["inputs"] if not t["name"].startswith(("ctx_key", "ctx_value"))]}
    with pytest.raises(DSparkTrtError, match="stacked ctx_k") as e:
        check_draft_interface([t.name for t in io_tensors(old)], "OUT")
    assert "\n" not in str(e.value)
