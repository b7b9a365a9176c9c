"""``dspark bench releases``' sizes and its per-step processes (the end-to-end rows at tiny width:
tests/export/test_release_exports.py)."""

from __future__ import annotations

import argparse

import pytest

from dspark_trt.bench import releases
from dspark_trt.synthetic.presets import get_preset


def test_full_keeps_the_drafter_whole_and_cuts_only_the_target():
    preset = get_preset("dspark_qwen3_14b_block7")
    assert releases.release_depth(preset, "full") == {"target_layers": len(preset.target_layer_ids) + 1}
    assert releases.release_depth(preset, "full", target_layers=12) == {"target_layers": 12}
    reduced = releases.release_depth(preset, "reduced", target_layers=12)
    assert reduced == {"target_layers": 12, "layers": 1}
    assert releases.release_depth(preset, "tiny")["vocab"] == 600


def _args(**kw) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    releases.add_arguments(p)
    return p.parse_args([f"--{k.replace('_', '-')}={v}" for k, v in kw.items()])


@pytest.mark.parametrize("target_layers", [2])
def test_a_step_that_fails_in_its_own_process_ends_the_row_there(target_layers):
    """Three taps cannot be spread over a 2-layer target: the write step's process refuses in one line, and the
    row stops there with that step's own peak."""
    row = releases._stepwise_row("dspark_block5_taps40_42", _args(engine="none"), target_layers)
    assert (row["status"], row["step"]) == ("refused", "write"), row
    assert list(row["step_peak_rss_mb"]) == ["write"] and row["step_peak_rss_mb"]["write"] > 0
    assert "tapped layers" in row["detail"] and "\n" not in row["detail"]


def test_a_step_killed_by_a_signal_says_so_in_one_line():
    """A step's process that the out-of-memory killer ends prints no row: the row names the signal and the likely
    cause, not the last warning on stderr; an exit status keeps its stderr line."""
    import signal

    killed = releases.exit_detail(-signal.SIGKILL, "a warning\n[transformers] something deprecated\n")
    assert killed.startswith("killed by SIGKILL") and "out-of-memory" in killed and "deprecated" not in killed
    assert releases.exit_detail(-signal.SIGTERM, "") == "killed by SIGTERM"
    assert releases.exit_detail(3, "Traceback\nValueError: bad\n") == "exit 3: ValueError: bad"
    assert releases.exit_detail(1, "") == "exit 1: no output"


def test_a_step_runs_in_a_memory_cgroup_of_its_limit(tmp_path):
    """A step given a limit runs in a memory cgroup of that size: under a limit smaller than the interpreter with
    torch, the kernel kills it and the row says its limit killed it (one line); under a roomy one it passes and the
    row carries the limit and the cgroup's peak."""
    from dspark_trt.errors import DSparkTrtError
    from dspark_trt.process_memory import MemoryCgroup

    try:
        MemoryCgroup(1 << 30).remove()
    except DSparkTrtError as e:
        pytest.skip(f"no writable memory cgroup here: {e}")
    args = _args(engine="none")
    small = releases._run_child("dspark_qwen3_4b_block7", args, None, "--_step", "write", "--_work",
                                str(tmp_path / "a"), limit_bytes=120 << 20)
    assert (small["status"], small["step"]) == ("fail", "write"), small
    assert small["detail"].startswith("killed by its memory limit of 0.13 GB") and "\n" not in small["detail"]
    assert small["cgroup_oom_kills"] >= 1 and small["memory_limit_mb"] == 120
    roomy = releases._run_child("dspark_qwen3_4b_block7", args, None, "--_step", "write", "--_work",
                                str(tmp_path / "b"), limit_bytes=4 << 30)
    assert roomy["status"] == "pass" and roomy["cgroup_oom_kills"] == 0, roomy
    assert 120 < roomy["cgroup_peak_mb"] <= 4 << 10 and roomy["memory_limit_mb"] == 4 << 10


def test_the_drafter_memory_limit_applies_to_the_drafter_engines_and_needs_an_engine():
    assert releases.step_memory_limits(_args(drafter_memory_limit_gb=16)) == {"drafter engines": 16_000_000_000}
    assert releases.step_memory_limits(_args()) == {}
    both = releases.step_memory_limits(_args(memory_limit_gb=20, drafter_memory_limit_gb=16))
    assert both == {**{step: 20_000_000_000 for step in releases.STEPS}, "drafter engines": 16_000_000_000}
    from dspark_trt.errors import DSparkTrtError

    with pytest.raises(DSparkTrtError, match="--drafter-memory-limit-gb G limits the drafter engines step"):
        releases.run(_args(drafter_memory_limit_gb=16, engine="none", preset="dspark_qwen3_4b_block7"))
    with pytest.raises(DSparkTrtError, match="G > 0"):
        releases.run(_args(drafter_memory_limit_gb=0, preset="dspark_qwen3_4b_block7"))
    with pytest.raises(DSparkTrtError, match="give the limit in GB"):
        releases.run(_args(memory_limit_gb=-1, preset="dspark_qwen3_4b_block7"))


def test_fit_sizes_for_the_memory_limit_unless_a_budget_is_given():
    limited = releases._depth_of("dspark_qwen3_8b_block7", _args(size="full", target_layers="fit", memory_limit_gb=20))
    budget = releases._depth_of("dspark_qwen3_8b_block7", _args(size="full", target_layers="fit", memory_gb=20))
    smaller = releases._depth_of("dspark_qwen3_8b_block7", _args(size="full", target_layers="fit", memory_limit_gb=20,
                                                                 memory_gb=16))
    assert limited == budget and "20.0 GB budget" in limited[1]
    assert smaller[0] < limited[0] and "16.0 GB budget" in smaller[1]
