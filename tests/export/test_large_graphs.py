"""Graphs over protobuf's 2 GiB cap through every step after the export: the plugin graph, onnx.checker by path,
onnxruntime, the manifest's streamed digests, the external-data checks.

The >2 GB draft graph is made cheaply: the tiny drafter's real exported draft graph with its initializers in
``draft.onnx.data`` and its embedding table grown to 8.5 M rows (2.18 GB): the first 2500 rows are the real
ones, the rest a hole in a sparse file (no disk used, read back as zeros). Token ids stay below 2500, so the
graph computes exactly what the small one does (checked in onnxruntime); everything else is byte for byte the
exporter's graph, the DSparkTopKMarkov node and its local function included.
"""

from __future__ import annotations

import hashlib
import os
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.onnx]

ROWS = 8_500_000  # × 64 × 4 bytes = 2.18 GB > 2 GiB
TWO_GIB = 1 << 31
EMBED = "drafter.embed_tokens.weight"


def inflate_draft_graph(src: Path, dst_dir: Path, rows: int = ROWS) -> Path:
    """``src`` (a small draft graph, weights inside) → ``dst_dir/draft.onnx`` + ``draft.onnx.data`` with the
    embedding grown to ``rows`` rows (real rows first, then a sparse hole)."""
    import onnx

    dst_dir.mkdir(parents=True, exist_ok=True)
    dst = dst_dir / "draft.onnx"
    onnx.save(onnx.load(str(src)), str(dst), save_as_external_data=True, location="draft.onnx.data",
              size_threshold=1024)
    model = onnx.load(str(dst), load_external_data=False)
    embed = next(t for t in model.graph.initializer if t.name == EMBED)
    entries = {e.key: e for e in embed.external_data}
    width = embed.dims[1]
    with open(dst_dir / "draft.onnx.data", "r+b") as f:
        f.seek(int(entries["offset"].value))
        real = f.read(int(entries["length"].value))
        offset = (f.seek(0, os.SEEK_END) + 4095) // 4096 * 4096
        f.seek(offset)
        f.write(real)
        f.truncate(offset + rows * width * 4)  # the hole: rows that no token id reaches
    embed.dims[0] = rows
    entries["offset"].value, entries["length"].value = str(offset), str(rows * width * 4)
    for value in model.graph.value_info:
        if value.name == EMBED:
            value.type.tensor_type.shape.dim[0].dim_value = rows
    dst.write_bytes(model.SerializeToString())
    return dst


@pytest.fixture(scope="module")
def small_draft(tiny_pair, onnx_export) -> Path:
    return onnx_export(tiny_pair, "fp32", 16) / "onnx" / "draft.onnx"


@pytest.fixture(scope="module")
def big_draft(small_draft, tmp_path_factory) -> Path:
    path = inflate_draft_graph(small_draft, tmp_path_factory.mktemp("big") / "onnx")
    assert (path.parent / "draft.onnx.data").stat().st_size > TWO_GIB
    return path


def _feeds(session):
    rng = np.random.default_rng(0)
    shapes = {"anchor": [3], "ctx_len": [3], "ctx_start": [3], "temperature": [3], "seed": [3]}
    feeds = {}
    for i in session.get_inputs():
        if i.name.startswith(("ctx_key_", "ctx_value_")):  # one layer's context, heads first [B, H_kv, T, D]
            dims = [d if isinstance(d, int) else (3 if k == 0 else 9) for k, d in enumerate(i.shape)]  # B 3, T 9
            feeds[i.name] = rng.standard_normal(dims).astype(np.float32)
        elif i.type == "tensor(float)":
            feeds[i.name] = rng.standard_normal(shapes[i.name]).astype(np.float32)
        else:
            dtype = np.int64 if "int64" in i.type else np.int32
            feeds[i.name] = rng.integers(1, 9, shapes[i.name]).astype(dtype)
    feeds["anchor"] = np.array([17, 2030, 2499], dtype=feeds["anchor"].dtype)  # the embedding's real rows only
    feeds["temperature"] = np.array([0.0, 1.0, 0.7], dtype=np.float32)
    return feeds


def test_the_inflated_graph_is_over_2gb_and_computes_what_the_small_one_does(small_draft, big_draft):
    """The test graph is a real >2 GiB graph: onnxruntime loads it from its path (external data) and drafts the
    same tokens as the exporter's small graph."""
    import onnxruntime as ort

    small = ort.InferenceSession(str(small_draft))
    big = ort.InferenceSession(str(big_draft))
    feeds = _feeds(small)
    for a, b in zip(small.run(None, feeds), big.run(None, feeds)):
        np.testing.assert_array_equal(a, b)


