"""The reference drafter: attention pattern, positions, layouts, parity with transformers' Qwen3 layer."""

from __future__ import annotations

import pytest
import torch

from dspark_trt.config import DSparkConfig
from dspark_trt.reference.drafter import DSparkDrafter
from dspark_trt.synthetic import tiny_config


def random_drafter(seed=0, dtype=torch.float32, **options) -> DSparkDrafter:
    """A drafter with every parameter random (norm weights too), odd sizes by default."""
    defaults = dict(vocab_size=257, hidden_size=48, intermediate_size=80, num_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=12, markov_rank=8, block_size=5)
    config = tiny_config(**{**defaults, **options})
    torch.manual_seed(seed)
    model = DSparkDrafter(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.2 * torch.randn_like(p) if name.endswith("norm.weight") else 0.3 * torch.randn_like(p))
    return model.to(dtype).eval().requires_grad_(False)


def context(model, B=2, T=9, seed=1):
    c = model.config
    gen = torch.Generator().manual_seed(seed)
    taps = torch.randn(B, T, c.num_taps * c.hidden_size, generator=gen)
    positions = torch.arange(T).expand(B, T)
    k, v = model.context_kv(taps, positions)
    return taps, k, v


def test_context_kv_shapes_and_layer_stacking():
    model = random_drafter()
    c = model.config
    _, k, v = context(model, B=3, T=6)
    assert k.shape == v.shape == (c.num_hidden_layers, 3, 6, c.num_key_value_heads, c.head_dim)
    assert not torch.equal(k[0], k[1])  # each layer has its own projection


def test_block_queries_see_every_block_slot_noncausally():
    """Changing the token at the LAST block slot changes slot 0's output (docs/dspark.md §10.11)."""
    model = random_drafter()
    _, k, v = context(model)
    ctx_len = torch.tensor([9, 6])
    ids, pos = model.block_ids(torch.tensor([3, 4]), ctx_len)
    h = model.block_forward(ids, pos, k, v, ctx_len)
    ids2 = ids.clone()
    ids2[:, -1] = 7
    h2 = model.block_forward(ids2, pos, k, v, ctx_len)
    assert (h[:, 0] - h2[:, 0]).abs().max() > 1e-4


def test_context_beyond_ctx_len_is_ignored():
    """Padding at positions >= p changes nothing; a valid context token does."""
    model = random_drafter()
    _, k, v = context(model)
    ctx_len = torch.tensor([5, 9])
    anchor = torch.tensor([3, 4])
    h = model.block_hidden(anchor, k, v, ctx_len)
    k2, v2 = k.clone(), v.clone()
    k2[:, 0, 5:] = 100.0  # request 0: beyond its 5 context tokens
    v2[:, 0, 5:] = -100.0
    torch.testing.assert_close(model.block_hidden(anchor, k2, v2, ctx_len)[0], h[0], rtol=0, atol=0)
    k2[:, 0, 4] = 3.0  # its last valid token
    assert (model.block_hidden(anchor, k2, v2, ctx_len)[0] - h[0]).abs().max() > 1e-4


def test_block_positions_start_at_the_anchor_position():
    model = random_drafter()
    ids, pos = model.block_ids(torch.tensor([3, 4]), torch.tensor([9, 6]))
    assert pos.tolist() == [list(range(9, 14)), list(range(6, 11))]
    assert ids[:, 0].tolist() == [3, 4] and bool((ids[:, 1:] == model.config.mask_token_id).all())


def test_rope_is_relative_shifting_every_position_keeps_outputs():
    """Same sequence at another offset: identical outputs (RoPE); a block misplaced by one slot: different."""
    model = random_drafter()
    taps, k, v = context(model, B=1, T=6)
    ctx_len = torch.tensor([6])
    ids, pos = model.block_ids(torch.tensor([3]), ctx_len)
    h = model.block_forward(ids, pos, k, v, ctx_len)
    k_s, v_s = model.context_kv(taps, torch.arange(6).view(1, 6) + 40)
    torch.testing.assert_close(model.block_forward(ids, pos + 40, k_s, v_s, ctx_len), h, rtol=1e-4, atol=1e-4)
    assert (model.block_forward(ids, pos + 1, k, v, ctx_len) - h).abs().max() > 1e-3


