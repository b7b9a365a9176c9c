"""NonFiniteMonitor: cheap detection, the stage and layer named, one warning per request (issue #16)."""

from __future__ import annotations

import logging

import pytest
import torch

from dspark_trt.reference.markov import MarkovWalkResult
from dspark_trt.runtime.nonfinite import NonFiniteMonitor
from dspark_trt.synthetic import tiny_config

L, B, T, H, D, N, K = 2, 3, 5, 2, 4, 6, 8


@pytest.fixture
def config():
    return tiny_config(hidden_size=16, target_layer_ids=(1, 3, 4), num_target_layers=6)


def round_tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    taps = torch.randn(B, T, 3 * 16, generator=g)
    k, v = torch.randn(L, B, T, H, D, generator=g), torch.randn(L, B, T, H, D, generator=g)
    result = MarkovWalkResult(tokens=torch.zeros(B, N, dtype=torch.int64),
                              cand_ids=torch.zeros(B, N, K, dtype=torch.int64),
                              cand_logits=torch.randn(B, N, K, generator=g), confidence=None)
    return taps, k, v, result


def run(monitor, taps, k, v, result, keep=None, ids=(10, 11, 12)):
    keep = torch.full((B,), T) if keep is None else keep
    monitor.context(taps, k, v, keep, torch.tensor(ids))
    return monitor.draft(result, torch.tensor(ids))


def test_finite_rounds_are_silent(config, caplog):
    monitor = NonFiniteMonitor(config, drafter_dtype=torch.float16)
    with caplog.at_level(logging.WARNING, "dspark.runtime"):
        for seed in range(3):
            assert run(monitor, *round_tensors(seed)) == []
    assert not caplog.records


def test_non_finite_taps_name_the_target_layer_once_per_request(config, caplog):
    monitor = NonFiniteMonitor(config, drafter_dtype=torch.float16)
    taps, k, v, result = round_tensors()
    taps[1, 2, 16 + 5] = float("inf")  # request 11, tap 1 = target layer 3
    k[:, 1] = float("nan")  # its K/V follow: the earliest stage is reported
    result.cand_logits[1] = float("nan")
    with caplog.at_level(logging.WARNING, "dspark.runtime"):
        messages = run(monitor, taps, k, v, result)
        again = run(monitor, taps, k, v, result)
    assert len(messages) == 1 and again == [] and len(caplog.records) == 1
    assert messages[0].startswith("request 11: non-finite target hidden states in tap(s) [1] (target layer(s) [3]")
    assert "run the target in bf16 or fp32" in messages[0]


def test_non_finite_kv_name_the_drafter_layer_and_the_fix(config):
    monitor = NonFiniteMonitor(config, drafter_dtype=torch.float16)
    taps, k, v, result = round_tensors()
    v[1, 2, 0, 1, 3] = float("-inf")  # request 12, drafter layer 1
    (message,) = run(monitor, taps, k, v, result)
    assert message.startswith("request 12: non-finite context K/V in drafter layer(s) [1] while its taps are finite")
    assert "overflowed the drafter's fp16" in message and "--dtype bf16" in message and "re-export" in message


def test_non_finite_logits_alone(config):
    monitor = NonFiniteMonitor(config, drafter_dtype=torch.bfloat16)
    taps, k, v, result = round_tensors()
    result.cand_logits[0, 4, 2] = float("nan")
    (message,) = run(monitor, taps, k, v, result)
    assert message.startswith("request 10: non-finite draft logits at slot(s) [4]") and "bf16" in message


def test_tokens_that_do_not_enter_the_cache_are_ignored(config):
    """Prefill padding / rejected drafts' taps beyond ``keep`` never reach the drafter's cache."""
    monitor = NonFiniteMonitor(config)
    taps, k, v, result = round_tensors()
    keep = torch.tensor([T, 2, T])
    taps[1, 3] = float("nan")
    k[:, 1, 2:] = float("nan")
    assert run(monitor, taps, k, v, result, keep=keep) == []
    k[0, 1, 1, 0, 0] = float("nan")  # inside keep
    assert len(run(monitor, taps, k, v, result, keep=keep)) == 1


def test_pending_context_is_checked_with_the_next_draft_round(config):
    """Rows may leave between the context call and the next draft: ids are the context call's."""
    monitor = NonFiniteMonitor(config)
    taps, k, v, result = round_tensors()
    k[0, 2] = float("nan")
    monitor.context(taps, k, v, torch.full((B,), T), torch.tensor([10, 11, 12]))
    _, _, _, small = round_tensors(1)
    small = MarkovWalkResult(tokens=small.tokens[:2], cand_ids=small.cand_ids[:2], cand_logits=small.cand_logits[:2],
                             confidence=None)
    (message,) = monitor.draft(small, torch.tensor([10, 11]))
    assert message.startswith("request 12:")


# -- in the decoder: a real fp16 overflow --------------------------------------------------------------------
def _decoder(pair, target, dtype, *, fc_scale, all_fp16=False):
    from dspark_trt import load_drafter
    from dspark_trt.runtime import SpeculativeDecoder
    from dspark_trt.runtime.drafters.torch import TorchDrafterBackend

    drafter = load_drafter(pair.drafter, dtype=dtype, target_dir=pair.target)
    drafter.fc.weight.mul_(fc_scale)  # taps × 3·10⁵ as fc sees them: hidden_norm undoes it, unless fc overflows
    return SpeculativeDecoder(target, TorchDrafterBackend(drafter.half() if all_fp16 else drafter))


def test_decoder_warns_once_per_request_when_an_fp16_fusion_overflows(distilled_pair, caplog):
    from dspark_trt.runtime import HFTarget

    target = HFTarget.from_pretrained(distilled_pair.target, dtype="fp32", device="cpu")
    prompts = [[1, 2, 3, 4], [5, 6, 7, 8, 9, 10], [11, 12, 13]]
    results = {}
    with caplog.at_level(logging.WARNING, "dspark.runtime"):
        for name, dtype, all_fp16 in (("fp32", "fp32", False), ("fp16", "fp16", False), ("all-fp16", "fp16", True)):
            caplog.clear()
            results[name] = _decoder(distilled_pair, target, dtype, fc_scale=3e5, all_fp16=all_fp16).generate(
                prompts, 24)
            results[name + " warnings"] = [r.getMessage() for r in caplog.records]
    assert results["fp32 warnings"] == results["fp16 warnings"] == []
    warned = results["all-fp16 warnings"]
    assert sorted(m.split(":")[0] for m in warned) == ["request 0", "request 1", "request 2"]
    assert all("drafter layer(s) [0, 1]" in m and "--dtype bf16" in m for m in warned)
    assert results["all-fp16"].tokens == results["fp32"].tokens == results["fp16"].tokens  # lossless regardless
    fp32, fp16, broken = (results[n].stats.mean_acceptance_length for n in ("fp32", "fp16", "all-fp16"))
    assert fp16 == pytest.approx(fp32, abs=0.2) and fp32 > 1.5 and broken < 1.2
