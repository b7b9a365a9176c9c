"""The CPU fast path of candidate selection returns exactly what torch.topk returns (values and ids, bit for
bit), and the top-k walk's gathered-row conversion leaves every result unchanged."""

from __future__ import annotations

import pytest
import torch

from dspark_trt.reference.markov import _topk_by_chunk_maxima, markov_walk, select_candidates, walk_candidates

V = 16 * 16 * 256 + 16 * 7  # 65648: divisible by 16, long enough for k <= 256 to take the fast path


def _logits(shape, seed, kind):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * 3
    if kind == "bf16":  # real bf16 logits: many exact ties inside the top-k → those rows use torch.topk
        x = x.to(torch.bfloat16).float()
    elif kind == "ties":  # a tie inside the top-k of some rows, at the boundary of others
        flat = x.view(-1, shape[-1])
        order = flat.argsort(dim=-1, descending=True)
        flat[0, order[0, 3]] = flat[0, order[0, 2]]
        flat[1, order[1, 16]] = flat[1, order[1, 15]]
    elif kind == "nan":
        x.view(-1, shape[-1])[0, 123] = float("nan")
    elif kind == "inf":
        x.view(-1, shape[-1])[:, ::2] = float("-inf")
    return x


@pytest.mark.parametrize("k", [1, 16, 64, 256])
@pytest.mark.parametrize("kind", ["random", "bf16", "ties", "nan", "inf"])
def test_fast_selection_is_torch_topk_bit_for_bit(k, kind):
    x = _logits((3, 7, V), seed=k, kind=kind)
    fast = _topk_by_chunk_maxima(x, k)
    assert fast is not None, "the fast path must apply at these shapes"
    want = torch.topk(x, k, dim=-1)
    assert torch.equal(fast[0], want.values) or (kind == "nan" and torch.equal(fast[0].isnan(), want.values.isnan()))
    assert torch.equal(fast[1], want.indices)
    got = select_candidates(x, k)
    assert torch.equal(got[1], want.indices)


def test_fast_path_declines_where_it_cannot_gain():
    assert _topk_by_chunk_maxima(torch.randn(2, 257), 16) is None  # short rows
    assert _topk_by_chunk_maxima(torch.randn(2, V), 1024) is None  # k too large for this V
    assert _topk_by_chunk_maxima(torch.randn(2, V + 1), 16) is None  # not a multiple of the chunk size


@pytest.mark.parametrize("weights_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sampled", [False, True])
def test_topk_walk_unchanged_bit_for_bit(weights_dtype, sampled):
    """markov_walk(topk=k) = walk_candidates(torch.topk(...)) with W2 converted as a whole, bit for bit."""
    g = torch.Generator().manual_seed(7)
    B, N, r, k = 4, 7, 16, 64
    base = torch.randn(B, N, V, generator=g) * 3
    w1 = (torch.randn(V, r, generator=g) / 4).to(weights_dtype)
    w2 = torch.randn(V, r, generator=g).to(weights_dtype)
    anchor = torch.randint(0, V, (B,), generator=g)
    opts = dict(logit_scale=0.5)
    if sampled:
        opts.update(temperature=torch.tensor([0.0, 0.7, 1.0, 1.5]), seed=torch.arange(4) * 1000 + 1,
                    positions=torch.tensor([5, 9, 100, 7]))
    got = markov_walk(base, anchor, w1, w2, topk=k, **opts)
    vals, ids = torch.topk(base, k, dim=-1)
    # the former formulation: the whole W2 converted to fp32, rows gathered by advanced indexing
    prev, logits = anchor, []
    for j in range(N):
        e = w1[prev].float()
        z = vals[:, j] + 0.5 * torch.bmm(w2.float()[ids[:, j]], e.unsqueeze(-1)).squeeze(-1)
        logits.append(z)
        prev = got.tokens[:, j]
    assert torch.equal(got.cand_ids, ids)
    assert torch.equal(got.cand_logits, torch.stack(logits, dim=1))
    want = walk_candidates(vals, ids, anchor, w1, w2, **opts)
    assert torch.equal(got.tokens, want.tokens)
