"""The fused top-k Markov walk kernel against the oracle (``contract.reference_op``).

Without CUDA the kernel runs in Triton's CPU interpreter (tests/conftest.py sets TRITON_INTERPRET=1 before
triton is imported); on a GPU machine the same tests run the compiled kernel on CUDA tensors.
"""

from __future__ import annotations

import pytest
import torch

from dspark_trt.errors import DSparkTrtError
from dspark_trt.plugins.contract import reference_op
from dspark_trt.reference.markov import markov_walk
from dspark_trt.plugins.walk_compare import WalkCase, WalkMismatch, compare_walks, make_walk_inputs

pytestmark = pytest.mark.triton

FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16

# Both sides upcast the *same* low-precision inputs exactly and accumulate in fp32, so every dtype gets the
# fp32 tolerance; only the order of the rank-r sums differs.
TOLERANCES = {
    FP32: dict(atol=2e-5, rtol=1e-5),  # fp32 inputs: summation order only
    FP16: dict(atol=2e-5, rtol=1e-5),  # fp16 values are exact in fp32 on both sides: summation order only
    BF16: dict(atol=2e-5, rtol=1e-5),  # bf16 values are exact in fp32 on both sides: summation order only
}

# (V, V_d, r, k, N, B): odd vocabularies, r ∈ {8, 192}, k ∈ {1, 16, 512}, N ∈ {1, 7}, B ∈ {1, 5}
SHAPES = [
    pytest.param(257, None, 8, 1, 7, 5, id="V257-r8-k1-N7-B5"),
    pytest.param(257, 101, 192, 16, 7, 5, id="V257-Vd101-r192-k16-N7-B5"),  # reduced vocab: d2t in the chain
    pytest.param(257, None, 8, 16, 1, 1, id="V257-r8-k16-N1-B1"),
    pytest.param(1031, 769, 192, 512, 7, 1, id="V1031-Vd769-r192-k512-N7-B1"),
    pytest.param(1031, None, 8, 512, 1, 5, id="V1031-r8-k512-N1-B5"),
    pytest.param(1031, None, 300, 100, 7, 2, id="V1031-r300-k100-N7-B2"),  # 2 rank chunks, a partial k tile
]


@pytest.fixture(scope="module")
def device():
    from dspark_trt.plugins.kernel import interpreting

    if interpreting():
        return torch.device("cpu")
    if not torch.cuda.is_available():
        pytest.fail("no CUDA device and Triton's interpreter is off: set TRITON_INTERPRET=1 before importing triton")
    return torch.device("cuda")


def run_kernel(inputs, logit_scale, poison=True):
    """The kernel on ``inputs`` with its outputs pre-filled with garbage, so unwritten elements show."""
    from dspark_trt.plugins.kernel import topk_markov_walk

    B, N, k = inputs[0].shape
    dev = inputs[0].device
    out = None
    if poison:
        out = (torch.full((B, N), -1, dtype=torch.int32, device=dev),
               torch.full((B, N, k), float("nan"), device=dev),
               torch.full((B, N), float("nan"), device=dev))
    result = topk_markov_walk(*inputs, logit_scale=logit_scale, out=out)
    if poison:
        assert all(r is o for r, o in zip(result, out)), "the launcher must write into the given buffers"
    return result


def reference(inputs, logit_scale):
    return reference_op(*(t.cpu() for t in inputs), logit_scale=logit_scale)


