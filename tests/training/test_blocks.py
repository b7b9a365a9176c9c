"""``blocks.block_logits``, the teacher-forced training block, for every Markov head: its logits are the reference
walk's when the text is the walk's own drafts (the walk feeds each slot its previous draft, teacher forcing the
true token; so the two agree exactly on such text), in both block layouts."""

from __future__ import annotations

import pytest
import torch

from dspark_trt import load_drafter
from dspark_trt.synthetic import write_tiny_checkpoint
from dspark_trt.training.blocks import block_logits

V = 97


@pytest.fixture(scope="module", params=[(h, a) for h in ("vanilla", "gated", "rnn") for a in (True, False)],
                ids=lambda p: f"{p[0]}-{'anchor-first' if p[1] else 'bonus-anchor'}")
def drafter(request, tmp_path_factory):
    head, anchor_first = request.param
    ck = write_tiny_checkpoint(tmp_path_factory.mktemp(head) / "pair", seed=6, markov_head_type=head, vocab_size=V,
                               markov_rank=8, block_size=5, sample_from_anchor=anchor_first)
    return load_drafter(ck.drafter)


def test_block_logits_are_the_walks_on_its_own_drafts(drafter):
    c = drafter.config
    N, S, L = c.num_draft_tokens, 3, 16
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V - 1, (S, L), generator=g)
    taps = torch.randn(S, L, c.num_taps * c.hidden_size, generator=g)
    p = torch.tensor([3, 9, L - N])  # [S] one anchor per sequence
    with torch.no_grad():
        k, v = drafter.context_kv(taps, torch.arange(L).expand(S, L))
        walk = drafter.draft(ids[torch.arange(S), p], k, v, p, topk=None)  # dense, greedy
        for s in range(S):  # the text after each anchor: the walk's own drafts
            ids[s, p[s] + 1: p[s] + N] = walk.tokens[s, : N - 1]
        blk = block_logits(drafter, {"ids": ids, "taps": taps}, torch.arange(S), p.view(S, 1))
    torch.testing.assert_close(blk.z, walk.cand_logits, atol=2e-5, rtol=2e-5)
    assert torch.equal(blk.z.argmax(-1), walk.tokens)
    # and the predecessors matter: other text after the anchor gives other logits from slot 1 on
    ids[:, :] = (ids + 1) % (V - 1)
    with torch.no_grad():
        other = block_logits(drafter, {"ids": ids, "taps": taps}, torch.arange(S), p.view(S, 1))
    assert (other.z[:, 1:] - blk.z[:, 1:]).abs().max() > 1e-3
