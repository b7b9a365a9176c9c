"""The drafter's two-part attention equals softmax over the concatenated [context ; block] keys (the former
reference: concatenate, repeat the K/V heads, one softmax), and reads a heads-first context without a copy."""

import pytest
import torch

from dspark_trt.reference.layers import block_attention_mask, two_part_attention


def concat_attention(q, ctx_k, ctx_v, k_blk, v_blk, key_valid, scale):
    """The former reference: [B, T+Q] keys formed by concatenation, heads repeated g times."""
    B, Q, H, D = q.shape
    k = torch.cat((ctx_k.transpose(1, 2), k_blk), dim=1).transpose(1, 2)  # [B, H_kv, T+Q, D]
    v = torch.cat((ctx_v.transpose(1, 2), v_blk), dim=1).transpose(1, 2)
    g = H // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    scores = torch.matmul(q.transpose(1, 2).float(), k.float().transpose(-1, -2)) * scale
    scores = scores.masked_fill(~key_valid[:, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(q.dtype)
    return torch.matmul(probs, v).transpose(1, 2)  # [B, Q, H, D]


@pytest.mark.parametrize("window,causal", [(None, False), (None, True), (5, True), (3, False)])
@pytest.mark.parametrize("B,T,Q,H,Hkv,D", [(3, 13, 7, 6, 2, 8), (1, 1, 4, 3, 3, 16), (2, 37, 5, 4, 1, 6)])
def test_two_part_attention_equals_concatenated_softmax(window, causal, B, T, Q, H, Hkv, D):
    gen = torch.Generator().manual_seed(B * 100 + T)
    q = torch.randn(B, Q, H, D, generator=gen)
    cache_k = torch.randn(B, Hkv, T + 9, D, generator=gen)  # capacity T + 9: slots past ctx_len hold garbage
    cache_v = torch.randn(B, Hkv, T + 9, D, generator=gen)
    k_blk, v_blk = torch.randn(B, Q, Hkv, D, generator=gen), torch.randn(B, Q, Hkv, D, generator=gen)
    ctx_len = torch.randint(0, T + 1, (B,), generator=gen)
    ctx_len[0] = T
    mask = block_attention_mask(ctx_len, T + 9, Q, window, causal)
    got = two_part_attention(q, cache_k, cache_v, k_blk, v_blk, mask, D ** -0.5)
    want = concat_attention(q, cache_k, cache_v, k_blk, v_blk, mask, D ** -0.5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the used prefix alone gives the same rows (the capacity's extra slots are masked out)
    short = two_part_attention(q, cache_k[:, :, :T], cache_v[:, :, :T], k_blk, v_blk,
                               block_attention_mask(ctx_len, T, Q, window, causal), D ** -0.5)
    torch.testing.assert_close(got, short, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_two_part_attention_half_precision_close_to_fp32(dtype):
    gen = torch.Generator().manual_seed(7)
    B, T, Q, H, Hkv, D = 2, 21, 5, 4, 2, 16
    q, k_blk, v_blk = (torch.randn(B, Q, H, D, generator=gen), torch.randn(B, Q, Hkv, D, generator=gen),
                       torch.randn(B, Q, Hkv, D, generator=gen))
    ck, cv = torch.randn(B, Hkv, T, D, generator=gen), torch.randn(B, Hkv, T, D, generator=gen)
    mask = block_attention_mask(torch.tensor([T, 4]), T, Q, None, True)
    want = concat_attention(q, ck, cv, k_blk, v_blk, mask, D ** -0.5)
    got = two_part_attention(*(t.to(dtype) for t in (q, ck, cv, k_blk, v_blk)), mask, D ** -0.5)
    tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)
