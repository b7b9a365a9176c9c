"""The streamed export (export/streaming.py) writes the very graphs the in-memory export writes.

Traced on placeholders of the large weights, initializers streamed from the checkpoint into external data: the
nodes, functions, names, I/O, metadata and every initializer's bytes must equal those of the drafter loaded and
exported in memory (``stream=False``), for both checkpoint formats (speculators: embed_tokens / lm_head read
from the target), checkpoint dtypes fp32 and bf16 into fp32 / fp16 / bf16 exports, top-k, dense and the
candidate union (a table computed from the Markov weights).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dspark_trt.errors import DSparkTrtError
from dspark_trt import streaming as placeholders
from dspark_trt.export import streaming
from dspark_trt.artifact.layout import GRAPH_FILES
from dspark_trt.export.onnx import OnnxFromCheckpoint, SaveOnnx, write_graphs


def _bf16_copy(src, out):
    """The checkpoint directory ``src`` with every floating tensor stored as bf16."""
    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True)
    for f in src.iterdir():
        if f.suffix == ".safetensors":
            tensors = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in load_file(f).items()}
            save_file(tensors, str(out / f.name), metadata={"format": "pt"})
        elif f.is_file():
            (out / f.name).write_bytes(f.read_bytes())
    return out


def _load(path):
    import onnx

    return onnx.load(str(path))  # external data resolved


def _same_graph(streamed, memory, name):
    from onnx import numpy_helper

    a, b = _load(streamed / GRAPH_FILES[name]), _load(memory / GRAPH_FILES[name])
    inits_a = [(i.name, i.data_type, list(i.dims)) for i in a.graph.initializer]
    inits_b = [(i.name, i.data_type, list(i.dims)) for i in b.graph.initializer]
    assert inits_a == inits_b, f"{name}: initializer names/types/shapes differ"
    for x, y in zip(a.graph.initializer, b.graph.initializer):
        xa, ya = numpy_helper.to_array(x), numpy_helper.to_array(y)
        assert xa.tobytes() == ya.tobytes(), f"{name}: initializer {x.name} bytes differ"
    for model in (a, b):
        del model.graph.initializer[:]
    assert a.SerializeToString() == b.SerializeToString(), f"{name}: nodes, functions, I/O or metadata differ"


def _both(drafter, target, tmp_path, **options):
    streamed = SaveOnnx(OnnxFromCheckpoint(drafter, target_dir=target, validate=False, **options),
                        tmp_path / "streamed")()
    memory = tmp_path / "memory"
    memory.mkdir()
    write_graphs(OnnxFromCheckpoint(drafter, target_dir=target, validate=False, stream=False, **options)(), memory)
    return streamed, memory


@pytest.mark.parametrize("dtype, topk, markov_topm", [("bf16", 16, 4)])  # fp32: the speculators test below
def test_streamed_graphs_equal_in_memory(tiny_pair, tmp_path, dtype, topk, markov_topm):
    streamed, memory = _both(tiny_pair.drafter, tiny_pair.target, tmp_path, dtype=dtype, topk=topk,
                             markov_topm=markov_topm)
    for name in GRAPH_FILES:
        _same_graph(streamed, memory, name)
        assert (streamed / f"{GRAPH_FILES[name]}.data").stat().st_size > 0  # weights outside the graph
    from dspark_trt.artifact.manifest import graph_io

    assert json.loads((streamed / "manifest.json").read_text())["graphs"] == \
        {name: {"file": file, **graph_io(memory / file)} for name, file in GRAPH_FILES.items()}


def test_streamed_bf16_checkpoint_speculators_into_fp32(tiny_odd_pair, tmp_path):
    """bf16 checkpoint (drafter and target) → fp32 export; speculators: embed_tokens / lm_head from the target."""
    drafter = _bf16_copy(tiny_odd_pair.drafter, tmp_path / "ck" / "drafter")
    target = _bf16_copy(tiny_odd_pair.target, tmp_path / "ck" / "target")
    streamed, memory = _both(drafter, target, tmp_path, dtype="fp32", topk=16)
    for name in GRAPH_FILES:
        _same_graph(streamed, memory, name)


@pytest.mark.slow  # three exports of a tiny pair per head (~60 s)
@pytest.mark.parametrize("head, rank", [("rnn", 64)])  # the harder head; gated streams the same projection path
def test_streamed_gated_and_rnn_heads_equal_in_memory_and_validate(head, rank, tmp_path):
    """issue 42: a head projection large enough to be a placeholder (gate_proj [128, 192], joint_proj [192, 192] >
    LAZY_NUMEL): the draft graph that splits it into the hidden part and the walk's weight streams it, with the
    very graph and bytes of the in-memory export, and the streamed files validate against the reference."""
    from dspark_trt.checkpoint import expected_tensors
    from dspark_trt.config import DSparkConfig
    from dspark_trt.synthetic import write_tiny_checkpoint

    pair = write_tiny_checkpoint(tmp_path / "pair", seed=13, markov_head_type=head, markov_rank=rank, vocab_size=257,
                                 block_size=4, sample_from_anchor=head == "gated")
    proj = "gate_proj" if head == "gated" else "joint_proj"
    shape = expected_tensors(DSparkConfig.from_pretrained(pair.drafter))[f"markov_head.{proj}.weight"].shape
    assert placeholders.Placeholders().wants(shape)  # the case really streams the projection
    streamed, memory = _both(pair.drafter, pair.target, tmp_path, dtype="bf16", topk=16)
    for name in GRAPH_FILES:
        _same_graph(streamed, memory, name)
    out = SaveOnnx(OnnxFromCheckpoint(pair.drafter, target_dir=pair.target, dtype="fp32", topk=16),
                   tmp_path / "validated")()
    record = json.loads((out / "manifest.json").read_text())
    assert record["op_contract_version"] == 3
    assert record["validation"] and all("FAIL" not in line for line in record["validation"])


def test_streamed_validation_runs_on_the_written_files(tiny_pair, tmp_path, caplog):
    """Validation (default) of a streamed export: onnxruntime on the written graphs (bf16: the twin casting the
    external weights per run) against the reference drafter; a weight written wrong fails it."""
    import logging

    caplog.set_level(logging.INFO, logger="dspark.export")
    out = SaveOnnx(OnnxFromCheckpoint(tiny_pair.drafter, target_dir=tiny_pair.target, dtype="bf16", topk=16),
                   tmp_path / "ok")()
    record = json.loads((out / "manifest.json").read_text())
    assert record["validation"] and all("FAIL" not in line for line in record["validation"])
    assert not list(out.glob(".twin-*"))  # the weightless twin is removed once loaded
    assert "stream from the checkpoint" in caplog.text

    from dspark_trt.errors import ValidationMismatch

    original = streaming.StreamedTensor.tofile

    def scaled(self, file):  # a writer that gets lm_head wrong: validation must notice
        if self.recipe.key != "lm_head.weight":
            return original(self, file)
        view = self._source_view()
        file.write(memoryview((2.0 * view.to(self.recipe.dtype)).contiguous().reshape(-1).view(torch.uint8).numpy()))

    streaming.StreamedTensor.tofile = scaled
    try:
        with pytest.raises(ValidationMismatch):
            SaveOnnx(OnnxFromCheckpoint(tiny_pair.drafter, target_dir=tiny_pair.target, dtype="fp32", topk=16),
                     tmp_path / "bad")()
    finally:
        streaming.StreamedTensor.tofile = original
    assert not (tmp_path / "bad").exists()


def test_placeholders_hold_no_memory_and_refuse_small_sizes():
    import resource

    ph = placeholders.Placeholders()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = ph.tensor(placeholders.Recipe(__import__("pathlib").Path("."), "w", (1 << 15, 1 << 15), torch.bfloat16))  # 2 GiB
    assert t.shape == (1 << 15, 1 << 15) and ph.nbytes == 2 << 30
    assert float(t[123, 456]) == 0.0 and ph.find(t[7].data_ptr()) is not None
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 << 10  # KiB: nothing resident
    with pytest.raises(DSparkTrtError, match="larger than 1024"):
        placeholders.Placeholders(lazy_numel=100)


def test_read_tensor_refuses_a_truncated_shard(tiny_pair, tmp_path):
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_bytes((tiny_pair.drafter / "config.json").read_bytes())
    data = (tiny_pair.drafter / "model.safetensors").read_bytes()
    (drafter / "model.safetensors").write_bytes(data[: len(data) - 1000])
    last = max(json.loads(data[8:8 + int.from_bytes(data[:8], "little")]).items(),
               key=lambda kv: kv[1]["data_offsets"][1] if isinstance(kv[1], dict) and "data_offsets" in kv[1] else -1)
    with pytest.raises(DSparkTrtError, match="truncated|not a readable safetensors"):
        placeholders.read_tensor(drafter, last[0])
    assert np.isfinite(placeholders.read_tensor(tiny_pair.drafter, "fc.weight").float().numpy()).all()


@pytest.fixture(scope="module")
def streamed_target(tiny_pair, tmp_path_factory):
    """The tiny target's bf16 graph (taps 1, 2, 4) traced on placeholders and streamed, once for the module (its
    validations only read it) → (graph path, the placeholders it was traced on)."""
    from dspark_trt.export.target_onnx import build_target_model, export_target_onnx

    ph = placeholders.Placeholders()
    out = tmp_path_factory.mktemp("streamed-target") / "s" / "target.onnx"
    return export_target_onnx(build_target_model(tiny_pair.target, torch.bfloat16, placeholders=ph), [1, 2, 4], out,
                              placeholders=ph), ph


def test_streamed_target_equals_in_memory_and_validates_full_or_subset(tiny_pair, streamed_target, tmp_path):
    """The target graph traced on placeholders (build_target_model) and streamed equals the in-memory export;
    validation at size takes the full graph when it fits, else the same export of a subset of layers — and says
    which."""
    import onnx
    from onnx import numpy_helper

    from dspark_trt.export.target_onnx import export_target_onnx, load_target_model
    from dspark_trt.export.validate_target import validate_target_files

    a, ph = streamed_target
    b = export_target_onnx(load_target_model(tiny_pair.target, torch.bfloat16), [1, 2, 4], tmp_path / "m" / "target.onnx")
    assert ph.regions and a.with_name("target.onnx.data").is_file()
    A, B = onnx.load(str(a)), onnx.load(str(b))
    assert [(i.name, list(i.dims)) for i in A.graph.initializer] == [(i.name, list(i.dims)) for i in B.graph.initializer]
    for x, y in zip(A.graph.initializer, B.graph.initializer):
        assert numpy_helper.to_array(x).tobytes() == numpy_helper.to_array(y).tobytes(), x.name
    del A.graph.initializer[:], B.graph.initializer[:]
    assert A.SerializeToString() == B.SerializeToString()

    full = validate_target_files(a, tiny_pair.target, [1, 2, 4], dtype="bf16", work_dir=tmp_path / "w")
    assert full.ok and "the full graph (6 layers" in full.title
    sub = validate_target_files(a, tiny_pair.target, [1, 2, 4], dtype="bf16", work_dir=tmp_path / "w", available=1)
    assert sub.ok and "subset: the same export of decoder layers 0..1 of 6" in sub.title and "taps [1]" in sub.title
    assert not (tmp_path / "w").exists()


def test_target_validation_is_sized_for_one_copy_of_the_weights(tiny_pair, streamed_target, tmp_path, monkeypatch):
    """The reference runs before the graph is mapped, so the full graph validates once one copy of the weights (+ the
    bf16 casts + 1 GB) fits; below that a subset, whose size free disk bounds too (the title says which bound)."""
    import dspark_trt.export.validate_target as vt
    from dspark_trt.artifact.external_data import load_graph_only

    a, _ = streamed_target
    sizes = [vt._nbytes(i) for i in load_graph_only(a).graph.initializer]
    need = vt.validation_need(sum(sizes), 2 * max(sizes))
    assert need == sum(sizes) + 4 * max(sizes) + (1 << 30)
    fits = vt.validate_target_files(a, tiny_pair.target, [1, 2, 4], dtype="bf16", work_dir=tmp_path / "w",
                                    available=int(need / 0.9) + 2)
    assert fits.ok and "the full graph (6 layers" in fits.title
    short = vt.validate_target_files(a, tiny_pair.target, [1, 2, 4], dtype="bf16", work_dir=tmp_path / "w",
                                     available=int(need / 0.9) - 2)
    assert short.ok and "a subset" in short.title and "bounded by memory" in short.title
    monkeypatch.setattr("dspark_trt.export.disk.free_bytes", lambda path: (0, path))
    tight = vt.validate_target_files(a, tiny_pair.target, [1, 2, 4], dtype="bf16", work_dir=tmp_path / "w",
                                     available=int(need / 0.9) - 2)
    assert tight.ok and "decoder layers 0..1 of 6" in tight.title and "bounded by free disk" in tight.title


def test_drafter_validation_at_size_full_or_subset(tiny_pair, tmp_path):
    """The written drafter graphs validate in full when they fit beside the reference, else the same export of
    its first draft layers; the report's first line says which."""
    exported = OnnxFromCheckpoint(tiny_pair.drafter, target_dir=tiny_pair.target, dtype="bf16", topk=16)()
    out = tmp_path / "onnx"
    out.mkdir()
    from dspark_trt.export.onnx import write_graphs

    write_graphs(exported, out)
    full = exported.validate_files(out)
    assert "the full graphs (2 draft layers" in full[0] and all("FAIL" not in line for line in full)
    sub = exported.validate_files(out, available=1)
    assert "a subset: the same export of draft layers 0..0 of 2" in sub[0] and all("FAIL" not in line for line in sub)
    assert not (out / ".validation").exists()
