"""The prompt bank: deterministic, varied, and never a held-out prompt or subject."""

from __future__ import annotations

import pytest

from dspark_trt.training.distill import DistillSettings, training_prompts
from dspark_trt.training.prompt_bank import HELD_OUT_SUBJECTS, prompt_bank
from dspark_trt.training.prompts import HELDOUT_PROMPTS, TRAIN_PROMPTS


def test_bank_is_deterministic_and_seeded():
    assert prompt_bank(50, seed=3) == prompt_bank(50, seed=3)
    assert prompt_bank(50, seed=3) != prompt_bank(50, seed=4)
    assert prompt_bank(0) == ()


def test_bank_prompts_are_unique_and_mixed():
    bank = prompt_bank(10**6)
    assert len(bank) > 1000
    assert len(set(bank)) == len(bank)
    head = prompt_bank(200)
    kinds = {kind for kind, _ in head}
    assert kinds == {"chat", "text"}  # the first prompts already mix chat turns and plain text
    assert any("def " in text or "function" in text for _, text in head)  # and code


def test_bank_never_holds_a_heldout_or_base_prompt_or_subject():
    held = {text for _, text in HELDOUT_PROMPTS}
    base = {text for _, text in TRAIN_PROMPTS}
    for _, text in prompt_bank(10**6):
        assert text not in held and text not in base
        assert not any(word in text.lower() for word in HELD_OUT_SUBJECTS), text
    # the filter is not vacuous: every held-out prompt mentions one of the excluded subjects
    for _, text in HELDOUT_PROMPTS:
        assert any(word in text.lower() for word in HELD_OUT_SUBJECTS), text


class _Tok:
    chat_template = None

    def encode(self, text, add_special_tokens=False):
        return [len(w) for w in text.split()] or [0]


@pytest.mark.parametrize("bank", [0, 7])
def test_training_prompts_add_the_bank(bank):
    ids = training_prompts(_Tok(), DistillSettings(bank_prompts=bank), 100, 99)
    assert len(ids) == len(TRAIN_PROMPTS) + bank
