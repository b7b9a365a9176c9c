"""The mass a top-k head drops, against a direct computation on one block."""

from __future__ import annotations

import pytest
import torch

from dspark_trt.bench.topk_mass import topk_dropped_mass

pytestmark = pytest.mark.usefixtures("one_thread")


def test_dropped_mass_matches_a_direct_computation(distilled_pair):
    from transformers import AutoModelForCausalLM

    from dspark_trt.loader import load_drafter

    drafter = load_drafter(distilled_pair.drafter, target_dir=distilled_pair.target)
    model = AutoModelForCausalLM.from_pretrained(distilled_pair.target, dtype=torch.float32).eval()
    c = drafter.config
    N = c.num_draft_tokens
    seq = torch.randint(0, 256, (20,), generator=torch.Generator().manual_seed(0)).tolist()
    p = 20 - N  # one anchor: the last one that has N true successors... and predecessors for every slot
    got = topk_dropped_mass(drafter, model, [seq], [1, 7, c.draft_vocab_size], starts=[p], anchors_per_sequence=1)
    with torch.no_grad():
        out = model(input_ids=torch.tensor([seq]), output_hidden_states=True)
        taps = torch.cat([out.hidden_states[i] for i in c.hf_hidden_state_indices], dim=-1)
        k, v = drafter.context_kv(taps, torch.arange(20).view(1, 20))
        h = drafter.block_hidden(torch.tensor([seq[p]]), k, v, torch.tensor([p]))  # [1, N, d]
        u = drafter.base_logits(h)[0]  # [N, V_d]
    w1, w2 = drafter.markov_head.markov_w1.weight, drafter.markov_head.markov_w2.weight
    for j in range(N):
        q = torch.softmax(u[j] + c.logit_scale * (w2 @ w1[seq[p + j]]), dim=-1)
        for kk in (1, 7):
            keep = u[j].topk(kk).indices
            assert got[kk]["per_slot"][j] == pytest.approx(float(1 - q[keep].sum()), abs=1e-5)
    assert got[c.draft_vocab_size]["mean"] == pytest.approx(0.0, abs=1e-6)
    assert got[1]["mean"] >= got[7]["mean"] >= 0
