"""`dspark generate --export OUT` (exported target + drafter, no transformers model) gives the tokens of
`dspark generate --drafter D --target T`; `dspark bench e2e --export`; the one-line errors of --export."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from dspark_trt.cli.main import main

pytestmark = [pytest.mark.onnx, pytest.mark.slow]

BATCHES = {"one": ["5 6 7"], "three": ["5 6 7 8 9 10 11", "42", "100 101 102"]}


def generate(capsys, *args) -> dict:
    assert main(["generate", "--json", "--threads", "1", "--max-new-tokens", "16", *map(str, args)]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("export, pair, topk", [("qwen3_topk_export", "random_pair", "16"),
                                                ("llama_dense_export", "speculators_llama_pair", "off")])
@pytest.mark.parametrize("batch", ["one", "three"])
@pytest.mark.parametrize("sampling", [[], ["--temperature", "1", "--seed", "7"]], ids=["greedy", "sampled"])
def test_export_gives_the_tokens_of_the_checkpoints(export, pair, topk, batch, sampling, request, capsys):
    out, pair = request.getfixturevalue(export), request.getfixturevalue(pair)
    ids = [a for p in BATCHES[batch] for a in ("--input-ids", p)]
    exported = generate(capsys, "--export", out, *ids, *sampling)
    reference = generate(capsys, "--drafter", pair.drafter, "--target", pair.target, "--topk", topk, *ids, *sampling)
    assert exported["tokens"] == reference["tokens"]
    assert [len(t) for t in exported["tokens"]] == [16] * len(BATCHES[batch])
    assert exported["stats"]["rounds"] >= 1


@pytest.mark.parametrize("export, pair, sampling", [("gated_topk_export", "gated_pair", []),
                                                     ("rnn_topk_export", "rnn_pair", ["--temperature", "1", "--seed", "7"])],
                         ids=["gated-greedy", "rnn-sampled"])  # each head's graph once, both noise paths
def test_gated_and_rnn_exports_give_the_tokens_of_the_checkpoints(export, pair, sampling, request, capsys):
    """issue 42: the DSparkTopKMarkovGated / RNN draft graph in onnxruntime drafts what the torch backend drafts, so
    `generate --export` writes the checkpoints' tokens (greedy: the target's own; sampled: the same seeded draws)."""
    out, pair = request.getfixturevalue(export), request.getfixturevalue(pair)
    manifest = json.loads((out / "manifest.json").read_text())
    head_op = {"gated_topk_export": "DSparkTopKMarkovGated", "rnn_topk_export": "DSparkTopKMarkovRNN"}[export]
    assert manifest["op_contract_version"] == 3 and manifest["plugin"]["op"] == head_op  # its plugin for TensorRT
    ids = [a for p in BATCHES["three"] for a in ("--input-ids", p)]
    exported = generate(capsys, "--export", out, *ids, *sampling)
    reference = generate(capsys, "--drafter", pair.drafter, "--target", pair.target, "--topk", "16", *ids, *sampling)
    assert exported["tokens"] == reference["tokens"]
    counts = ("rounds", "drafted", "accepted", "per_position_acceptance")  # the same drafts accepted round by round
    assert [exported["stats"][c] for c in counts] == [reference["stats"][c] for c in counts]
    assert exported["stats"]["accepted"] > 0
    if not sampling:
        plain = generate(capsys, "--drafter", pair.drafter, "--target", pair.target, "--no-draft", *ids)
        assert exported["tokens"] == plain["tokens"]  # lossless: the target's greedy output


def test_no_transformers_model_is_loaded(qwen3_topk_export):
    code = ("import sys, json; from dspark_trt.runtime import SpeculativeDecoder; "
            f"d = SpeculativeDecoder.from_export({str(qwen3_topk_export)!r}); "
            "d.generate([[1, 2, 3]], 4); "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('transformers.models.'))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not [m for m in loaded if "modeling_" in m], loaded


def test_bench_e2e_reports_both_targets(qwen3_topk_export, capsys):
    assert main(["bench", "e2e", "--export", str(qwen3_topk_export), "--threads", "1", "--input-ids", "5 6 7",
                 "--max-new-tokens", "8", "--repeats", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"exported target (onnxruntime)", "transformers target"}
    ort, hf = report["exported target (onnxruntime)"], report["transformers target"]
    assert (ort["target"], hf["target"]) == ("OnnxRuntimeTarget", "HFTarget")
    for r in (ort, hf):
        assert r["speculative_tokens_per_second"] > 0 and r["target_only_tokens_per_second"] > 0 and r["same_tokens"]
    assert ort["same_tokens_as_transformers"]


def one_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("command", [["generate"], ["bench", "e2e", "--repeats", "1"]])
def test_a_request_past_the_export_bound_is_refused_at_once(qwen3_topk_export, command, capsys, monkeypatch):
    """The export's KV bound (--max-context, 8192 here) against prompt + --max-new-tokens, before any prefill
    (the warm-up of the benchmark included), not after thousands of rounds."""
    from dspark_trt.runtime.batch import Batch

    def poisoned(*_args, **_kwargs):
        raise AssertionError("a request was admitted before the bound was checked")

    monkeypatch.setattr(Batch, "admit", poisoned)
    code = main([*command, "--export", str(qwen3_topk_export), "--input-ids", "5 6 7", "--max-new-tokens", "100000"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert "prompt (3 tokens) + max_new_tokens (100000) exceeds the model's context of 8192 tokens" in err[0]
    assert "at most 8189 new tokens" in err[0]


def test_an_export_without_target_says_how_to_add_it(random_pair, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["export", str(random_pair.drafter), "--target", str(random_pair.target), "--skip-target", "--topk",
                 "off", "--dtype", "fp32", "--engine", "none", "--no-validate", "-o", str(out)]) == 0
    assert not (out / "onnx" / "target.onnx").exists()
    capsys.readouterr()
    assert main(["generate", "--export", str(out), "--input-ids", "1 2"]) == 1
    assert "has no exported target" in one_error(capsys)
    assert main(["generate", "--export", str(out), "--input-ids", "1 2"]) == 1
    assert "dspark-export DRAFTER --target TARGET" in one_error(capsys)


def test_a_checkpoint_or_a_wrong_path_given_as_export_says_what_it_is(tiny_pair, tmp_path, capsys):
    """issue 47: a drafter checkpoint (its pair's manifest.json has no format_version) read as an export with
    "format_version None ... re-run dspark-export"; a checkpoint's own directory as "has no manifest.json"."""
    pair = tiny_pair.drafter.parent
    cases = [
        (pair, f"{pair} is a drafter checkpoint (drafter/ + target/), not an export directory: export it "
               f"(dspark-export {tiny_pair.drafter} --target {tiny_pair.target} -o OUT"),
        (pair, f"or run it as it is (--drafter {tiny_pair.drafter} --target {tiny_pair.target})"),
        (tiny_pair.drafter, f"{tiny_pair.drafter} is a drafter checkpoint, not an export directory"),
        (tmp_path / "nowhere", "nowhere does not exist: pass an export directory"),
        (tiny_pair.drafter / "config.json", "config.json is a file, not an export directory"),
    ]
    capsys.readouterr()
    for given, message in cases:
        assert main(["generate", "--export", str(given), "--input-ids", "1 2"]) == 1, given
        assert message in one_error(capsys)


def test_a_truncated_target_graph_is_one_line_exit_1(qwen3_topk_export, tmp_path, capsys):
    out = tmp_path / "export"
    shutil.copytree(qwen3_topk_export, out)
    path = out / "onnx" / "target.onnx"
    path.write_bytes(path.read_bytes()[:1000])
    assert main(["generate", "--export", str(out), "--input-ids", "1 2"]) == 1
    assert "target.onnx" in one_error(capsys)


def test_a_target_too_shallow_for_the_taps_is_one_line_at_export(random_pair, tmp_path, capsys):
    from dspark_trt.synthetic import write_tiny_checkpoint

    shallow = write_tiny_checkpoint(tmp_path / "shallow", num_target_layers=4, seed=2)
    assert main(["export", str(random_pair.drafter), "--target", str(shallow.target), "-o", str(tmp_path / "o")]) == 1
    assert "invalid for this 4-layer target: [4] outside [-1, 3]" in one_error(capsys)
    assert not (tmp_path / "o").exists()


def test_tensorrt_backend_without_tensorrt_exits_1_in_one_line(qwen3_topk_export, capsys):
    from dspark_trt.runtime.tensorrt_engine import tensorrt_available

    if tensorrt_available() is None:
        pytest.skip("TensorRT and a GPU are present")
    assert main(["generate", "--export", str(qwen3_topk_export), "--backend", "tensorrt", "--input-ids", "5 6"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs full TensorRT and a GPU" in err[0]