@pytest.mark.parametrize("V, Vd, r, k, N, B", SHAPES)
@pytest.mark.parametrize("dtype", [FP32, FP16, BF16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("mode, scale", [("greedy", 1.0), ("mixed", 0.5)])
def test_walk_matches_reference(device, V, Vd, r, k, N, B, dtype, mode, scale):
    case = WalkCase(batch=B, steps=N, vocab=V, draft_vocab=Vd, rank=r, topk=k, logits_dtype=dtype,
                    weights_dtype=dtype, logit_scale=scale, mode=mode, seed=V + r + k + N + B)
    inputs = make_walk_inputs(case, device)
    got = run_kernel(inputs, scale)
    assert not torch.isnan(got[1]).any() and not torch.isnan(got[2]).any() and (got[0] >= 0).all()
    report = compare_walks(got, reference(inputs, scale), inputs, **TOLERANCES[dtype])
    assert report["near_ties"] <= 1, report  # random fp32-scale data: near-ties are rare


@pytest.mark.parametrize("logits_dtype, weights_dtype", [(FP32, BF16), (BF16, FP32), (FP16, BF16)],
                         ids=["fp32-bf16", "bf16-fp32", "fp16-bf16"])
def test_mixed_logits_and_weights_dtypes(device, logits_dtype, weights_dtype):
    case = WalkCase(batch=5, steps=7, vocab=257, rank=192, topk=16, logits_dtype=logits_dtype,
                    weights_dtype=weights_dtype, mode="sampled", seed=3)
    inputs = make_walk_inputs(case, device)
    compare_walks(run_kernel(inputs, 1.0), reference(inputs, 1.0), inputs, **TOLERANCES[BF16])


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_full_vocabulary_equals_dense_walk(device, mode):
    """k = V_d: the top-k walk is the dense walk (tokens and every corrected logit), with s = 0.5."""
    case = WalkCase(batch=5, steps=7, vocab=257, rank=8, topk=257, mode=mode, logit_scale=0.5, seed=11)
    inputs = make_walk_inputs(case, device)  # candidates = a random permutation of the whole vocabulary
    vals, ids, anchor, w1, w2, d2t, temp, seed, pos, conf_base, conf_w = (t.cpu() for t in inputs)
    base = torch.empty(5, 7, 257).scatter_(-1, ids.long(), vals)  # [B, N, V_d] the base logits back
    dense = markov_walk(base, anchor, w1, w2, topk=None, logit_scale=0.5, d2t=None,
                        temperature=temp, seed=seed.long(), positions=pos.long(),
                        conf_base=conf_base, conf_w_markov=conf_w)
    want = (dense.tokens.to(torch.int32), dense.cand_logits.gather(-1, ids.long()), dense.confidence)
    report = compare_walks(run_kernel(inputs, 0.5), want, inputs, **TOLERANCES[FP32])
    assert report["steps"] >= 5  # at least one step per request compared


def test_candidate_order_is_irrelevant(device):
    """Noise is keyed by draft id and each logit depends on its own row only: permuting candidates permutes
    the logits bit for bit and leaves the tokens alone."""
    case = WalkCase(batch=5, steps=7, vocab=257, rank=192, topk=16, mode="sampled", seed=5)
    inputs = make_walk_inputs(case, device)
    perm = torch.argsort(torch.rand(5, 7, 16, generator=torch.Generator().manual_seed(1)), dim=-1).to(device)
    permuted = (inputs[0].gather(-1, perm), inputs[1].gather(-1, perm), *inputs[2:])
    a, b = run_kernel(inputs, 1.0), run_kernel(permuted, 1.0)
    assert torch.equal(a[0], b[0])
    assert torch.equal(a[1].gather(-1, perm), b[1])
    assert torch.equal(a[2], b[2])


def test_compare_walks_catches_a_wrong_token(device):
    """The tie-robust comparison still fails on a real difference (so the tests above can fail)."""
    case = WalkCase(batch=1, steps=7, vocab=257, rank=8, topk=16, seed=2)
    inputs = make_walk_inputs(case, device)
    want = reference(inputs, 1.0)
    ids = inputs[1].cpu()
    worst = ids[0, 0, want[1][0, 0].argmin()]  # the lowest-scoring candidate of step 0 is never a near-tie
    bad = (want[0].clone(), want[1], want[2])
    bad[0][0, 0] = worst
    with pytest.raises(WalkMismatch, match="not a near-tie"):
        compare_walks(bad, want, inputs, atol=1e-5, rtol=1e-5)


def test_default_outputs_are_allocated(device):
    case = WalkCase(batch=2, steps=3, vocab=257, rank=8, topk=16, mode="mixed", seed=9)
    inputs = make_walk_inputs(case, device)
    got = run_kernel(inputs, 1.0, poison=False)
    assert [t.dtype for t in got] == [torch.int32, torch.float32, torch.float32]
    compare_walks(got, reference(inputs, 1.0), inputs, **TOLERANCES[FP32])


def test_rejects_inputs_outside_the_contract(device):
    from dspark_trt.plugins.kernel import topk_markov_walk

    inputs = make_walk_inputs(WalkCase(batch=2, steps=3, vocab=257, rank=8, topk=16), device)
    bad_ids = (inputs[0], inputs[1].long(), *inputs[2:])
    with pytest.raises(DSparkTrtError, match="cand_ids has dtype torch.int64"):
        topk_markov_walk(*bad_ids, logit_scale=1.0)
    bad_w = (*inputs[:4], inputs[4].to(torch.bfloat16), *inputs[5:])
    with pytest.raises(DSparkTrtError, match="must share a dtype"):
        topk_markov_walk(*bad_w, logit_scale=1.0)
    bad_d2t = (*inputs[:5], inputs[5][:-1], *inputs[6:])
    with pytest.raises(DSparkTrtError, match=r"d2t has shape \(256,\)"):
        topk_markov_walk(*bad_d2t, logit_scale=1.0)


def test_support_predicate_and_tiles():
    from dspark_trt.plugins.kernel import TILE_ELEMENTS, kernel_unsupported_reason, tile_config

    ok = dict(k=512, r=256, n=7, logits_dtype=BF16, weights_dtype=BF16, device="cuda")
    assert kernel_unsupported_reason(**ok) is None
    assert "3840" in kernel_unsupported_reason(**{**ok, "k": 3841})
    assert "1024" in kernel_unsupported_reason(**{**ok, "r": 1025})
    assert "float64" in kernel_unsupported_reason(**{**ok, "weights_dtype": torch.float64})
    assert "not CUDA" in kernel_unsupported_reason(**{**ok, "device": "cpu"})
    for k in (1, 16, 257, 512, 3840):
        for r in (8, 192, 256, 1000, 1024):
            t = tile_config(k, r)
            assert t.block_k * t.block_r <= TILE_ELEMENTS
            assert t.block_r & (t.block_r - 1) == 0 and t.block_k & (t.block_k - 1) == 0
            assert t.block_r >= min(r, 256) and t.num_warps in (4, 8)
