"""The fused union walk kernel (``DSparkTopKMarkovUnion``) against the oracle (``contract.reference_union_op``).

Without CUDA the kernel runs in Triton's CPU interpreter (tests/conftest.py sets TRITON_INTERPRET=1 before
triton is imported); on a GPU machine the same tests run the compiled kernel on CUDA tensors.
"""

from __future__ import annotations

import pytest
import torch

from dspark_trt.errors import DSparkTrtError
from dspark_trt.plugins.contract import reference_op, reference_union_op
from dspark_trt.reference.markov import markov_union_table, markov_walk
from dspark_trt.plugins.walk_compare import (WalkCase, WalkMismatch, compare_union_walks, make_union_inputs,
                                     make_walk_inputs)

pytestmark = pytest.mark.triton

FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16
TOL = dict(atol=2e-5, rtol=1e-5)  # both sides upcast the same inputs exactly: summation order only

# (V, V_d, r, k, M, N, B): odd vocabularies, r ∈ {8, 192}, k ∈ {1, 16, 512}, M ∈ {1, 5, 32}
SHAPES = [
    pytest.param(257, None, 8, 1, 1, 7, 5, id="V257-r8-k1-M1-N7-B5"),
    pytest.param(257, 101, 192, 16, 5, 7, 5, id="V257-Vd101-r192-k16-M5-N7-B5"),  # d2t in the chain
    pytest.param(257, None, 8, 16, 32, 3, 2, id="V257-r8-k16-M32-N3-B2"),  # 2 dup tiles
    pytest.param(1031, 769, 192, 512, 32, 3, 1, id="V1031-Vd769-r192-k512-M32-N3-B1"),
    pytest.param(1031, None, 300, 100, 5, 7, 2, id="V1031-r300-k100-M5-N7-B2"),  # 2 rank chunks, partial tiles
]


@pytest.fixture(scope="module")
def device():
    from dspark_trt.plugins.kernel import interpreting

    if interpreting():
        return torch.device("cpu")
    if not torch.cuda.is_available():
        pytest.fail("no CUDA device and Triton's interpreter is off: set TRITON_INTERPRET=1 before importing triton")
    return torch.device("cuda")


def run_union(inputs, logit_scale, poison=True):
    """The kernel with its outputs pre-filled with garbage, so unwritten elements show."""
    from dspark_trt.plugins.union_kernel import union_markov_walk

    B, N, k = inputs[0].shape
    M = inputs[11].shape[1]
    dev = inputs[0].device
    out = None
    if poison:
        out = (torch.full((B, N), -1, dtype=torch.int32, device=dev),
               torch.full((B, N, k + M), float("nan"), device=dev),
               torch.full((B, N), float("nan"), device=dev),
               torch.full((B, N, M), -7, dtype=torch.int32, device=dev))
    result = union_markov_walk(*inputs, logit_scale=logit_scale, out=out)
    if poison:
        assert all(r is o for r, o in zip(result, out)), "the launcher must write into the given buffers"
    return result


def reference(inputs, logit_scale):
    return reference_union_op(*(t.cpu() for t in inputs), logit_scale=logit_scale)


def _case(V, Vd, r, k, N, B, dtype=FP32, mode="greedy", scale=1.0, seed=0):
    return WalkCase(batch=B, steps=N, vocab=V, draft_vocab=Vd, rank=r, topk=k, logits_dtype=dtype, weights_dtype=dtype,
                    logit_scale=scale, mode=mode, seed=seed)


