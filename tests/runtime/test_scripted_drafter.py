"""The scripted drafter backend (a test double for the drafter): planted errors, drift detection."""

from __future__ import annotations

import pytest
import torch

from dspark_trt import load_drafter
from dspark_trt.errors import DSparkTrtInternalError
from tests.runtime.scripted_drafter import ScriptedDrafterBackend
from dspark_trt.synthetic import write_tiny_checkpoint


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("s") / "pair", vocab_size=97, seed=4, block_size=4)


def test_scripted_drafter_detects_a_drifted_anchor(pair):
    drafter = load_drafter(pair.drafter, target_dir=pair.target)
    scripted = ScriptedDrafterBackend(drafter.config, [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]],
                                      wrong=lambda r, pos: pos == 4)
    res = scripted.draft(torch.tensor([3]), None, None, torch.tensor([2]), topk=None, temperature=None, seed=None)
    assert res.tokens.tolist() == [[4, 5 + 1, 6, 7]] and scripted.rounds[-1]["expected_accepted"] == 1
    with pytest.raises(DSparkTrtInternalError, match="drifted"):
        scripted.draft(torch.tensor([9]), None, None, torch.tensor([2]), topk=None, temperature=None, seed=None)
