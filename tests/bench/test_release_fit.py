"""bench/release_fit.py: the largest target depth whose full-shape row fits a memory budget."""

from __future__ import annotations

import pytest

from dspark_trt.bench.release_fit import ENGINE, PAIR, estimated_peak, fit_target_layers, weight_bytes
from dspark_trt.synthetic.presets import PRESETS, scaled, target_tensor_shapes, parameter_count

DRAFTERS = [n for n, p in PRESETS.items() if p.kind == "drafter"]


def estimate(preset, depth: int) -> float:
    return estimated_peak(scaled(preset, target_layers=depth))


@pytest.mark.parametrize("name", DRAFTERS)
@pytest.mark.parametrize("budget_gb", [9.0, 16.0, 20.0, 33.3])
def test_the_depth_is_the_largest_within_the_budget(name, budget_gb):
    preset = PRESETS[name]
    least, most = len(preset.target_layer_ids) + 1, preset.target.num_hidden_layers
    depth, why = fit_target_layers(preset, int(budget_gb * 1e9))
    assert least <= depth <= most and f"target depth {depth} of {most}" in why
    if estimate(preset, least) > budget_gb * 1e9:
        assert depth == least and "does not fit" in why
    else:
        assert estimate(preset, depth) <= budget_gb * 1e9
        assert depth == most or estimate(preset, depth + 1) > budget_gb * 1e9


def test_more_memory_never_gives_a_shallower_target_and_enough_gives_the_whole_one():
    preset = PRESETS["dspark_qwen3_8b_block7"]
    depths = [fit_target_layers(preset, int(gb * 1e9))[0] for gb in (8, 12, 16, 20, 24, 40, 80)]
    assert depths == sorted(depths) and depths[-1] == preset.target.num_hidden_layers > depths[0]


def test_the_target_bytes_are_its_tensors_in_bf16():
    preset = scaled(PRESETS["dspark_qwen3_4b_block7"], target_layers=9)
    assert weight_bytes(preset)[1] == 2 * parameter_count(target_tensor_shapes(preset.target))
    # a drafter that ships no lm_head reads the target's: its graphs hold V·d more than its checkpoint
    from dspark_trt.synthetic.presets import drafter_tensor_shapes

    no_head = PRESETS["dspark_qwen3_8_27b_no_lm_head"]
    own = 2 * parameter_count(drafter_tensor_shapes(no_head, "deepseek"))
    assert weight_bytes(no_head)[0] - own == 2 * no_head.target.vocab_size * no_head.target.hidden_size

def test_fit_is_refused_below_the_full_size(capsys):
    from dspark_trt.cli.main import main

    assert main(["bench", "releases", "--preset", "dspark_qwen3_4b_block7", "--target-layers", "fit"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--size full" in err[0]


def test_a_gemma4_pair_is_estimated_by_its_own_lines_which_exceed_the_qwen3_ones():
    """The Gemma-4 pair's greedy and export steps measured above the Qwen3 lines: its estimate is larger at every
    depth, and at 20 GB even its least depth (6 layers) does not fit by it."""
    gemma = PRESETS["dspark_gemma4_12b_block7"]
    for depth in (6, 11, 20):
        at = scaled(gemma, target_layers=depth)
        drafter, target = weight_bytes(at)
        assert estimated_peak(at) > max(ENGINE[0] + ENGINE[1] * target, PAIR[0] + PAIR[1] * (drafter + target))
    depth, why = fit_target_layers(gemma, int(20e9))
    assert depth == 6 and "does not fit" in why
