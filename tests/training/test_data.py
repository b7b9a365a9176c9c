"""The distillation data: features kept while decoding equal a full forward pass over the written text."""

from __future__ import annotations

import pytest
import torch

from dspark_trt.training.data import stack_rows, target_sequences

pytestmark = pytest.mark.usefixtures("one_thread")


def test_features_from_decoding_match_one_full_pass(tiny_pair):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_pair.target, dtype=torch.float32).eval()
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12], [40]]
    rows = target_sequences(model, prompts, new_tokens=5, seed=0, hf_indices=[2, 4, 5], top=8, eos=(999999,))
    assert len(rows) == 6  # greedy and T = 1 for each prompt
    greedy = rows[:3]
    for p, r in zip(prompts, greedy):
        assert r["ids"][: len(p)] == p and len(r["ids"]) == len(p) + 4  # the last written token has no features
    d = stack_rows(rows)
    with torch.no_grad():
        out = model(input_ids=d["ids"], output_hidden_states=True)
    taps = torch.cat([out.hidden_states[i] for i in (2, 4, 5)], dim=-1)
    logp, ids = torch.log_softmax(out.logits, dim=-1).topk(8, dim=-1)
    for i, n in enumerate(d["lengths"].tolist()):
        torch.testing.assert_close(d["taps"][i, :n].float(), taps[i, :n], atol=0.05, rtol=0.02)  # bf16 storage
        torch.testing.assert_close(d["top_logp"][i, :n], logp[i, :n], atol=1e-4, rtol=1e-4)
        assert torch.equal(d["top_ids"][i, :n, 0], ids[i, :n, 0])
        if i < 3:  # greedy rows: every written token is the target's argmax at the position before
            assert torch.equal(d["ids"][i, len(prompts[i]): n], ids[i, len(prompts[i]) - 1: n - 1, 0])
