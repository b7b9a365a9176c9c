"""The fused gated / RNN Markov walk kernels (``plugins/head_kernels.py``) against the oracles
(``contract.REFERENCE_OPS``).

Without CUDA the kernels run in Triton's CPU interpreter (tests/conftest.py sets TRITON_INTERPRET=1 before triton
is imported); on a GPU machine the same tests run the compiled kernels on CUDA tensors. Shapes are small: the
interpreter runs the RNN's mat-vec chunk by chunk.
"""

from __future__ import annotations

import pytest
import torch

from dspark_trt.errors import DSparkTrtError
from dspark_trt.plugins.contract import GATED_INPUTS, REFERENCE_OPS, RNN_INPUTS, reference_op
from dspark_trt.plugins.walk_compare import WalkCase, WalkMismatch, compare_walks, make_head_inputs
from dspark_trt.reference.markov import markov_walk
from dspark_trt.reference.markov_heads import HeadFeatures

pytestmark = pytest.mark.triton

FP32, BF16, FP16 = torch.float32, torch.bfloat16, torch.float16
TOL = dict(atol=2e-5, rtol=1e-5)  # both sides upcast the same weights and accumulate in fp32: summation order only


@pytest.fixture(scope="module")
def device():
    from dspark_trt.plugins.kernel import interpreting

    if interpreting():
        return torch.device("cpu")
    if not torch.cuda.is_available():
        pytest.fail("no CUDA device and Triton's interpreter is off: set TRITON_INTERPRET=1 before importing triton")
    return torch.device("cuda")


def run_kernel(head, inputs, logit_scale):
    """The kernel with its outputs pre-filled with garbage, so an unwritten element shows."""
    from dspark_trt.plugins.head_kernels import head_markov_walk

    B, N, k = inputs[0].shape
    dev = inputs[0].device
    out = (torch.full((B, N), -1, dtype=torch.int32, device=dev), torch.full((B, N, k), float("nan"), device=dev),
           torch.full((B, N), float("nan"), device=dev))
    got = head_markov_walk(head, *inputs, logit_scale=logit_scale, out=out)
    assert all(g is o for g, o in zip(got, out)), "the launcher must write into the given buffers"
    assert not torch.isnan(out[1]).any() and not torch.isnan(out[2]).any() and (out[0] >= 0).all()
    return got


def reference(head, inputs, logit_scale):
    return REFERENCE_OPS[head](*(t.cpu() for t in inputs), logit_scale=logit_scale)


# (V, V_d, r, k, N, B, mode, weights dtype): rank 8 and 64 (one mat-vec chunk), 192 (several chunks, padded rank
# 256), k 1 and 16 (one partial tile) and 100 (several tiles at r = 192), a reduced vocabulary (d2t in the chain)
CASES = [
    pytest.param(257, None, 8, 1, 7, 5, "sampled", FP32, id="r8-k1-sampled-fp32"),
    pytest.param(257, None, 8, 16, 7, 5, "greedy", BF16, id="r8-k16-greedy-bf16"),
    pytest.param(257, 101, 64, 16, 7, 3, "mixed", FP32, id="Vd101-r64-k16-mixed-fp32"),
    pytest.param(257, None, 64, 16, 5, 2, "sampled", BF16, id="r64-k16-sampled-bf16"),
    pytest.param(257, 101, 192, 100, 3, 2, "mixed", BF16, id="Vd101-r192-k100-mixed-bf16"),
]


@pytest.mark.parametrize("head", ["gated", "rnn"])
@pytest.mark.parametrize("V, Vd, r, k, N, B, mode, dtype", CASES)
def test_head_walk_matches_reference(device, head, V, Vd, r, k, N, B, mode, dtype):
    case = WalkCase(batch=B, steps=N, vocab=V, draft_vocab=Vd, rank=r, topk=k, mode=mode, logits_dtype=dtype,
                    weights_dtype=dtype, logit_scale=0.5, seed=V + r + k + N + B)
    inputs = make_head_inputs(case, head, device)
    assert len(inputs) == len(GATED_INPUTS if head == "gated" else RNN_INPUTS)
    report = compare_walks(run_kernel(head, inputs, 0.5), reference(head, inputs, 0.5), inputs, **TOL)
    assert report["near_ties"] <= 1, report


