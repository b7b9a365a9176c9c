"""``dspark bench context``: prompts that end alike at every length, interleaved step timings, a real run on the
tiny export (figures reported, never asserted; greedy outputs and the report's shape are)."""

from __future__ import annotations

import json

import pytest
import torch

from dspark_trt.bench.context import (cache_bytes, context_prompt, draft_round_costs, draft_runners, filler_tokens,
                                      goals, step_costs, tables)
from dspark_trt.errors import DSparkTrtError


def test_every_context_ends_with_the_same_request():
    filler = list(range(100, 400))
    tail = [1, 2, 3]
    prompts = {S: context_prompt(S, tail, filler) for S in (2, 3, 16, 300)}
    assert prompts[2] == [2, 3] and prompts[3] == tail  # shorter than the request: its last tokens
    assert prompts[16] == list(range(387, 400)) + tail  # the filler's end, then the request
    assert len(prompts[300]) == 300 and prompts[300][-3:] == tail
    with pytest.raises(DSparkTrtError, match="the filler has 300 tokens, 398 are needed"):
        context_prompt(401, tail, filler)


def test_filler_without_a_tokenizer_is_seeded_ids():
    a, b = filler_tokens(None, 257, 50), filler_tokens(None, 257, 50)
    assert a == b and len(a) == 50 and all(0 <= t < 257 for t in a) and len(set(a)) > 10


class _Counting:
    """A target that records its verify widths (the real targets are timed in the run test below)."""

    def __init__(self, log, name):
        self.log, self.name, self.lengths = log, name, torch.tensor([5])

    def verify(self, tokens, with_taps=True):
        self.log.append((self.name, tokens.shape[1], with_taps))

    def commit(self, keep):
        assert keep.tolist() == [0]  # every timed step rolls back


def test_step_costs_take_turns_and_roll_back():
    log = []
    targets = {p: {S: _Counting(log, (p, S)) for S in (16, 64)} for p in ("exported", "transformers")}
    costs = step_costs(targets, [1, 8], repeats=2)
    assert set(costs) == {"exported", "transformers"} and set(costs["exported"][64]) == {1, 8}
    assert len(log) == 3 * 8  # warm-up + 2 repeats, each (path, S, width) once per pass
    assert log[:8] != log[8:16] and sorted(log[:8]) == sorted(log[8:16])  # the order alternates
    assert all(taps == (w > 1) for _, w, taps in log)  # a target-only step computes no taps


