"""Release presets at tiny width through ``dspark bench releases``' runner: written, loaded, exported with the target,
validated, and greedy speculative decoding from the export == the target alone. Three exports, for the graph features
the matrix adds: block 5 tapping the target's last layers, speculators' block 8 with causal sliding windows, and
DeepSpec's Gemma-4 drafter with its Gemma-4 target. The other Qwen3 presets run the same graphs at other widths (their contract and loading: tests/synthetic/
test_release_matrix.py; all of them end to end: ``dspark bench releases``, docs/checkpoints.md)."""

from __future__ import annotations

import pytest

from dspark_trt.bench.releases import greedy_equal, run_release

pytestmark = [pytest.mark.onnx, pytest.mark.usefixtures("one_thread")]

EXPORTED = ["dspark_block5_taps40_42", "speculators_glm5_block8", "dspark_gemma4_12b_block7"]


@pytest.fixture(scope="module")
def works(tmp_path_factory):
    out = {}
    for name in EXPORTED:
        work = tmp_path_factory.mktemp(name)
        out[name] = (run_release(name, work, "tiny", engine="none"), work)
    return out


@pytest.mark.parametrize("name", EXPORTED)
def test_release_preset_exports_validates_and_decodes_losslessly(works, name):
    row, _ = works[name]
    assert row["status"] == "pass", row
    assert set(row["steps"]) == {"write", "load", "export+validate", "greedy == target"}


def test_a_broken_verifier_fails_the_greedy_check(works, monkeypatch):
    """The greedy step can fail: a decoder whose speculative tokens differ from the target's is caught."""
    from dspark_trt.runtime import SpeculativeDecoder

    _, work = works[EXPORTED[0]]
    generate = SpeculativeDecoder.generate

    def shifted(self, prompts, *args, draft=True, **kwargs):
        out = generate(self, prompts, *args, draft=draft, **kwargs)
        if draft:
            out.tokens[0][-1] = (out.tokens[0][-1] + 1) % 600
        return out

    assert greedy_equal(work / "export")[0]
    monkeypatch.setattr(SpeculativeDecoder, "generate", shifted)
    assert not greedy_equal(work / "export")[0]


def test_a_target_preset_is_refused_in_one_line():
    """The Gemma-4 target runs in its drafter's row; naming it alone is a one-line error, before any subprocess."""
    import argparse

    from dspark_trt.bench.releases import add_arguments, run
    from dspark_trt.errors import DSparkTrtError

    p = argparse.ArgumentParser()
    add_arguments(p)
    with pytest.raises(DSparkTrtError) as e:
        run(p.parse_args(["--preset", "gemma4_12b"]))
    assert "target preset" in str(e.value) and "dspark_gemma4_12b_block7" in str(e.value)
