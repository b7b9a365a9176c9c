"""The quick distiller (``training.quick``): the demo pair's and the tests' distilled drafters."""

from __future__ import annotations

import pytest
import torch

from dspark_trt import load_drafter
from dspark_trt.synthetic import write_tiny_checkpoint
from dspark_trt.training.quick import distill_drafter, save_drafter_like


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("h") / "pair", vocab_size=97, seed=4, block_size=4)


def test_distillation_lowers_the_loss_and_saves_loadable_weights(pair, tmp_path):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    drafter = load_drafter(pair.drafter, target_dir=pair.target)
    before = drafter.fc.weight.clone()
    target = AutoModelForCausalLM.from_pretrained(pair.target).eval()
    losses = distill_drafter(drafter, target, steps=40, num_sequences=16, length=16, batch=8, anchors=4)
    assert losses["loss_last"] < losses["loss_first"]
    assert not torch.equal(before, drafter.fc.weight)
    out = save_drafter_like(drafter, pair.drafter, tmp_path / "distilled")
    again = load_drafter(out, target_dir=pair.target)
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(tensor, again.state_dict()[name]), name
    assert not drafter.training and not any(p.requires_grad for p in drafter.parameters())