@pytest.mark.parametrize("V, Vd, r, k, M, N, B", SHAPES)
@pytest.mark.parametrize("dtype", [FP32, FP16, BF16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("mode, scale", [("greedy", 1.0), ("mixed", 0.5)])
def test_union_walk_matches_reference(device, V, Vd, r, k, M, N, B, dtype, mode, scale):
    case = _case(V, Vd, r, k, N, B, dtype, mode, scale, seed=V + r + k + M + N + B)
    inputs = make_union_inputs(case, M, device)
    got = run_union(inputs, scale)
    assert not torch.isnan(got[1]).any() and not torch.isnan(got[2]).any() and (got[0] >= 0).all()
    assert (got[3] >= 0).all()
    report = compare_union_walks(got, reference(inputs, scale), inputs, **TOL)
    assert report["near_ties"] <= 1, report
    assert report["duplicates"] > 0, "the planted duplicates must reach the comparison"


def test_sampled_draws_match_the_reference_exactly(device):
    """T = 1 with fixed seeds: the same Gumbel noise (seed, position + j, draft id) → the same tokens, and the
    draws land on union candidates too (the test would miss a wrong noise key there otherwise)."""
    case = WalkCase(batch=5, steps=7, vocab=257, rank=8, topk=16, mode="greedy", logit_scale=1.0, seed=21)
    inputs = list(make_union_inputs(case, 32, device))
    inputs[6] = torch.ones(5, device=device)  # T = 1 for every request
    got = run_union(tuple(inputs), 1.0)
    want = reference(inputs, 1.0)
    compare_union_walks(got, want, inputs, **TOL)
    assert torch.equal(got[0].cpu(), want[0]), "T = 1 draws must be the reference's exactly"
    ids = torch.cat((inputs[1].cpu(), want[3]), dim=-1).long()  # [B, N, k + M]
    picked_union = (ids[..., 16:] == want[0][..., None].long()).any(-1) & ~(ids[..., :16] == want[0][..., None].long()).any(-1)
    assert picked_union.any(), "some draws should come from the union candidates"


def test_mixed_logits_and_weights_dtypes(device):
    case = WalkCase(batch=5, steps=7, vocab=257, rank=192, topk=16, logits_dtype=FP32, weights_dtype=BF16,
                    mode="sampled", seed=3)
    inputs = make_union_inputs(case, 5, device)
    compare_union_walks(run_union(inputs, 1.0), reference(inputs, 1.0), inputs, **TOL)


def test_base_logits_in_another_dtype_than_the_candidate_values(device):
    """bf16 base logits with fp32 candidate values (what the runtime passes: no fp32 copy of [B, N, V_d])."""
    case = WalkCase(batch=5, steps=7, vocab=257, rank=8, topk=16, logits_dtype=BF16, weights_dtype=BF16,
                    mode="mixed", seed=17)
    inputs = list(make_union_inputs(case, 5, device))
    inputs[0] = inputs[0].float()  # [B, N, k] fp32 values, exactly the bf16 base logits at the candidates
    report = compare_union_walks(run_union(tuple(inputs), 1.0), reference(inputs, 1.0), inputs, **TOL)
    assert report["duplicates"] > 0


def test_without_duplicates_the_union_extends_the_plain_walk(device):
    """Unplanted random table: the first k logits of step 0 are the plain kernel's bit for bit (same body,
    same sums), and with a table whose ids never win the tokens equal the plain walk's."""
    from dspark_trt.plugins.kernel import topk_markov_walk

    case = WalkCase(batch=3, steps=5, vocab=257, rank=8, topk=16, mode="mixed", seed=8)
    inputs = make_union_inputs(case, 5, device, plant=False)
    plain = topk_markov_walk(*inputs[:11], logit_scale=1.0)
    union = run_union(inputs, 1.0)
    assert torch.equal(union[1][:, 0, :16], plain[1][:, 0])
    assert torch.equal(union[2], plain[2])
    low = list(inputs)
    low[12] = torch.full_like(inputs[12], -1e4)  # union candidates can never win
    union = run_union(tuple(low), 1.0)
    assert torch.equal(union[0], plain[0]) and torch.equal(union[1][..., :16], plain[1])


def test_a_planted_bias_is_drafted_with_the_union(device):
    """A real ``markov_union_table``: a token far outside the base top-k that the Markov head makes the argmax."""
    g = torch.Generator().manual_seed(11)
    V, r, k = 257, 8, 16
    base = 2.0 * torch.randn(1, 3, V, generator=g)
    x = int(base[0, 0].argsort()[50])
    anchor = torch.tensor([5])
    w1, w2 = 0.5 * torch.randn(V, r, generator=g), 0.5 * torch.randn(V, r, generator=g)
    w1[5] = 0.0
    w1[5, 0] = 1.0
    w2[:, 0] = 0.0
    w2[x, 0] = 100.0
    table = markov_union_table(w1, w2, 4)
    vals, ids = torch.topk(base, k, dim=-1)
    zeros = torch.zeros
    inputs = (vals, ids.int(), anchor.int(), w1, w2, zeros(V, dtype=torch.int32), zeros(1), zeros(1, dtype=torch.int32),
              zeros(1, dtype=torch.int32), zeros(1, 3), zeros(r), table, base)
    got = run_union(tuple(t.to(device) for t in inputs), 1.0)
    assert int(got[0][0, 0]) == x
    plain = markov_walk(base, anchor, w1, w2, topk=k)
    assert int(plain.tokens[0, 0]) != x


def test_compare_union_walks_catches_wrong_union_ids_and_masks(device):
    case = WalkCase(batch=2, steps=3, vocab=257, rank=8, topk=16, seed=2)
    inputs = make_union_inputs(case, 5, device)
    want = reference(inputs, 1.0)
    bad_ids = want[3].clone()
    bad_ids[0, 0, 0] += 1
    with pytest.raises(WalkMismatch, match=r"union_ids\[0, 0\]"):
        compare_union_walks((*want[:3], bad_ids), want, inputs, **TOL)
    dup = (want[1][..., 16:] == float("-inf")).nonzero()[0].tolist()  # one masked duplicate
    unmasked = want[1].clone()
    unmasked[dup[0], dup[1], 16 + dup[2]] = 0.0
    with pytest.raises(WalkMismatch, match="cand_logits"):
        compare_union_walks((want[0], unmasked, *want[2:]), want, inputs, **TOL)


def test_rejects_inputs_outside_the_contract(device):
    from dspark_trt.plugins.union_kernel import union_markov_walk

    inputs = make_union_inputs(WalkCase(batch=2, steps=3, vocab=257, rank=8, topk=16), 5, device)
    bad_table = (*inputs[:11], inputs[11][:-1], inputs[12])
    with pytest.raises(DSparkTrtError, match=r"DSparkTopKMarkovUnion tensor union_table has shape \(256, 5\)"):
        union_markov_walk(*bad_table, logit_scale=1.0)
    bad_base = (*inputs[:12], inputs[12].to(torch.float64))
    with pytest.raises(DSparkTrtError, match="base_logits has dtype torch.float64"):
        union_markov_walk(*bad_base, logit_scale=1.0)
    wide = (*inputs[:11], torch.zeros(257, 4000, dtype=torch.int32, device=device), inputs[12])
    with pytest.raises(DSparkTrtError, match="markov_topm 4000 is outside"):
        union_markov_walk(*wide, logit_scale=1.0)
    with pytest.raises(DSparkTrtError, match="union_ids"):
        union_markov_walk(*inputs, logit_scale=1.0, out=run_union(inputs, 1.0)[:3] + (
            torch.empty(2, 3, 4, dtype=torch.int32, device=device),))


def test_plain_inputs_still_match_the_plain_reference(device):
    """The shared body with M = 0 (the plain kernel) is still the plain op."""
    from dspark_trt.plugins.kernel import topk_markov_walk
    from dspark_trt.plugins.walk_compare import compare_walks

    case = WalkCase(batch=3, steps=7, vocab=257, rank=192, topk=16, mode="mixed", seed=4)
    inputs = make_walk_inputs(case, device)
    compare_walks(topk_markov_walk(*inputs, logit_scale=1.0), reference_op(*(t.cpu() for t in inputs), logit_scale=1.0),
                  inputs, **TOL)


def test_union_tiles():
    from dspark_trt.plugins.kernel import TILE_ELEMENTS
    from dspark_trt.plugins.union_kernel import DUP_TILE_ELEMENTS, union_tile_config, union_unsupported_reason

    for k in (1, 16, 512, 3840):
        for r in (8, 192, 256, 1024):
            for m in (1, 5, 32, 300):
                t = union_tile_config(k, r, m)
                assert t.block_m * t.block_r <= max(TILE_ELEMENTS, 16 * t.block_r)
                assert t.block_m * t.block_d <= DUP_TILE_ELEMENTS and t.block_m >= min(m, 16)
                assert all(x & (x - 1) == 0 for x in (t.block_m, t.block_d, t.block_k, t.block_r))
    ok = dict(k=512, r=256, n=7, m=32, logits_dtype=BF16, weights_dtype=BF16, device="cuda")
    assert union_unsupported_reason(**ok) is None
    assert "markov_topm 0" in union_unsupported_reason(**{**ok, "m": 0})
    assert "3840" in union_unsupported_reason(**{**ok, "k": 3841})


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_a_union_wider_than_one_tile(device, mode):
    """M = 70 > MAX_BLOCK_M: two union tiles, the second partial; best positions across tiles."""
    case = WalkCase(batch=2, steps=3, vocab=257, rank=8, topk=16, mode=mode, seed=13)
    inputs = make_union_inputs(case, 70, device)
    report = compare_union_walks(run_union(inputs, 1.0), reference(inputs, 1.0), inputs, **TOL)
    assert report["duplicates"] > 0