@pytest.mark.parametrize("head", ["gated", "rnn"])
@pytest.mark.parametrize("logits_dtype, weights_dtype", [(FP32, BF16), (FP16, FP32)], ids=["fp32-bf16", "fp16-fp32"])
def test_mixed_logits_and_weights_dtypes(device, head, logits_dtype, weights_dtype):
    case = WalkCase(batch=3, steps=5, vocab=257, rank=8, topk=16, logits_dtype=logits_dtype,
                    weights_dtype=weights_dtype, mode="sampled", seed=3)
    inputs = make_head_inputs(case, head, device)
    compare_walks(run_kernel(head, inputs, 1.0), reference(head, inputs, 1.0), inputs, **TOL)


@pytest.mark.parametrize("head", ["gated", "rnn"])
@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_full_vocabulary_equals_the_dense_head_walk(device, head, mode):
    """k = V_d: the top-k walk is the dense walk of the head (every corrected logit, the tokens), s = 0.5."""
    case = WalkCase(batch=3, steps=7, vocab=257, rank=8, topk=257, mode=mode, logit_scale=0.5, seed=11)
    inputs = make_head_inputs(case, head, device)
    vals, ids, anchor, w1, w2, d2t, temp, seed, pos, conf_base, conf_w, *extra = (t.cpu() for t in inputs)
    feats = HeadFeatures("gated", *extra) if head == "gated" else HeadFeatures("rnn", *extra)
    base = torch.empty(3, 7, 257).scatter_(-1, ids.long(), vals)  # [B, N, V_d] the base logits back
    dense = markov_walk(base, anchor, w1, w2, topk=None, logit_scale=0.5, temperature=temp, seed=seed.long(),
                        positions=pos.long(), conf_base=conf_base, conf_w_markov=conf_w, head=feats)
    want = (dense.tokens.to(torch.int32), dense.cand_logits.gather(-1, ids.long()), dense.confidence)
    report = compare_walks(run_kernel(head, inputs, 0.5), want, inputs, **TOL)
    assert report["steps"] >= 3


@pytest.mark.parametrize("head", ["gated", "rnn"])
def test_the_head_weight_may_keep_its_own_dtype(device, head):
    """bf16 W1 / W2 with the head's fp32 split weight (what the runtime's ``head_features`` gives): no rounding."""
    case = WalkCase(batch=2, steps=5, vocab=257, rank=8, topk=16, weights_dtype=BF16, mode="mixed", seed=8)
    inputs = list(make_head_inputs(case, head, device))
    inputs[12] = inputs[12].float() + torch.randn(inputs[12].shape, generator=torch.Generator().manual_seed(0)).to(
        device) * 1e-3  # not representable in bf16
    compare_walks(run_kernel(head, inputs, 1.0), reference(head, inputs, 1.0), inputs, **TOL)


@pytest.mark.parametrize("head", ["gated", "rnn"])
def test_the_head_changes_the_walk(device, head):
    """The comparison can fail: the vanilla op on the same 11 inputs (bias from e, not u) is not the head's walk,
    and for the RNN neither is the walk from another start state."""
    case = WalkCase(batch=3, steps=7, vocab=257, rank=8, topk=16, seed=2)
    inputs = make_head_inputs(case, head, device)
    got = run_kernel(head, inputs, 1.0)
    vanilla = reference_op(*(t.cpu() for t in inputs[:11]), logit_scale=1.0)
    with pytest.raises(WalkMismatch, match="cand_logits"):
        compare_walks(got, vanilla, inputs, **TOL)
    if head == "rnn":
        zero_state = (*inputs[:13], torch.zeros_like(inputs[13]))
        with pytest.raises(WalkMismatch, match="cand_logits"):
            compare_walks(got, reference(head, zero_state, 1.0), inputs, **TOL)


@pytest.mark.parametrize("head", ["gated", "rnn"])
def test_candidate_order_is_irrelevant(device, head):
    case = WalkCase(batch=3, steps=5, vocab=257, rank=8, topk=16, mode="sampled", seed=5)
    inputs = make_head_inputs(case, head, device)
    perm = torch.argsort(torch.rand(3, 5, 16, generator=torch.Generator().manual_seed(1)), dim=-1).to(device)
    permuted = (inputs[0].gather(-1, perm), inputs[1].gather(-1, perm), *inputs[2:])
    a, b = run_kernel(head, inputs, 1.0), run_kernel(head, permuted, 1.0)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1].gather(-1, perm), b[1]) and torch.equal(a[2], b[2])


