"""Polygraphy on the exported draft graph: ``inspect model`` shows the node; ``run --onnxrt`` passes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

POLYGRAPHY = next((str(p) for p in (Path(sys.executable).with_name("polygraphy"),) if p.is_file()),
                  shutil.which("polygraphy"))
pytestmark = [pytest.mark.onnx, pytest.mark.skipif(POLYGRAPHY is None, reason="polygraphy CLI not installed")]


def polygraphy(*args):
    return subprocess.run([POLYGRAPHY, *map(str, args)], capture_output=True, text=True, timeout=300)


def test_inspect_model_shows_the_custom_node(tiny_pair, onnx_export):
    path = onnx_export(tiny_pair, "fp32", 16) / "onnx" / "draft.onnx"
    result = polygraphy("inspect", "model", path, "--show", "layers", "attrs")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "DSparkTopKMarkov [Op: DSparkTopKMarkov]" in text
    block = text[text.index("DSparkTopKMarkov [Op: DSparkTopKMarkov]"):]
    block = block[:block.index("Node ", 10) if "Node " in block[10:] else None]
    for fragment in ("plugin_version = 1", "plugin_namespace = dspark", "k = 16", "logit_scale = 1.0",
                     "markov_w1", "markov_w2", "draft_tokens", "cand_logits"):
        assert fragment in block, fragment


def test_run_onnxrt_matches_saved_reference_outputs(tiny_pair, onnx_export, tmp_path):
    """``polygraphy run draft.onnx --onnxrt`` compared with the reference's outputs saved as Polygraphy JSON;
    a perturbed reference makes the same command fail (the comparison is real)."""
    from polygraphy.comparator import RunResults
    from polygraphy.comparator.struct import IterationResult
    from polygraphy.json import save_json

    from dspark_trt import load_drafter

    drafter = load_drafter(tiny_pair.drafter, dtype="fp32", target_dir=tiny_pair.target)
    c = drafter.config
    B, T = 2, 6
    g = torch.Generator().manual_seed(3)
    taps = torch.randn(B, T, c.num_taps * c.hidden_size, generator=g)
    ctx_k, ctx_v = drafter.context_kv(taps, torch.arange(T).expand(B, T))
    feeds = {"anchor": torch.tensor([17, 2030]), "ctx_len": torch.tensor([6, 3]), "ctx_start": torch.tensor([2, 0]),
             "temperature": torch.tensor([0.0, 1.0]), "seed": torch.tensor([5, 77])}
    for layer in range(c.num_hidden_layers):  # the draft graph's per-layer heads-first context [B, H_kv, T, D]
        feeds[f"ctx_key_{layer}"] = ctx_k[layer].transpose(1, 2).contiguous()
        feeds[f"ctx_value_{layer}"] = ctx_v[layer].transpose(1, 2).contiguous()
    ref = drafter.draft(feeds["anchor"], ctx_k, ctx_v, feeds["ctx_len"], topk=16, temperature=feeds["temperature"],
                        seed=feeds["seed"], ctx_start=feeds["ctx_start"])
    int32 = {"anchor", "ctx_len", "ctx_start", "seed"}
    save_json([{k: (v.to(torch.int32) if k in int32 else v).numpy() for k, v in feeds.items()}], tmp_path / "in.json")

    def save_reference(file, tokens):
        outputs = {"draft_tokens": tokens.to(torch.int32).numpy(), "cand_ids": ref.cand_ids.to(torch.int32).numpy(),
                   "cand_logits": ref.cand_logits.numpy(), "confidence": ref.confidence.numpy()}
        results = RunResults()
        results.append(("reference", [IterationResult(outputs, runner_name="reference")]))
        results.save(str(file))

    save_reference(tmp_path / "ref.json", ref.tokens)
    bad = ref.tokens.clone()
    bad[1, 3] += 1
    save_reference(tmp_path / "bad.json", bad)
    model = onnx_export(tiny_pair, "fp32", 16) / "onnx" / "draft.onnx"
    common = [model, "--onnxrt", "--load-inputs", tmp_path / "in.json", "--atol", "1e-5", "--rtol", "1e-5"]
    good = polygraphy("run", *common, "--load-outputs", tmp_path / "ref.json")
    assert good.returncode == 0 and "PASSED" in good.stdout + good.stderr, good.stdout[-3000:] + good.stderr[-2000:]
    failed = polygraphy("run", *common, "--load-outputs", tmp_path / "bad.json")
    assert failed.returncode != 0 and "draft_tokens" in failed.stdout + failed.stderr


def test_run_onnxrt_random_inputs(tiny_pair, onnx_export):
    """Polygraphy's own random inputs through the top-k and dense draft graphs, outputs finite."""
    kv = [f"ctx_{kind}_{layer}:[3,2,9,16]" for kind in ("key", "value") for layer in range(2)]  # [B, H_kv, T, D]
    shapes = ["anchor:[3]", *kv, "ctx_len:[3]", "ctx_start:[3]", "temperature:[3]", "seed:[3]"]
    for topk in (16, "off"):
        result = polygraphy("run", onnx_export(tiny_pair, "fp32", topk) / "onnx" / "draft.onnx", "--onnxrt", "--validate",
                            "--input-shapes", *shapes)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