def test_plugin_graph_over_2gb_edits_nodes_without_a_second_copy(small_draft, big_draft):
    import onnx

    from dspark_trt.artifact.external_data import external_refs
    from dspark_trt.export.plugin_graph import custom_nodes, plugin_graph
    from dspark_trt.plugins.contract import PLUGIN_NAMESPACE, PLUGIN_VERSION
    from dspark_trt.plugins.onnx_op import register_schema

    directory = big_draft.parent
    data = directory / "draft.onnx.data"
    before = {p.name for p in directory.iterdir()}
    tracemalloc.start()
    dst = plugin_graph(big_draft, directory / "draft.plugin.onnx")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 64 << 20, f"the plugin step allocated {peak / 1e6:.0f} MB: it loaded the weights"
    assert {p.name for p in directory.iterdir()} == before | {"draft.plugin.onnx"}  # no new data file
    assert dst.stat().st_size < 16 << 20 and os.stat(data).st_nlink == 1  # the graph only; one data file, shared

    model = onnx.load(str(dst), load_external_data=False)
    assert not model.functions  # the plugin must win
    (node,) = custom_nodes(model)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["aot"] == 1 and attrs["k"] == 16
    assert attrs["plugin_namespace"] in (PLUGIN_NAMESPACE, PLUGIN_NAMESPACE.encode())
    assert attrs["plugin_version"] in (PLUGIN_VERSION, PLUGIN_VERSION.encode())
    source = onnx.load(str(big_draft), load_external_data=False)
    assert [n.op_type for n in model.graph.node] == [n.op_type for n in source.graph.node]
    assert external_refs(model) == external_refs(source)  # every weight still read from draft.onnx.data
    embed = next(r for r in external_refs(model) if r.tensor == EMBED)
    assert embed.location == "draft.onnx.data" and embed.length == ROWS * 64 * 4 > TWO_GIB - (1 << 20)

    register_schema()
    onnx.checker.check_model(str(dst), full_check=True)  # the path form: external data resolved, > 2 GiB
    # and the weights load back through the plugin graph's own references: the real rows, then the hole
    with open(data, "rb") as f:
        f.seek(embed.offset)
        first = np.frombuffer(f.read(2500 * 64 * 4), np.float32)
        f.seek(embed.offset + embed.length - 4096)
        last = f.read(4096)
    small = next(t for t in onnx.load(str(small_draft)).graph.initializer if t.name == EMBED)
    np.testing.assert_array_equal(first, onnx.numpy_helper.to_array(small).ravel())
    assert last == bytes(4096)


def test_plugin_graph_elsewhere_copies_weights_only_when_asked(big_draft, small_draft, tmp_path):
    """onnx accepts no link and no ``../`` location for external data: another directory means a copy, which is
    refused unless asked (and then the copy is a valid graph)."""
    import onnx

    from dspark_trt.errors import DSparkTrtError
    from dspark_trt.export.plugin_graph import plugin_graph
    from dspark_trt.plugins.onnx_op import register_schema

    with pytest.raises(DSparkTrtError, match="weights are in draft.onnx.data beside it .* write the new graph into"):
        plugin_graph(big_draft, tmp_path / "elsewhere" / "draft.plugin.onnx")
    assert not (tmp_path / "elsewhere" / "draft.plugin.onnx").exists()
    src = tmp_path / "small" / "draft.onnx"  # a small graph with external data: the copy is cheap here
    src.parent.mkdir()
    onnx.save(onnx.load(str(small_draft)), str(src), save_as_external_data=True, location="draft.onnx.data",
              size_threshold=1024)
    dst = plugin_graph(src, tmp_path / "copy" / "draft.plugin.onnx", copy_weights=True)
    assert (dst.parent / "draft.onnx.data").read_bytes() == (src.parent / "draft.onnx.data").read_bytes()
    register_schema()
    onnx.checker.check_model(str(dst), full_check=True)


def test_digests_over_2gb_are_streamed_and_correct(big_draft):
    from dspark_trt.artifact.manifest import file_records

    directory = big_draft.parent
    tracemalloc.start()
    records = file_records(directory)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 64 << 20, f"hashing allocated {peak / 1e6:.0f} MB: a file was read whole"
    data = records["draft.onnx.data"]
    assert data["bytes"] == (directory / "draft.onnx.data").stat().st_size > TWO_GIB
    with open(directory / "draft.onnx.data", "rb") as f:
        assert data["sha256"] == hashlib.file_digest(f, "sha256").hexdigest()
    assert records["draft.onnx"]["sha256"] == hashlib.sha256(big_draft.read_bytes()).hexdigest()


