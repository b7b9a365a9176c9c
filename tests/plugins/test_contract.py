"""The op contract's CPU references: one body serves both ops (the union's with M = 0 is the plain op's)."""

from __future__ import annotations

import inspect

import pytest
import torch

from dspark_trt.plugins.contract import INPUTS, OUTPUTS, UNION_INPUTS, UNION_OUTPUTS, reference_op, reference_union_op
from dspark_trt.plugins.walk_compare import WalkCase, make_union_inputs, make_walk_inputs


def test_the_references_take_the_contract_inputs_by_position_or_name():
    for fn, contract in ((reference_op, INPUTS), (reference_union_op, UNION_INPUTS)):
        params = inspect.signature(fn).parameters
        assert list(params) == [c.name for c in contract] + ["logit_scale"]
        assert params["logit_scale"].kind is inspect.Parameter.KEYWORD_ONLY
    case = WalkCase(batch=3, steps=3, vocab=257, rank=8, topk=16, mode="mixed", seed=2)
    inputs = make_walk_inputs(case, "cpu")
    by_position = reference_op(*inputs, logit_scale=0.5)
    by_name = reference_op(**{c.name: t for c, t in zip(INPUTS, inputs)}, logit_scale=0.5)
    assert len(by_position) == len(OUTPUTS) and all(torch.equal(a, b) for a, b in zip(by_position, by_name))
    union = reference_union_op(*make_union_inputs(case, 5, "cpu"), logit_scale=0.5)
    assert [tuple(t.shape) for t in union] == [(3, 3), (3, 3, 21), (3, 3), (3, 3, 5)]
    assert len(union) == len(UNION_OUTPUTS)
    assert union[0].dtype == union[3].dtype == torch.int32
    with pytest.raises(TypeError, match="logit_scale"):
        reference_op(*inputs)
    with pytest.raises(TypeError):
        reference_op(*inputs[:-1], logit_scale=0.5)
    with pytest.raises(TypeError):
        reference_union_op(*inputs, logit_scale=0.5)  # the union needs its table and base logits