def documented_commands() -> list[str]:
    text = (Path(__file__).resolve().parents[2] / "docs" / "export.md").read_text()
    return [line.strip() for line in text.splitlines()
            if line.startswith("    ") and line.strip().startswith(("polygraphy ", "python -m dspark_trt"))]


@pytest.mark.slow
def test_the_documented_commands_run_on_the_default_bf16_export(tiny_pair, onnx_export, tmp_path):
    """docs/export.md's Polygraphy commands, verbatim but for the paths, on a bf16 export (the default dtype)."""
    import shlex

    commands = documented_commands()
    assert [c.split()[:2] for c in commands] == [["polygraphy", "inspect"], ["python", "-m"], ["polygraphy", "run"]]
    export = onnx_export(tiny_pair, "bf16", 16)
    for command in commands:
        argv = shlex.split(command.replace("out/export", str(export)).replace("out/", f"{tmp_path}/"))
        argv[0] = POLYGRAPHY if argv[0] == "polygraphy" else sys.executable
        result = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, (command, result.stdout[-3000:] + result.stderr[-2000:])
    assert "PASSED" in result.stdout + result.stderr
    shapes = shlex.split(commands[-1])[shlex.split(commands[-1]).index("--input-shapes") + 1:]
    direct = polygraphy("run", export / "onnx" / "draft.onnx", "--onnxrt", "--input-shapes", *shapes)
    assert direct.returncode != 0 and "NOT_IMPLEMENTED" in direct.stdout + direct.stderr  # why the twin is needed


def test_the_twin_tool_refuses_to_overwrite_and_non_bf16_graphs(tiny_pair, onnx_export, tmp_path):
    from dspark_trt.export.bf16_emulation import main

    (tmp_path / "t.onnx").write_text("mine")
    assert main([str(onnx_export(tiny_pair, "bf16", 16) / "onnx" / "draft.onnx"), str(tmp_path / "t.onnx")]) == 1
    assert (tmp_path / "t.onnx").read_text() == "mine"
    assert main([str(onnx_export(tiny_pair, "fp32", 16) / "onnx" / "draft.onnx"), str(tmp_path / "u.onnx")]) == 1
    assert not (tmp_path / "u.onnx").exists()


def test_the_twin_tool_writes_the_unrounded_twin(tiny_pair, onnx_export, tmp_path):
    """``--unrounded``: the same graph without the rounding pairs (fewer nodes, no cast to bf16 left)."""
    import onnx

    from dspark_trt.export.bf16_emulation import main

    draft = onnx_export(tiny_pair, "bf16", 16) / "onnx" / "draft.onnx"
    assert main([str(draft), str(tmp_path / "r.onnx")]) == 0
    assert main([str(draft), str(tmp_path / "u.onnx"), "--unrounded"]) == 0
    rounded, unrounded = (onnx.load(str(tmp_path / f)) for f in ("r.onnx", "u.onnx"))
    to_bf16 = lambda m: [n for n in m.graph.node if n.op_type == "Cast" and n.attribute[0].i == onnx.TensorProto.BFLOAT16]  # noqa: E731
    assert to_bf16(rounded) and not to_bf16(unrounded)
    assert len(unrounded.graph.node) == len(rounded.graph.node) - 2 * len(to_bf16(rounded))