@pytest.mark.parametrize("sample_from_anchor", [True, False], ids=["anchor-first", "bonus-anchor"])
def test_layouts_return_the_n_prediction_slots(sample_from_anchor):
    model = random_drafter(sample_from_anchor=sample_from_anchor)
    c = model.config
    _, k, v = context(model)
    ctx_len, anchor = torch.tensor([9, 6]), torch.tensor([3, 4])
    ids, pos = model.block_ids(anchor, ctx_len)
    full = model.block_forward(ids, pos, k, v, ctx_len)  # [B, block_size, d]
    h = model.block_hidden(anchor, k, v, ctx_len)
    assert h.shape[1] == c.num_draft_tokens == (c.block_size if sample_from_anchor else c.block_size - 1)
    torch.testing.assert_close(h, full if sample_from_anchor else full[:, 1:], rtol=0, atol=0)
    res = model.draft(anchor, k, v, ctx_len, topk=16)
    assert res.tokens.shape == (2, c.num_draft_tokens)


def test_confidence_is_the_head_on_hidden_and_markov_embedding():
    model = random_drafter()
    _, k, v = context(model)
    ctx_len, anchor = torch.tensor([9, 6]), torch.tensor([3, 4])
    res = model.draft(anchor, k, v, ctx_len, topk=16)
    h = model.block_hidden(anchor, k, v, ctx_len)
    prev = torch.cat((anchor.view(-1, 1), res.tokens[:, :-1]), 1)
    feats = torch.cat((h, model.markov_head.markov_w1.weight[prev]), -1)  # [B, N, d + r]
    want = torch.sigmoid(model.confidence_head.proj(feats)).squeeze(-1)
    torch.testing.assert_close(res.confidence, want, rtol=1e-5, atol=1e-6)


def test_base_logits_apply_logit_scale():
    model = random_drafter(logit_scale=0.5)
    h = torch.randn(2, 5, model.config.hidden_size)
    torch.testing.assert_close(model.base_logits(h), 0.5 * model.lm_head(h))


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_decoder_layer_matches_transformers_qwen3(causal):
    """Without context, a draft layer is a Qwen3 decoder layer with a full (or, causal, a lower-triangular) mask."""
    from dspark_trt.reference.layers import block_attention_mask

    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3 import modeling_qwen3 as q3

    model = random_drafter()
    c = model.config
    hf_cfg = transformers.Qwen3Config(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim,
        rms_norm_eps=c.rms_norm_eps, rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta},
        num_hidden_layers=1, attention_dropout=0.0,
    )
    hf_cfg._attn_implementation = "eager"
    layer = q3.Qwen3DecoderLayer(hf_cfg, layer_idx=0).eval()
    layer.load_state_dict(model.layers[0].state_dict())
    rotary = q3.Qwen3RotaryEmbedding(hf_cfg)
    B, Q = 2, 5
    x = torch.randn(B, Q, c.hidden_size)
    positions = torch.arange(3, 3 + Q).expand(B, Q)
    empty = torch.zeros(B, c.num_key_value_heads, 0, c.head_dim)  # [B, H_kv, T = 0, D]
    ours = model.layers[0](x, positions, empty, empty, block_attention_mask(torch.zeros(B), 0, Q, None, causal))
    additive = torch.zeros(B, 1, Q, Q)
    if causal:
        additive = additive.masked_fill(torch.ones(Q, Q, dtype=torch.bool).triu(1), float("-inf"))
    theirs = layer(x, attention_mask=additive, position_ids=positions,
                   position_embeddings=rotary(x, positions))
    theirs = theirs[0] if isinstance(theirs, tuple) else theirs
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


# bf16 vs fp32 drafter: every matmul rounds to 8 mantissa bits, through 2 layers: a few % of the logit range
BF16_ATOL = 0.08


def test_bf16_drafter_tracks_fp32():
    fp32 = random_drafter()
    bf16 = random_drafter(dtype=torch.bfloat16)
    _, k, v = context(fp32)
    ctx_len, anchor = torch.tensor([9, 6]), torch.tensor([3, 4])
    u32 = fp32.base_logits(fp32.block_hidden(anchor, k, v, ctx_len))
    u16 = bf16.base_logits(bf16.block_hidden(anchor, k.bfloat16(), v.bfloat16(), ctx_len)).float()
    scale = u32.abs().max()
    assert (u16 - u32).abs().max() / scale < BF16_ATOL
    assert (u16.argmax(-1) == u32.argmax(-1)).float().mean() > 0.8  # ties at low precision may flip