def test_rejects_inputs_outside_the_contract(device):
    from dspark_trt.plugins.head_kernels import head_markov_walk

    case = WalkCase(batch=2, steps=3, vocab=257, rank=8, topk=16)
    gated = make_head_inputs(case, "gated", device)
    rnn = make_head_inputs(case, "rnn", device)
    with pytest.raises(DSparkTrtError, match="DSparkTopKMarkovGated takes 13 inputs"):
        head_markov_walk("gated", *rnn, logit_scale=1.0)
    with pytest.raises(DSparkTrtError, match=r"DSparkTopKMarkovGated tensor gate_w has shape \(8, 9\)"):
        head_markov_walk("gated", *gated[:12], torch.zeros(8, 9, device=device), logit_scale=1.0)
    with pytest.raises(DSparkTrtError, match=r"DSparkTopKMarkovRNN tensor joint_hidden has shape \(2, 3, 8\)"):
        head_markov_walk("rnn", *rnn[:11], rnn[11][..., :8], *rnn[12:], logit_scale=1.0)
    with pytest.raises(DSparkTrtError, match=r"rnn_state0 has dtype torch.bfloat16"):
        head_markov_walk("rnn", *rnn[:13], rnn[13].bfloat16(), logit_scale=1.0)
    with pytest.raises(DSparkTrtError, match=r"joint_w has dtype torch.float64"):
        head_markov_walk("rnn", *rnn[:12], rnn[12].double(), rnn[13], logit_scale=1.0)
    with pytest.raises(DSparkTrtError, match="head 'vanilla' is not one of gated, rnn"):
        head_markov_walk("vanilla", *gated, logit_scale=1.0)


def test_support_predicate_and_tiles():
    from dspark_trt.plugins.head_kernels import (MATVEC_TILE_ELEMENTS, MAX_HEAD_RANK, head_tile_config,
                                                 head_unsupported_reason)
    from dspark_trt.plugins.kernel import TILE_ELEMENTS

    ok = dict(k=512, r=256, n=7, logits_dtype=BF16, weights_dtype=BF16, device="cuda")
    for head in ("gated", "rnn"):
        assert head_unsupported_reason(head, **ok) is None
        assert "3840" in head_unsupported_reason(head, **{**ok, "k": 3841})
        assert f"[1, {MAX_HEAD_RANK}]" in head_unsupported_reason(head, **{**ok, "r": MAX_HEAD_RANK + 1})
        assert "float64" in head_unsupported_reason(head, **{**ok, "weights_dtype": torch.float64})
        assert "not CUDA" in head_unsupported_reason(head, **{**ok, "device": "cpu"})
        assert "vanilla Markov head only" in head_unsupported_reason(head, **ok, markov_topm=32)
    assert "no fused kernel for the 'vanilla'" in head_unsupported_reason("vanilla", **ok)
    for k in (1, 16, 257, 512, 3840):
        for r in (1, 8, 192, 256, 1000, 1024):
            t = head_tile_config(k, r)
            assert t.block_r >= r and t.block_r & (t.block_r - 1) == 0  # the whole rank, a power of two
            assert t.block_k * t.block_r <= TILE_ELEMENTS and t.block_r * t.block_m <= MATVEC_TILE_ELEMENTS
            assert t.block_m <= t.block_r and t.block_m & (t.block_m - 1) == 0 and t.num_warps in (4, 8)


def test_gpu_check_rows_compare_with_the_oracle(device):
    """The gpu-check's head rows (``walk_compare.head_kernel_checks``) name every case, and one row's check run here
    (small shapes; Triton's interpreter without CUDA) passes against the oracle."""
    from dspark_trt.plugins.walk_compare import HEAD_KERNEL_CASES, head_kernel_check, head_kernel_checks

    rows = head_kernel_checks(quick=False, arch=90)
    assert len(rows) == len(HEAD_KERNEL_CASES) + 2 and len({name for name, _ in rows}) == len(rows)
    assert {name.split()[1] for name, _ in rows} == {"gated", "rnn"} and sum(n.startswith("aot") for n, _ in rows) == 2
    assert len(head_kernel_checks(quick=True)) == 2  # no AOT rows without an arch
    for head in ("gated", "rnn"):
        case = WalkCase(batch=2, steps=3, vocab=257, rank=8, topk=16, mode="mixed", seed=4)
        assert head_kernel_check(head, case, device).startswith("jit: 6 steps")
