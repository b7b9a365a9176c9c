"""Release presets at tiny width through ``dspark bench releases``' runner: written, loaded, exported with the target,
validated, and greedy speculative decoding from the export == the target alone. One preset per graph feature the
matrix adds (a tied target, block 5 tapping the last layers, speculators' block 8 with causal windows, no lm_head);
the other Qwen3 presets run the same graphs at other widths (tests/synthetic/test_release_matrix.py checks them)."""

from __future__ import annotations

import pytest

from dspark_trt.bench.releases import run_release

pytestmark = [pytest.mark.onnx, pytest.mark.usefixtures("one_thread")]


@pytest.mark.parametrize("name", ["dspark_qwen3_4b_block7", "dspark_block5_taps40_42", "speculators_glm5_block8",
                                  "dspark_qwen3_8_27b_no_lm_head"])
def test_release_preset_exports_validates_and_decodes_losslessly(tmp_path, name):
    row = run_release(name, tmp_path, "tiny", engine="none")
    assert row["status"] == "pass", row
    assert set(row["steps"]) == {"write", "load", "export+validate", "greedy == target"}


def test_the_gemma4_release_is_a_one_line_refusal_row(tmp_path):
    row = run_release("dspark_gemma4_12b_block7", tmp_path, "tiny", engine="none")
    assert (row["status"], row["step"]) == ("refused", "load")
    assert "Gemma4DSparkModel" in row["detail"] and "\n" not in row["detail"]


def test_a_broken_verifier_makes_the_row_fail(tmp_path, monkeypatch):
    """The greedy step can fail: a decoder whose speculative tokens differ from the target's is a failed row."""
    from dspark_trt.runtime import SpeculativeDecoder

    generate = SpeculativeDecoder.generate

    def shifted(self, prompts, *args, draft=True, **kwargs):
        out = generate(self, prompts, *args, draft=draft, **kwargs)
        if draft:
            out.tokens[0][-1] = (out.tokens[0][-1] + 1) % 600
        return out

    monkeypatch.setattr(SpeculativeDecoder, "generate", shifted)
    row = run_release("dspark_qwen3_4b_block7", tmp_path, "tiny", engine="none")
    assert (row["status"], row["step"]) == ("fail", "greedy == target")