@pytest.mark.onnx
@pytest.mark.slow
def test_context_bench_runs_on_the_tiny_export(qwen3_topk_export, capsys, tmp_path):
    from dspark_trt.cli.main import main

    code = main(["bench", "context", "--export", str(qwen3_topk_export), "--contexts", "16,40", "--repeats", "1",
                 "--max-new-tokens", "6", "--threads", "1", "-o", str(tmp_path), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["contexts"] == [16, 40]
    for path in ("exported", "transformers"):
        steps = report["steps"][path]
        assert set(steps) == {"16", "40"} and all(v > 0 for s in steps.values() for v in s.values())
        assert report["target_cache_bytes"][path]["40"] > 0
        for S in ("16", "40"):
            row = report["e2e"][path][S]
            assert row["same_tokens"] is True and len(row["tokens"]) == 6  # greedy: speculation changed nothing
    assert report["goals"]["greedy_tokens_equal_transformers"] == {"16": True, "40": True}
    assert (tmp_path / "context.json").is_file() and "| context S |" in (tmp_path / "context.md").read_text()
    assert json.loads((tmp_path / "context.json").read_text())["goals"] == report["goals"]
    rounds = report["draft_rounds"]["in place"]  # the drafter's rounds at every S, batch 1 and 4
    assert set(rounds) == {"1", "4"} and all(set(r) == {"16", "40"} and min(r.values()) > 0 for r in rounds.values())
    assert set(report["goals"]["draft_round_long_over_short"]["in place"]) == {"1", "4"}
    assert "Draft round" in (tmp_path / "context.md").read_text()
    with pytest.raises(SystemExit):
        main(["bench", "context"])  # --export is required


def test_tables_and_goals_from_a_saved_report():
    S, w = ["128", "4096"], "8"
    step = lambda one, verify: {"1": one, w: verify}  # noqa: E731
    row = lambda spec, base, tok: {"speculative_decode_tokens_per_second": spec,  # noqa: E731
                                   "target_only_decode_tokens_per_second": base, "decode_speedup": spec / base,
                                   "speculative_tokens_per_second": spec / 2, "target_only_tokens_per_second": base / 2,
                                   "prefill_seconds": 1.0, "mean_acceptance_length": 2.0,
                                   "draft_seconds_per_round": 0.01, "verify_seconds_per_round": 0.1,
                                   "same_tokens": True, "tokens": tok}
    report = {"contexts": [128, 4096], "verify_tokens": 8, "num_draft_tokens": 7, "max_new_tokens": 16, "threads": 2,
              "date": "today", "peak_rss_bytes": 2**31, "drafter_cache_bytes": {s: 2**20 for s in S},
              "target_cache_bytes": {"exported": {s: 2**21 for s in S}, "transformers": {s: 2**21 for s in S}},
              "steps": {"exported": {"128": step(0.04, 0.05), "4096": step(0.09, 0.12)},
                        "transformers": {"128": step(0.08, 0.1), "4096": step(0.1, 0.2)}},
              "e2e": {"exported": {"128": row(30, 20, [1]), "4096": row(15, 12, [2])},
                      "transformers": {"128": row(15, 10, [1]), "4096": row(10, 8, [3])}}}
    g = goals(report)
    assert g["one_token_step_long_over_short"] == pytest.approx(0.09 / 0.04)
    assert g["verify_over_one_token_step_at_long"] == pytest.approx(0.12 / 0.09)
    assert g["exported_over_transformers_one_token_step"] == {128: pytest.approx(0.5), 4096: pytest.approx(0.9)}
    assert g["decode_speedup_long_over_short"] == pytest.approx((15 / 12) / (30 / 20))
    assert g["greedy_tokens_equal_transformers"] == {128: True, 4096: False}
    text = tables({**report, "goals": g})
    assert "| 4096 | 90.0 ms | 2.25× |" in text and "greedy tokens equal transformers' at every S | NO" in text
    report["draft_rounds"] = {"in place": {"1": {"128": 0.02, "4096": 0.03}, "4": {"128": 0.04, "4096": 0.08}},
                              "before": {"1": {"128": 0.02, "4096": 0.05}, "4": {"128": 0.04, "4096": 0.2}}}
    g = goals(report)
    assert g["draft_round_long_over_short"] == {"in place": {"1": pytest.approx(1.5), "4": pytest.approx(2.0)},
                                                "before": {"1": pytest.approx(2.5), "4": pytest.approx(5.0)}}
    text = tables({**report, "goals": g})
    assert "| 4096 | 30.0 ms (1.50×) | 50.0 ms (2.50×) | 80.0 ms (2.00×) | 200.0 ms (5.00×) |" in text
    assert "| draft round at S = 4096 ÷ S = 128 (before) | B = 1: 2.50×, B = 4: 5.00× |" in text


def test_draft_round_costs_take_turns():
    log = []
    runners = {n: (lambda B, S, n=n: (lambda: log.append((n, B, S)))) for n in ("in place", "before")}
    costs = draft_round_costs(runners, [16, 64], [1, 4], repeats=2)
    assert set(costs) == {"in place", "before"} and set(costs["before"][4]) == {16, 64}
    assert len(log) == 3 * 8 and log[:8] != log[8:16] and sorted(log[:8]) == sorted(log[8:16])


@pytest.mark.onnx
def test_draft_before_needs_a_stacked_draft_graph(qwen3_topk_export):
    from dspark_trt.bench.context import draft_runners
    from dspark_trt.runtime.drafters.onnxruntime import OnnxRuntimeDrafterBackend

    backend = OnnxRuntimeDrafterBackend.from_export(qwen3_topk_export)
    with pytest.raises(DSparkTrtError, match="no stacked ctx_k input"):
        draft_runners(backend, topk=16, before_dir=qwen3_topk_export / "onnx")


@pytest.mark.onnx
def test_draft_padded_times_the_torch_round_bound_and_copied(qwen3_topk_export):
    """``--draft-padded``: the export's drafter checkpoint (the manifest's path) through the torch backend's padded
    round, its DrafterState bound and copied, beside the onnxruntime round; a missing checkpoint is one line."""
    from dspark_trt.bench.context import _padded_drafter
    from dspark_trt.runtime.drafters.onnxruntime import OnnxRuntimeDrafterBackend

    with OnnxRuntimeDrafterBackend(qwen3_topk_export / "onnx") as backend:
        runners = draft_runners(backend, topk=16, padded=_padded_drafter(qwen3_topk_export))
        assert set(runners) == {"in place", "padded, bound", "padded, copied"}
        costs = draft_round_costs(runners, [16, 140], [1, 3], repeats=1)
    assert all(t > 0 for by_b in costs.values() for by_s in by_b.values() for t in by_s.values())
    assert set(costs["padded, copied"]) == {1, 3} and set(costs["padded, bound"][3]) == {16, 140}


@pytest.mark.onnx
def test_draft_padded_without_the_checkpoint_is_one_line(qwen3_topk_export, tmp_path):
    from dspark_trt.bench.context import _padded_drafter

    manifest = json.loads((qwen3_topk_export / "manifest.json").read_text())
    manifest["checkpoint"]["path"] = str(tmp_path / "gone")
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DSparkTrtError, match="--draft-padded: the drafter checkpoint .*gone.* is not here") as e:
        _padded_drafter(tmp_path)
    assert "\n" not in str(e.value)


def test_cache_bytes_of_both_targets():
    class WithCache:
        def cache_bytes(self):
            return 123

    class Layer:
        keys = torch.zeros(1, 2, 10, 4)
        values = torch.zeros(1, 2, 10, 4)

    class HFLike:
        cache = type("Cache", (), {"layers": [Layer(), Layer()]})()

    assert cache_bytes(WithCache()) == 123
    assert cache_bytes(HFLike()) == 2 * 2 * 80 * 4


def test_a_windowed_drafters_cache_stays_bounded_and_the_other_grows():
    """``drafter_cache_bytes`` holds a ``DrafterState`` as the runtime does: a drafter of the 8B-class preset's
    shape (5 layers, 8 K/V heads of 128, bf16) grows with the context; the same with a 256-row window holds
    bucket(256 + 128) = 384 rows at any context."""
    import torch

    from dspark_trt.bench.context import drafter_cache_bytes
    from dspark_trt.synthetic.presets import get_preset

    full = get_preset("dspark_qwen3_8b_block7").config()
    windowed = full.replace(layer_types=("sliding_attention",) * full.num_hidden_layers, sliding_window=256,
                            sliding_window_non_causal=True)
    assert full.context_window is None and windowed.context_window == 256
    row = 5 * 2 * 8 * 128 * 2  # bytes of K and V per context row
    for S in (1000, 8192):
        assert drafter_cache_bytes(windowed, S, 64, torch.bfloat16) == 384 * row
    assert drafter_cache_bytes(full, 8192, 64, torch.bfloat16) == 10240 * row  # bucket(8192 + 64 + a round)
    assert drafter_cache_bytes(full, 100, 10, torch.bfloat16) == 128 * row


@pytest.mark.onnx
def test_a_windowed_drafter_gets_a_sliding_round_beside_the_in_place_one(tiny_windowed_pair, onnx_export, tmp_path):
    from dspark_trt.bench.context import plot
    from dspark_trt.runtime.drafters.onnxruntime import OnnxRuntimeDrafterBackend

    with OnnxRuntimeDrafterBackend(onnx_export(tiny_windowed_pair, "fp32", 16)) as backend:
        runners = draft_runners(backend, topk=16)
        assert set(runners) == {"in place", "sliding"}
        costs = draft_round_costs(runners, [16, 300], [1, 2], repeats=1)
    assert all(t > 0 for by_b in costs.values() for by_s in by_b.values() for t in by_s.values())
    report = {"contexts": [16, 300], "verify_tokens": 8,
              "draft_rounds": {n: {str(B): {str(S): t for S, t in by_s.items()} for B, by_s in by_b.items()}
                               for n, by_b in costs.items()}}
    assert plot(report, tmp_path).is_file()  # a rounds-only report: one panel
