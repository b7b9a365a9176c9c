"""The distillation data: features kept while decoding equal a full forward pass over the written text."""

from __future__ import annotations

import pytest
import torch

from dspark_trt.training.data import Job, stack_rows, write_rows

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model(tiny_pair):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_pair.target, dtype=torch.float32).eval()


def test_features_from_decoding_match_one_full_pass(model):
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12], [40]]
    jobs = [Job(tuple(p), True) for p in prompts] + [Job(tuple(p), False, 11 + i) for i, p in enumerate(prompts)]
    rows = write_rows(model, jobs, new_tokens=5, hf_indices=[2, 4, 5], top=8, eos=(999999,), batch=4)
    assert len(rows) == 6  # one row per job, across two batches of 4 and 2
    for p, r in zip(prompts, rows[:3]):
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


def test_a_row_does_not_depend_on_its_batch(model):
    """Content-addressed text: a sampled row is the same alone or among others (noise keyed by the row)."""
    job = Job((7, 8, 9, 10), False, 1234)
    others = [Job((3, 4), False, 5), Job((100, 101, 102, 103, 104, 105), True)]
    alone = write_rows(model, [job], new_tokens=8, hf_indices=[2], top=4, batch=1)[0]
    mixed = write_rows(model, others[:1] + [job] + others[1:], new_tokens=8, hf_indices=[2], top=4, batch=3)[1]
    assert alone["ids"] == mixed["ids"]
    other_seed = write_rows(model, [job._replace(seed=99)], new_tokens=8, hf_indices=[2], top=4)[0]
    assert other_seed["ids"] != alone["ids"]


@pytest.mark.parametrize("top_k, top_p", [(20, 1.0), (5, 0.8), (0, 0.5)])
def test_sampled_tokens_stay_in_the_reference_truncation(top_k, top_p):
    """Every sampled token lies in the reference sampler's kept set (``truncation_mask`` at T), and the draw is
    the reference Gumbel-max over the full vocabulary."""
    from dspark_trt.reference.sampling import SAMPLE_SALT, gumbel_noise, truncation_mask
    from dspark_trt.training.sampling import WritingSettings, next_tokens

    gen = torch.Generator().manual_seed(3)
    B, V = 64, 300
    logits = 3 * torch.randn(B, V, generator=gen)  # [B, V]
    s = WritingSettings(temperature=0.7, top_p=top_p, top_k=top_k)
    seeds = torch.randint(0, 2**31 - 1, (B,), generator=gen)
    positions = torch.randint(0, 500, (B,), generator=gen)
    greedy = torch.zeros(B, dtype=torch.bool)
    greedy[::7] = True
    got = next_tokens(logits, greedy, seeds, positions, s)  # [B]
    z = logits / s.temperature
    keep = truncation_mask(z, torch.full((B,), top_k), torch.full((B,), top_p))  # [B, V] the reference's kept set
    assert bool(keep[torch.arange(B), got].all())
    g = gumbel_noise(seeds.view(B, 1), positions.view(B, 1), torch.arange(V).view(1, V), SAMPLE_SALT)
    ref = torch.where(keep, z + g, float("-inf")).argmax(-1)
    assert torch.equal(got[~greedy], ref[~greedy])
    assert torch.equal(got[greedy], logits[greedy].argmax(-1))
    if top_k:
        top = logits.topk(top_k, dim=-1).indices
        assert bool((top == got.view(B, 1)).any(-1).all())  # never outside the target's top-k
    assert len(set(got[~greedy].tolist())) > 10  # a draw, not an argmax
