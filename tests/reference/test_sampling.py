"""The integer noise hash: exactness (against Python's unbounded ints), uniformity and independence."""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from dspark_trt.reference import sampling
from tests.helpers import truncated_support_ref
from dspark_trt.reference.sampling import (
    ACCEPT_SALT,
    DRAFT_SALT,
    HASH_PRIME,
    HASH_ROUNDS,
    SAMPLE_SALT,
    gumbel_noise,
    noise_hash,
    noise_prefix,
    uniform_noise,
)


def python_hash(seed: int, position: int, token: int, salt: int) -> int:
    """The documented formula with unbounded Python ints: catches any int64 overflow in the tensor version."""

    def mix(x):
        for mult, add in HASH_ROUNDS:
            x = (x * x + add) % HASH_PRIME
            x = (x * mult) % HASH_PRIME
        return x

    h = mix((seed % HASH_PRIME + salt) % HASH_PRIME)
    h = mix((h + position % HASH_PRIME) % HASH_PRIME)
    return mix((h + token % HASH_PRIME) % HASH_PRIME)


@pytest.mark.parametrize("salt", [DRAFT_SALT, ACCEPT_SALT, SAMPLE_SALT])
def test_hash_matches_unbounded_integer_formula_at_the_extremes(salt):
    gen = torch.Generator().manual_seed(1)
    seeds = [0, HASH_PRIME - 1, 2**31 - 1, 2**40 + 17] + torch.randint(0, 2**31, (20,), generator=gen).tolist()
    positions = [0, 1, 131071, 2**31 - 2] + torch.randint(0, 2**20, (20,), generator=gen).tolist()
    tokens = [0, 1, 151935, 2**31 - 2] + torch.randint(0, 151936, (20,), generator=gen).tolist()
    got = noise_hash(torch.tensor(seeds), torch.tensor(positions), torch.tensor(tokens), salt)
    want = [python_hash(s, p, t, salt) for s, p, t in zip(seeds, positions, tokens)]
    assert got.tolist() == want
    assert int(got.min()) >= 0 and int(got.max()) < HASH_PRIME


def test_prefix_then_token_is_the_full_hash():
    seed, pos, tok = torch.tensor([[5], [9]]), torch.tensor([[3], [70000]]), torch.arange(300).view(1, -1)
    prefix = noise_prefix(seed, pos, DRAFT_SALT)  # hoisted per (request, step) by kernels
    assert torch.equal(sampling._mix((prefix + tok) % HASH_PRIME), noise_hash(seed, pos, tok, DRAFT_SALT))


def _grid():
    return torch.arange(500).view(-1, 1, 1), torch.arange(10).view(1, -1, 1), torch.arange(120).view(1, 1, -1)


def test_uniforms_are_open_unit_interval_and_uniform():
    u = uniform_noise(*_grid(), DRAFT_SALT)
    assert u.dtype == torch.float32
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
    counts = torch.histc(u.flatten(), bins=50, min=0, max=1)
    assert stats.chisquare(counts.numpy()).pvalue > 1e-4


@pytest.mark.parametrize("axis", [0, 1, 2], ids=["seed", "position", "token"])
def test_neighbouring_keys_give_independent_uniforms(axis):
    """Joint histogram of (u[key], u[key+1]) over a 10×10 grid must be flat; a linear hash fails this."""
    u = uniform_noise(*_grid(), DRAFT_SALT)
    a, b = u.narrow(axis, 0, u.shape[axis] - 1), u.narrow(axis, 1, u.shape[axis] - 1)
    joint = torch.bincount(((a * 10).long() * 10 + (b * 10).long()).flatten(), minlength=100)
    assert stats.chisquare(joint.float().numpy()).pvalue > 1e-4


def test_salts_give_disjoint_streams():
    """Draft and verifier noise for the same key must be unrelated (docs/dspark.md §8.3.3)."""
    grid = _grid()
    draws = {salt: uniform_noise(*grid, salt).flatten() for salt in (DRAFT_SALT, ACCEPT_SALT, SAMPLE_SALT)}
    for s1 in draws:
        for s2 in draws:
            if s1 < s2:
                assert not torch.equal(draws[s1], draws[s2])
                joint = torch.bincount((draws[s1] * 10).long() * 10 + (draws[s2] * 10).long(), minlength=100)
                assert stats.chisquare(joint.float().numpy()).pvalue > 1e-4


@pytest.mark.parametrize("vary", ["seed", "position"])
def test_gumbel_max_samples_the_softmax(vary):
    gen = torch.Generator().manual_seed(3)
    V, n = 37, 30000
    logits = 1.5 * torch.randn(V, generator=gen)
    keys = torch.arange(n).view(-1, 1)
    seed, pos = (keys, torch.full((n, 1), 11)) if vary == "seed" else (torch.full((n, 1), 4), keys)
    draws = (logits + gumbel_noise(seed, pos, torch.arange(V).view(1, -1), SAMPLE_SALT)).argmax(-1)
    expected = torch.softmax(logits.double(), 0) * n
    observed = torch.bincount(draws, minlength=V).double()
    assert stats.chisquare(observed.numpy(), expected.numpy()).pvalue > 1e-4


@pytest.mark.parametrize("V", [7, 37, 257])
def test_truncation_mask_is_the_documented_support(V):
    gen = torch.Generator().manual_seed(V)
    z = torch.randn(64, V, generator=gen) * 2.0
    z[::5, 1:4] = z[::5, :1]  # ties with the first entry (sometimes at the boundary)
    top_k = torch.randint(0, V + 3, (64,), generator=gen)  # 0 = off, > V = everything
    top_p = torch.rand(64, generator=gen).clamp_min(0.05)
    top_p[::4] = 1.0
    keep = sampling.truncation_mask(z, top_k, top_p)
    for row in range(64):
        expected = truncated_support_ref(z[row].double().tolist(), int(top_k[row]), float(top_p[row]))
        assert set(keep[row].nonzero().view(-1).tolist()) == expected, row
    assert bool(keep.gather(1, z.argmax(1, keepdim=True)).all())  # the argmax is always kept


def test_truncation_edges():
    z = torch.tensor([[3.0, 1.0, 3.0, -2.0, 0.5]])
    one = lambda k, p: sampling.truncation_mask(z, torch.tensor([k]), torch.tensor([p]))[0].tolist()  # noqa: E731
    assert one(0, 1.0) == [True] * 5 and one(5, 1.0) == [True] * 5 and one(9, 1.0) == [True] * 5
    assert one(1, 1.0) == [True, False, True, False, False]  # a tie at the top: both kept
    assert one(0, 1e-6) == [True, False, True, False, False]
    assert one(3, 1.0) == [True, True, True, False, False]
    untouched = sampling.apply_truncation(z, torch.tensor([0]), torch.tensor([1.0]))
    assert untouched is z  # rows that do not truncate are not copied
    cut = sampling.apply_truncation(z, torch.tensor([3]), None)
    assert cut[0, 3] == float("-inf") and torch.equal(cut[0, :3], z[0, :3])
