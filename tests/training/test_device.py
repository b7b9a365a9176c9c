"""The GPU path at toy scale on the CPU: the GPU preset's numbers and code path (batched writing on the target's
device, training there, a CPU checkpoint), run with ``--device cpu`` on the tiny pair."""

from __future__ import annotations

import json

import pytest
import torch

from dspark_trt.cli.main import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from dspark_trt.synthetic import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("device") / "pair", seed=0, target_init_std=0.2)


def test_the_gpu_preset_runs_on_the_cpu_at_toy_scale(pair, tmp_path):
    from dspark_trt.loader import load_drafter
    from dspark_trt.runtime import SpeculativeDecoder
    from dspark_trt.training.presets import PRESETS

    out = tmp_path / "drafter"
    code = main(["distill", "--target", str(pair.target), "-o", str(out), "--device", "cpu", "--preset", "gpu",
                 "--steps", "3", "--new-tokens", "8", "--val-prompts", "4", "--val-every", "2", "--threads", "1",
                 "--markov-rank", "8", "--block-size", "4", "--layers", "1"])
    assert code == 0
    summary = json.loads((out / "distill.json").read_text())
    s = summary["key"]["settings"]
    gpu = PRESETS["gpu"]
    assert (s["batch"], s["anchors"], s["data_batch"]) == (gpu["batch"], gpu["anchors"], gpu["data_batch"])
    assert s["steps"] == 3 and s["minutes"] is None and s["new_tokens"] == 8  # explicit options win
    assert len(summary["data"]["entries_written"]) == 1  # 32 + 4 rows in one batch of the preset's 512
    assert [p["step"] for p in summary["validation"]["curve"]] == [0, 2, 3]
    drafter = load_drafter(out, target_dir=pair.target)
    assert all(t.device.type == "cpu" for t in drafter.state_dict().values())
    dec = SpeculativeDecoder.from_pretrained(out, pair.target, device="cpu")
    prompts = [[3, 14, 15]]
    assert dec.generate(prompts, max_new_tokens=8, eos_token_id=[]).tokens == \
        dec.generate(prompts, max_new_tokens=8, eos_token_id=[], draft=False).tokens


def test_smollm2_settings_pick_the_preset_by_device():
    from dspark_trt.models.smollm2 import BANK_PROMPTS, smollm2_settings
    from dspark_trt.training.presets import PRESETS

    cpu = smollm2_settings()
    assert (cpu.minutes, cpu.bank_prompts, cpu.new_tokens, cpu.device) == (30.0, BANK_PROMPTS, 128, "cpu")
    gpu = smollm2_settings(device="cuda", data_dir="/x")
    assert all(getattr(gpu, k) == v for k, v in PRESETS["gpu"].items()) and gpu.data_dir == "/x"
    assert smollm2_settings(device="cuda", steps=5).minutes is None  # --steps replaces the preset's minutes
    assert smollm2_settings(device="cuda", bank_prompts=10).bank_prompts == 10


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_one_line(pair, tmp_path, capsys):
    code = main(["distill", "--target", str(pair.target), "-o", str(tmp_path / "d"), "--device", "cuda", "--steps", "1"])
    err = capsys.readouterr().err
    assert code == 1 and "no CUDA device" in err and "Traceback" not in err
    assert not (tmp_path / "d").exists()


def test_minutes_do_not_time_the_first_step(pair, tmp_path, monkeypatch):
    """``--minutes`` fixes the step count from steps 1 … 3: step 0's one-time costs (on a GPU the backward's kernels
    load, the optimizer allocates) are many GPU steps long and would cut the budget's step count short."""
    import importlib
    import types

    from dspark_trt.training import DistillSettings, DrafterShape, distill

    module = importlib.import_module("dspark_trt.training.distill")
    clock = [0.0]
    monkeypatch.setattr(module, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    real_step = module.distill_step

    def timed_step(drafter, data, t2d, step, s):
        clock[0] += 100.0 if step == 0 else 1.0  # step 0: one-time costs
        return real_step(drafter, data, t2d, step, s)

    monkeypatch.setattr(module, "distill_step", timed_step)
    settings = DistillSettings(minutes=0.1, new_tokens=8, random_prompts=6, batch=2, anchors=2, threads=1,
                               val_prompts=0, checkpoint_every_s=1e9)
    out = distill(pair.target, tmp_path / "d", shape=DrafterShape(markov_rank=8, block_size=4), settings=settings,
                  progress=False)
    assert json.loads((out / "distill.json").read_text())["steps"] == 6  # 6 s at 1 s a step (timing step 0: 4)


def test_a_cuda_ordinal_past_the_gpus_is_one_line(monkeypatch):
    """``--device cuda:1`` on a one-GPU machine (and a misspelt device) is refused in one line before the target
    loads, not by an 'invalid device ordinal' traceback from ``target.to``."""
    from dspark_trt.errors import DSparkTrtError
    from dspark_trt.training.distill import _device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert _device("cuda:0") == torch.device("cuda:0") and _device("cuda") == torch.device("cuda")
    with pytest.raises(DSparkTrtError, match="1 CUDA device"):
        _device("cuda:1")
    with pytest.raises(DSparkTrtError, match="not a torch device"):
        _device("cude")
