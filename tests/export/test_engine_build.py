"""Engine builds: the pure profile logic, flavour resolution, and a real TensorRT-RTX build on CPU."""

from __future__ import annotations

import numpy as np
import pytest

from dspark_trt.errors import DSparkTrtError
from dspark_trt.export.engine_build import EngineBuildConfig, EngineFromOnnx, onnx_inputs, profile_shapes, resolve_flavor


@pytest.fixture(scope="module")
def small_onnx(tmp_path_factory):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y0"]), helper.make_node("Relu", ["y0"], ["y"])],
        "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "ctx", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "ctx", 8])],
        initializer=[w],
    )
    path = tmp_path_factory.mktemp("onnx") / "small.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path


def test_profile_shapes_fill_batch_and_named_ranges():
    shapes = profile_shapes({"x": ["B", "ctx", 16], "n": [7]}, (1, 4, 8), {"ctx": (1, 64, 128)})
    assert shapes == {"x": ((1, 1, 16), (4, 64, 16), (8, 128, 16)), "n": ((7,), (7,), (7,))}


def test_profile_without_a_range_for_a_dynamic_dim_is_refused():
    with pytest.raises(DSparkTrtError, match="dynamic dimension 'ctx' without a range"):
        profile_shapes({"x": ["B", "ctx", 16]}, (1, 1, 2))


def test_onnx_inputs_reads_symbolic_dims(small_onnx):
    assert onnx_inputs(small_onnx) == {"x": ["B", "ctx", 16]}


def test_batch_sizes_are_validated():
    with pytest.raises(DSparkTrtError, match="--opt-batch-size 9 must be in"):
        EngineBuildConfig("tensorrt-rtx", max_batch_size=8, opt_batch_size=9)
    assert EngineBuildConfig("tensorrt-rtx", max_batch_size=8).batch_range == (1, 8, 8)


def test_version_compatible_is_full_tensorrt_only():
    assert EngineBuildConfig("tensorrt", version_compatible=True).describe()["version_compatible"]
    with pytest.raises(DSparkTrtError, match="--version-compatible is a full-TensorRT option"):
        EngineBuildConfig("tensorrt-rtx", version_compatible=True)


def test_version_compatible_is_refused_around_the_aot_plugin():
    """No TensorRT documentation says a lean-runtime (version-compatible) engine runs AOT plugin layers."""
    from dspark_trt.export.engine_build import check_version_compatible

    check_version_compatible(True, None)  # a dense draft graph: no plugin
    check_version_compatible(False, "DSparkTopKMarkov")
    for op in ("DSparkTopKMarkov", "DSparkTopKMarkovUnion"):
        message = f"--version-compatible with the {op} AOT plugin is not supported"
        with pytest.raises(DSparkTrtError, match=message) as e:
            check_version_compatible(True, op)
        assert "\n" not in str(e.value) and "drop --version-compatible" in str(e.value)


def test_the_target_engine_gets_a_small_q_verify_profile():
    """Profile 0 prefills (Q up to a prefill chunk), profile 1 verifies (Q and K <= 16): a verify context's
    activation memory is sized for a few new tokens, not for max batch x a chunk."""
    from dspark_trt.artifact.kv_capacity import capacity_bucket
    from dspark_trt.export.pipeline import VERIFY_TOKENS, target_build_config

    base = EngineBuildConfig("tensorrt", max_batch_size=4, register_plugins=print)
    cfg = target_build_config(base, 512)
    assert cfg.register_plugins is None and VERIFY_TOKENS == 16
    ranges = cfg.profile_ranges
    assert len(ranges) == 2 and ranges[0]["Q"] == ranges[0]["K"] == (1, 8, 512)
    assert ranges[1]["Q"] == ranges[1]["K"] == (1, 8, 16)
    assert ranges[1]["P"] == ranges[0]["P"] == (1, 512, 512) and ranges[1]["S"] == ranges[0]["S"]  # Q, K narrow
    inputs = {"input_ids": ["B", "Q"], "attention_mask": ["B", "S"], "past_key_0": ["B", 2, "P", 16]}
    verify = profile_shapes(inputs, cfg.batch_range, ranges[1])
    assert verify["input_ids"] == ((1, 1), (4, 8), (4, 16)) and verify["past_key_0"][2] == (4, 2, 512, 16)
    assert cfg.describe()["extra_profiles"] == [{"Q": [1, 8, 16], "K": [1, 8, 16]}]
    assert target_build_config(base, 12).profile_ranges == [target_build_config(base, 12).dynamic_ranges]  # Q <= 12
    assert target_build_config(base, 8000).dynamic_ranges["P"][2] == capacity_bucket(8000) == 8192
    assert EngineBuildConfig("tensorrt").profile_ranges == [{}]  # the drafter's engines: one profile


def test_resolve_flavor():
    from tests.conftest import have_module, have_tensorrt

    assert resolve_flavor("none") is None
    if not have_tensorrt():
        with pytest.raises(DSparkTrtError, match="full TensorRT is not importable.*--engine tensorrt-rtx / --engine none"):
            resolve_flavor("tensorrt")
        with pytest.raises(DSparkTrtError, match="or use --engine tensorrt-rtx$"):
            resolve_flavor("tensorrt", none_allowed=False)
    expected = "tensorrt" if have_tensorrt() else ("tensorrt-rtx" if have_module("tensorrt_rtx") else None)
    assert resolve_flavor("auto") == expected
    with pytest.raises(DSparkTrtError, match="unknown engine 'trt'"):
        resolve_flavor("trt")