def test_config_and_module_agree_on_bonus_anchor_n():
    c = tiny_config(block_size=8, sample_from_anchor=False)
    assert isinstance(c, DSparkConfig) and c.num_draft_tokens == 7


# -- per-layer attention patterns (speculators' sliding_attention layers) -------------------------------------
def speculators_mask_mod(p: int, T: int, Q: int, window: int | None, non_causal: bool):
    """speculators' ``create_anchor_block_mask_mod`` for one anchor at ``p``, one document, transcribed as loops:
    key index < T is context row t, ≥ T block slot; True = attend."""
    non_causal = window is None or non_causal  # full-attention masks are always bidirectional
    mask = torch.zeros(Q, T + Q, dtype=torch.bool)
    for q in range(Q):
        for kv in range(T + Q):
            if kv < T:
                mask[q, kv] = kv < p and (window is None or kv >= p - window)
            else:
                mask[q, kv] = non_causal or kv - T <= q
    return mask


@pytest.mark.parametrize("window, causal", [(None, False), (1, True), (3, True), (3, False), (7, True), (50, True),
                                            (50, False)])  # every (W, causal) that DSparkConfig.layer_attention gives
def test_block_attention_mask_is_the_speculators_training_mask(window, causal):
    from dspark_trt.reference.layers import block_attention_mask

    T, Q = 11, 5
    ctx_len = torch.tensor([0, 1, 4, 9, 11])
    mask = block_attention_mask(ctx_len, T, Q, window, causal).expand(5, Q, T + Q)
    for b, p in enumerate(ctx_len.tolist()):
        want = speculators_mask_mod(p, T, Q, window, non_causal=not causal)
        assert torch.equal(mask[b], want), (p, window, causal)


def test_causal_layers_keep_earlier_slots_blind_to_later_ones():
    """All layers causal: changing block slot 3 leaves slots 0-2 bit-identical; one bidirectional layer does not."""
    for layer_types, blind in ((("sliding_attention",) * 2, True), (("sliding_attention", "full_attention"), False)):
        model = random_drafter(layer_types=layer_types, sliding_window=100)
        _, k, v = context(model)
        ctx_len = torch.tensor([9, 6])
        ids, pos = model.block_ids(torch.tensor([3, 4]), ctx_len)
        h = model.block_forward(ids, pos, k, v, ctx_len)
        ids2 = ids.clone()
        ids2[:, 3] = 7
        h2 = model.block_forward(ids2, pos, k, v, ctx_len)
        assert torch.equal(h2[:, :3], h[:, :3]) == blind
        assert (h2[:, 3:] - h[:, 3:]).abs().max() > 1e-4


@pytest.mark.parametrize("non_causal", [False, True])
def test_windowed_layers_ignore_context_before_the_window(non_causal):
    """Window 3 on every layer: context rows < p - 3 can hold anything; with a full layer they count."""
    W = 3
    for layer_types, blind in ((("sliding_attention",) * 2, True), (("full_attention", "sliding_attention"), False)):
        model = random_drafter(layer_types=layer_types, sliding_window=W, sliding_window_non_causal=non_causal)
        _, k, v = context(model)
        ctx_len, anchor = torch.tensor([9, 6]), torch.tensor([3, 4])
        h = model.block_hidden(anchor, k, v, ctx_len)
        k2, v2 = k.clone(), v.clone()
        for b, p in enumerate(ctx_len.tolist()):
            k2[:, b, : p - W] = torch.randn_like(k2[:, b, : p - W])
            v2[:, b, : p - W] = torch.randn_like(v2[:, b, : p - W])
        assert torch.equal(model.block_hidden(anchor, k2, v2, ctx_len), h) == blind
        for b, p in enumerate(ctx_len.tolist()):
            k2[:, b, p - 1] += 1.0  # the last row before the anchor: always inside the window
        assert (model.block_hidden(anchor, k2, v2, ctx_len) - h).abs().amax(dim=(1, 2)).min() > 1e-4


def test_use_sliding_window_off_means_full_bidirectional_layers():
    model = random_drafter(layer_types=("sliding_attention",) * 2, sliding_window=None)
    full = random_drafter()
    _, k, v = context(model)
    ctx_len, anchor = torch.tensor([9, 6]), torch.tensor([3, 4])
    assert model.config.bidirectional_full_attention
    assert torch.equal(model.block_hidden(anchor, k, v, ctx_len), full.block_hidden(anchor, k, v, ctx_len))