def test_truncated_or_missing_external_data_is_one_line(small_draft, tmp_path):
    """A copy of a graph whose .data file is short or absent is refused by name before any parser sees it."""
    import onnx

    from dspark_trt.errors import DSparkTrtError
    from dspark_trt.artifact.external_data import external_data_files
    from dspark_trt.export.plugin_graph import plugin_graph

    path = tmp_path / "draft.onnx"
    onnx.save(onnx.load(str(small_draft)), str(path), save_as_external_data=True, location="draft.onnx.data",
              size_threshold=1024)
    assert external_data_files(path) == [tmp_path / "draft.onnx.data"]
    data = tmp_path / "draft.onnx.data"
    with open(data, "r+b") as f:
        f.truncate(data.stat().st_size - 1)
    with pytest.raises(DSparkTrtError, match=r"draft.onnx.data holds \d+ bytes but tensor .* needs bytes up to"):
        plugin_graph(path, tmp_path / "draft.plugin.onnx")
    data.unlink()
    with pytest.raises(DSparkTrtError, match="the weights file draft.onnx.data .* is missing"):
        external_data_files(path)
    assert not (tmp_path / "draft.plugin.onnx").exists()


@pytest.mark.rtx
def test_tensorrt_rtx_builds_from_a_graph_with_external_data(small_draft, tmp_path, monkeypatch):
    """The engine build parses the graph from its path, so the weights resolve from ``draft.onnx.data`` beside it
    (not from the working directory), and the plan is written straight from TensorRT's buffer."""
    import onnx

    from dspark_trt.export.engine_build import EngineBuildConfig, write_engine

    graph = tmp_path / "onnx" / "draft.onnx"
    graph.parent.mkdir()
    onnx.save(onnx.load(str(small_draft)), str(graph), save_as_external_data=True, location="draft.onnx.data",
              size_threshold=1024)
    assert graph.stat().st_size < 1 << 20 < (graph.parent / "draft.onnx.data").stat().st_size  # weights outside
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    config = EngineBuildConfig("tensorrt-rtx", max_batch_size=2, dynamic_ranges={"T": (1, 64, 256)})
    size = write_engine(graph, config, tmp_path / "draft.rtx.plan")
    assert size == (tmp_path / "draft.rtx.plan").stat().st_size > 1 << 20  # the weights are in the engine
    (graph.parent / "draft.onnx.data").rename(tmp_path / "moved.data")
    from dspark_trt.errors import DSparkTrtError

    with pytest.raises(DSparkTrtError, match="the weights file draft.onnx.data .* is missing next to it"):
        write_engine(graph, config, tmp_path / "again.rtx.plan")
    assert not (tmp_path / "again.rtx.plan").exists()


def test_the_bf16_twin_of_a_graph_with_external_data_streams_its_weights(tiny_pair, onnx_export, tmp_path,
                                                                          monkeypatch):
    """``python -m dspark_trt.export.bf16_emulation`` (the docs' Polygraphy step for bf16 exports) reads the graph
    without its weights and converts them one at a time; a twin over the 1.5 GiB threshold (lowered here to 0, so
    the tiny graph takes the large-graph path) gets ``OUT.onnx.data`` and computes what the inline twin does."""
    import onnx
    import onnxruntime as ort

    from dspark_trt.export import bf16_emulation
    from dspark_trt.artifact.external_data import external_refs

    small = onnx_export(tiny_pair, "bf16", 16) / "onnx" / "draft.onnx"
    src = tmp_path / "onnx" / "draft.onnx"
    src.parent.mkdir()
    onnx.save(onnx.load(str(small)), str(src), save_as_external_data=True, location="draft.onnx.data",
              size_threshold=1024)
    assert bf16_emulation.main([str(small), str(tmp_path / "inline.onnx")]) == 0
    monkeypatch.setattr(bf16_emulation, "TWIN_EXTERNAL_BYTES", 0)
    assert bf16_emulation.main([str(src), str(tmp_path / "twin.onnx")]) == 0
    twin = onnx.load(str(tmp_path / "twin.onnx"), load_external_data=False)
    assert {r.location for r in external_refs(twin)} == {"twin.onnx.data"}
    assert not external_refs(onnx.load(str(tmp_path / "inline.onnx"), load_external_data=False))
    a, b = ort.InferenceSession(str(tmp_path / "inline.onnx")), ort.InferenceSession(str(tmp_path / "twin.onnx"))
    feeds = _feeds(a)
    for x, y in zip(a.run(None, feeds), b.run(None, feeds)):
        np.testing.assert_array_equal(x, y)


def test_polygraphy_inspects_the_graph_over_2gb_without_its_weights(big_draft):
    """The docs' ``polygraphy inspect model`` with ``--ignore-external-data``: the node and its attributes, read
    from the graph alone."""
    import shutil
    import subprocess
    import sys

    exe = Path(sys.executable).with_name("polygraphy")
    exe = str(exe) if exe.is_file() else shutil.which("polygraphy")
    if exe is None:
        pytest.skip("polygraphy CLI not installed")
    proc = subprocess.run([exe, "inspect", "model", str(big_draft), "--show", "layers", "attrs",
                           "--ignore-external-data"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    block = proc.stdout[proc.stdout.index("DSparkTopKMarkov [Op: DSparkTopKMarkov]"):]
    assert "k = 16" in block and "plugin_namespace = dspark" in block
    assert f"{EMBED} [dtype=float32, shape=({ROWS}, 64)]" in proc.stdout