@pytest.mark.rtx
def test_tensorrt_rtx_builds_a_real_engine_on_cpu(small_onnx):
    config = EngineBuildConfig("tensorrt-rtx", max_batch_size=4, opt_batch_size=2, dynamic_ranges={"ctx": (1, 8, 32)})
    plan = EngineFromOnnx(small_onnx, config)()
    assert isinstance(plan, bytes) and len(plan) > 1000


@pytest.mark.rtx
def test_tensorrt_rtx_parse_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not an onnx file")
    config = EngineBuildConfig("tensorrt-rtx", max_batch_size=1)
    with pytest.raises(DSparkTrtError) as info:
        EngineFromOnnx(bad, config)()
    assert "\n" not in str(info.value)


class _FakeBuilderConfig:
    """A builder config whose flags start as TensorRT's do: TF32 on."""

    def __init__(self):
        self.flags = {"TF32"}

    def set_flag(self, flag):
        self.flags.add(flag)

    def clear_flag(self, flag):
        self.flags.discard(flag)

    def get_flag(self, flag):
        return flag in self.flags


def test_fp32_exports_build_their_engines_without_tf32():
    """An fp32 export clears BuilderFlag.TF32 (TensorRT's default is on: fp32 GEMMs as TF32); other dtypes keep it,
    and the manifest's build section records which."""
    from types import SimpleNamespace

    from dspark_trt.export.engine_build import apply_build_flags
    from dspark_trt.export.pipeline import ExportOptions, engine_config

    trt = SimpleNamespace(BuilderFlag=SimpleNamespace(TF32="TF32", VERSION_COMPATIBLE="VC"))
    for dtype, tf32 in (("fp32", False), ("bf16", True), ("fp16", True)):
        config = engine_config("tensorrt", ExportOptions(dtype=dtype), max_context=256, topk=None)
        assert config.tf32 is tf32 and config.describe()["tf32"] is tf32
        build = _FakeBuilderConfig()
        apply_build_flags(build, trt, config)
        assert build.get_flag("TF32") is tf32


@pytest.mark.rtx
def test_tf32_is_cleared_on_a_real_builder_config():
    trt = pytest.importorskip("tensorrt_rtx")
    from dspark_trt.export.engine_build import apply_build_flags

    build = trt.Builder(trt.Logger(trt.Logger.ERROR)).create_builder_config()
    apply_build_flags(build, trt, EngineBuildConfig("tensorrt-rtx", tf32=True))
    assert build.get_flag(trt.BuilderFlag.TF32)  # TensorRT's default, left alone
    apply_build_flags(build, trt, EngineBuildConfig("tensorrt-rtx", tf32=False))
    assert not build.get_flag(trt.BuilderFlag.TF32)


@pytest.fixture(scope="module")
def gather_onnx(tmp_path_factory):
    """An embedding lookup whose table (300,000 × 64 fp32, 77 MB of random rows) makes a plan of more than one
    64 MiB piece."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    table = np.random.default_rng(1).standard_normal((300_000, 64)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0)], "gather",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["B", "T"])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["B", "T", 64])],
        initializer=[numpy_helper.from_array(table, "table")])
    path = tmp_path_factory.mktemp("gather") / "gather.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path, table


@pytest.mark.rtx
def test_tensorrt_rtx_streams_the_plan_into_its_file(gather_onnx, tmp_path, monkeypatch):
    """``write_engine`` has the serializer write the plan into the file piece by piece (no whole plan in memory):
    TensorRT's buffer-returning build is never called, the pieces are at most 64 MiB and add up to the file, the
    file is as long as the buffered plan, and the table's first and last rows are in it byte for byte."""
    import tensorrt_rtx as trt

    from dspark_trt.export import engine_build
    from dspark_trt.export.engine_build import write_engine

    path, table = gather_onnx
    config = EngineBuildConfig("tensorrt-rtx", max_batch_size=2, dynamic_ranges={"T": (1, 4, 8)})
    buffered = EngineFromOnnx(path, config)()  # the buffer path, for its length
    pieces = []
    real_writer = engine_build._file_writer

    def counting_writer(trt_module, f):
        class Counting:
            def __init__(self, inner):
                self.inner = inner

            def write(self, data):
                pieces.append(len(data))
                return f.write(data)

        return real_writer(trt_module, Counting(f))

    monkeypatch.setattr(engine_build, "_file_writer", counting_writer)

    def no_buffer(*args, **kwargs):
        raise AssertionError("the whole plan was built into a buffer")

    monkeypatch.setattr(trt.Builder, "build_serialized_network", no_buffer)
    size = write_engine(path, config, tmp_path / "gather.plan")
    plan = (tmp_path / "gather.plan").read_bytes()
    assert len(pieces) > 1 and max(pieces) <= 1 << 26 and sum(pieces) == size == len(plan) == len(buffered)
    assert table[:16].tobytes() in plan and table[-16:].tobytes() in plan


@pytest.mark.rtx
def test_a_failed_plan_write_is_raised_and_leaves_no_plan(small_onnx, tmp_path, monkeypatch):
    """A write error inside the stream (a full disk) ends the build and is raised as itself; the atomic write
    leaves no file behind."""
    import errno

    from dspark_trt.export import engine_build

    class FullDisk:
        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    real_writer = engine_build._file_writer
    monkeypatch.setattr(engine_build, "_file_writer", lambda trt_module, f: real_writer(trt_module, FullDisk()))
    config = EngineBuildConfig("tensorrt-rtx", max_batch_size=2, dynamic_ranges={"ctx": (1, 8, 32)})
    with pytest.raises(OSError) as info:
        engine_build.write_engine(small_onnx, config, tmp_path / "small.plan")
    assert info.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []
