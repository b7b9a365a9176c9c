"""dspark-export end to end on the tiny checkpoint: ONNX valid and validated, PTX, a real TensorRT-RTX engine,
and a manifest consistent with the files; then build-engine on an engine-less export."""

from __future__ import annotations

import hashlib
import json

import pytest

from dspark_trt.errors import DSparkTrtError
from dspark_trt.artifact.kv_capacity import capacity_bucket
from dspark_trt.artifact.export_dir import check_manifest, read_manifest
from dspark_trt.artifact.manifest import graph_io
from dspark_trt.export.pipeline import ExportOptions, build_engines, export_model

# one worker builds the module's README export once (loadgroup; else each worker that runs a test here builds it)
pytestmark = [pytest.mark.onnx, pytest.mark.triton, pytest.mark.xdist_group("export-pipeline")]


@pytest.fixture(scope="module")
def exported(tiny_pair, tmp_path_factory):
    """The README's main job on the tiny pair: top-k 512, bf16, an engine if a flavor is importable."""
    out = tmp_path_factory.mktemp("export") / "out"
    return export_model(tiny_pair.drafter, out, ExportOptions(topk=512), target_dir=tiny_pair.target)


def test_onnx_is_valid_and_validated(exported):
    import onnx

    from dspark_trt.plugins.onnx_op import register_schema

    register_schema()
    for graph in ("context", "draft", "draft.plugin"):
        onnx.checker.check_model(str(exported.out_dir / "onnx" / f"{graph}.onnx"), full_check=True)
    report = exported.manifest["validation"]
    assert report and all(line.strip().startswith(("validation", "ok")) for line in report)
    assert sum("ok" in line for line in report) >= 10
    target = exported.manifest["target"]  # the README's job exports the target too, bf16 like the drafter
    past = {i["name"]: i for i in target["io"]["inputs"]}["past_key_0"]  # layer 0's K cache
    assert target["dtype"] == "bf16" and past["dtype"] == "bfloat16"
    assert target["validation"][0].startswith("target validation") and "(bf16:" in target["validation"][0] and all(
        line.strip().startswith("ok") for line in target["validation"][1:])
    onnx.checker.check_model(str(exported.out_dir / target["onnx"]), full_check=True)


def test_each_phase_records_the_peak_resident_memory_it_ended_with(exported):
    """The process's peak after each phase (the phase where it grew held it): every phase run, in order, never
    falling, none above the process's peak now."""
    from dspark_trt.process_memory import peak_rss_bytes

    peaks = exported.phase_peak_rss
    assert list(peaks)[1:4] == ["write ONNX weights", "validate ONNX", "target ONNX + validation"]
    assert list(peaks)[-1] == "manifest"
    values = list(peaks.values())
    assert values == sorted(values) and values[0] > 50 << 20 and values[-1] <= peak_rss_bytes()


def test_manifest_is_complete_and_consistent_with_the_files(exported):
    m = read_manifest(exported.out_dir)
    assert check_manifest(exported.out_dir, m) == []
    for key in ("checkpoint", "topk", "dtype", "num_draft_tokens", "graphs", "plugin", "kernel", "engines", "packages",
                "max_context", "target_layer_ids", "hf_hidden_state_indices"):
        assert m.get(key) is not None, key
    assert (m["topk"], m["dtype"], m["num_draft_tokens"]) == (512, "bf16", 7)
    assert m["checkpoint"]["config_digest"] and m["packages"]["onnx"]
    for name in ("context", "draft"):
        assert m["graphs"][name]["inputs"] == graph_io(exported.out_dir / m["graphs"][name]["file"])["inputs"]
    draft_outputs = [o["name"] for o in m["graphs"]["draft"]["outputs"]]
    assert draft_outputs == ["draft_tokens", "cand_ids", "cand_logits", "confidence"]


def test_plugin_record_matches_the_node_tensorrt_will_look_up(exported):
    import onnx

    from dspark_trt.export.plugin_graph import custom_nodes

    m = exported.manifest
    node = custom_nodes(onnx.load(str(exported.out_dir / m["plugin_graph"])))[0]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert (node.op_type, node.domain) == (m["plugin"]["name"], m["plugin"]["namespace"])
    assert attrs["plugin_namespace"].decode() == m["plugin"]["namespace"]
    assert attrs["plugin_version"].decode() == m["plugin"]["version"] == "1"
    assert attrs["k"] == 512 and attrs["aot"] == 1
    assert not onnx.load(str(exported.out_dir / m["plugin_graph"])).functions  # the plugin must win


def test_ptx_files_match_their_records(exported):
    kernel = exported.manifest["kernel"]
    archs = {k["arch"] for k in kernel["kernels"]}
    assert archs == {"sm_80", "sm_90a"}
    for entry in kernel["kernels"]:
        ptx = (exported.out_dir / kernel["dir"] / entry["file"]).read_text()
        assert hashlib.sha256(ptx.encode()).hexdigest() == entry["sha256"]
        assert f".entry {kernel['kernel_name']}" in ptx
        assert entry["launch"]["grid"][0] == "B" and entry["launch"]["block"][0] == 32 * entry["num_warps"]


@pytest.mark.rtx
def test_tensorrt_rtx_engines_were_built(exported):
    engines = exported.manifest["engines"]
    assert set(engines) == {"context.tensorrt-rtx", "draft.tensorrt-rtx", "target.tensorrt-rtx"}
    assert exported.manifest["target"]["engines"] == ["engines/target.rtx.plan"]
    T = exported.manifest["max_context"]
    for entry in engines.values():
        path = exported.out_dir / entry["file"]
        assert path.stat().st_size == entry["bytes"] > 10_000
        assert entry["build"]["compute_capability"] == "SM80"
        m = exported.manifest
        inputs = m["target"]["io"]["inputs"] if entry["graph"] == "target" else m["graphs"][entry["graph"]]["inputs"]
        assert list(entry["profile"]) == [i["name"] for i in inputs]
        chunk, cap = min(512, T), capacity_bucket(T)  # the target: a prefill chunk of new tokens, a capacity of past
        ranges = {"B": (1, 8), "T": (1, T), "Q": (1, chunk), "K": (1, chunk), "P": (1, cap), "S": (2, cap + chunk)}
        for i in inputs:  # batch 1..8 (the default max batch), context 1..max_context
            profile = entry["profile"][i["name"]]
            for dim, (lo, hi) in enumerate(zip(profile["min"], profile["max"])):
                want = ranges.get(i["shape"][dim])
                assert (lo, hi) == (want or (i["shape"][dim], i["shape"][dim]))
        assert entry["profiles"][0] == entry["profile"]
        if entry["graph"] != "target":
            assert len(entry["profiles"]) == 1
            continue
        verify = entry["profiles"][1]  # the target's small-Q verify profile: only Q and K narrow, to 16 new tokens
        assert len(entry["profiles"]) == 2
        assert verify["input_ids"]["max"] == verify["position_ids"]["max"] == verify["logits_index"]["max"] == [8, 16]
        narrowed = ("input_ids", "position_ids", "logits_index")
        assert all(verify[n] == entry["profile"][n] for n in verify if n not in narrowed)


@pytest.mark.rtx
def test_engine_less_export_then_build_engine(tiny_pair, tmp_path):
    out = tmp_path / "out"
    result = export_model(tiny_pair.drafter, out, ExportOptions(topk=16, dtype="fp32", engine="none", validate=False,
                                                            export_target=False), target_dir=tiny_pair.target)
    assert result.manifest["engines"] == {} and not (out / "engines").exists()
    assert any("dspark build-engine" in note for note in result.notes)
    with pytest.raises(DSparkTrtError, match="has no target graph to build: choose from context, draft"):
        build_engines(out, engine="tensorrt-rtx", graphs=("target",))  # exported without its target
    manifest = build_engines(out, engine="tensorrt-rtx", options=ExportOptions(max_batch_size=2), graphs=("context",))
    assert set(manifest["engines"]) == {"context.tensorrt-rtx"} and not (out / "engines" / "draft.rtx.plan").exists()
    manifest = build_engines(out, engine="tensorrt-rtx", options=ExportOptions(max_batch_size=2), graphs=("draft",))
    assert set(manifest["engines"]) == {"context.tensorrt-rtx", "draft.tensorrt-rtx"}  # one at a time, both kept
    assert check_manifest(out, digests=True) == []  # the engines added to "files", the rest as recorded
    assert {e["file"] for e in manifest["engines"].values()} <= set(manifest["files"])
    assert json.loads((out / "manifest.json").read_text())["engines"] == manifest["engines"]
    with pytest.raises(DSparkTrtError, match="exists; pass --force"):
        build_engines(out, engine="tensorrt-rtx")
    from tests.conftest import have_tensorrt

    if not have_tensorrt():  # the hint names only flags build-engine has (it has no --engine none)
        with pytest.raises(DSparkTrtError) as e:
            build_engines(out, engine="tensorrt")
        assert "or use --engine tensorrt-rtx" in str(e.value) and "none" not in str(e.value)


def test_build_engine_refuses_version_compatible_around_the_plugin(tmp_path):
    """Before TensorRT is even looked for: a version-compatible engine around the AOT plugin is unverified."""
    from dspark_trt.artifact.manifest import FORMAT_VERSION

    for topk, m, op in ((16, 0, "DSparkTopKMarkov"), (16, 4, "DSparkTopKMarkovUnion")):
        (tmp_path / "manifest.json").write_text(json.dumps({"format_version": FORMAT_VERSION, "topk": topk,
                                                            "markov_topm": m, "op_contract_version": 2}))
        with pytest.raises(DSparkTrtError, match=f"--version-compatible with the {op} AOT plugin is not supported"):
            build_engines(tmp_path, engine="tensorrt", options=ExportOptions(version_compatible=True))
