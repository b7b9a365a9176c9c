"""The Gemma-4 draft layers (DeepSpec's Gemma4DSparkModel) against transformers' Gemma-4 modules with copied weights:
RoPE, RMSNorm, one layer over [context ; block] through transformers' own decoder layer and cache, and the whole
drafter (scaled embeddings, fused context, final norm, soft-capped logits) as DeepSpec computes it. Qwen3's RoPE is
unchanged bit for bit."""

from __future__ import annotations

import pytest
import torch

from dspark_trt.reference.drafter import DSparkDrafter
from dspark_trt.synthetic import tiny_config

transformers = pytest.importorskip("transformers")
g4 = pytest.importorskip("transformers.models.gemma4.modeling_gemma4")

pytestmark = pytest.mark.usefixtures("one_thread")

#: the brief's tiny widths: hidden 64, head_dim 16 (the target's sliding layers), global_head_dim 32 (the drafter's)
WIDTH = dict(vocab_size=600, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2)


def gemma4_config(layers=2, k_eq_v=False, cap=30.0, **options):
    """A Gemma-4 drafter's DSparkConfig: D = global_head_dim 32, proportional RoPE (θ 10⁶, ¼ rotated)."""
    base = tiny_config(**{**WIDTH, "num_layers": layers, "head_dim": 32, "markov_rank": 8, **options})
    return base.replace(layer_family="gemma4", hidden_act="gelu_pytorch_tanh", partial_rotary_factor=0.25,
                        rope_theta=1_000_000.0, final_logit_softcapping=cap, attention_k_eq_v=k_eq_v,
                        num_key_value_heads=1 if k_eq_v else base.num_key_value_heads)


def random_gemma4(config, seed=0, dtype=torch.float32) -> DSparkDrafter:
    """Every parameter random, the norm weights around 1 and each ``layer_scalar`` away from 1."""
    torch.manual_seed(seed)
    model = DSparkDrafter(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.2 * torch.randn_like(p) if name.endswith("norm.weight") else 0.3 * torch.randn_like(p))
        for layer in model.layers:
            layer.layer_scalar.fill_(0.5 + torch.rand(()).item())
    return model.to(dtype).eval().requires_grad_(False)


def hf_config(c, num_layers=1):
    """transformers' Gemma4TextConfig of ``c``'s draft layers (all full attention, as DeepSpec writes them)."""
    kw = dict(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
              num_hidden_layers=num_layers, num_attention_heads=c.num_attention_heads, head_dim=16,
              global_head_dim=c.head_dim, layer_types=["full_attention"] * num_layers, hidden_size_per_layer_input=0,
              num_kv_shared_layers=0, sliding_window=8, rms_norm_eps=c.rms_norm_eps,
              final_logit_softcapping=c.final_logit_softcapping, attention_k_eq_v=c.attention_k_eq_v,
              num_key_value_heads=2)
    if c.attention_k_eq_v:
        kw["num_global_key_value_heads"] = c.num_key_value_heads
    cfg = transformers.Gemma4TextConfig(**kw)
    cfg._attn_implementation = "eager"
    return cfg


def test_proportional_rope_is_transformers_full_attention_rope():
    from dspark_trt.reference.layers import rope_tables

    c = gemma4_config()
    rotary = g4.Gemma4TextRotaryEmbedding(hf_config(c))
    positions = torch.tensor([[0, 3, 17, 1000, 70000]])
    cos, sin = rotary(torch.zeros(1, 5, c.hidden_size), positions, "full_attention")
    ours = rope_tables(positions, c.head_dim, c.rope_theta, torch.float32, c.partial_rotary_factor)
    torch.testing.assert_close(ours, (cos, sin), rtol=0, atol=0)
    assert bool((ours[1][..., 4:16] == 0).all())  # ¼ of the 16 pairs turn; the rest keep their values


def test_default_rope_is_unchanged_for_qwen3():
    """factor 1 computes exactly what Qwen3's RoPE always computed (no zero frequencies appended)."""
    from dspark_trt.reference.layers import rope_tables

    positions = torch.arange(0, 4070, 37).view(2, -1)  # 110 positions
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, 128, 2, dtype=torch.int64).float() / 128))
    emb = torch.cat([positions.float().unsqueeze(-1) * inv_freq] * 2, -1)
    for got, want in zip(rope_tables(positions, 128, 1e6, torch.bfloat16), (emb.cos(), emb.sin())):
        assert torch.equal(got, want.bfloat16())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_scale", [True, False])
def test_rms_norm_is_gemma4s(dtype, with_scale):
    from dspark_trt.reference.gemma4_layers import Gemma4RMSNorm

    ours, theirs = Gemma4RMSNorm(24, 1e-6, with_scale), g4.Gemma4RMSNorm(24, 1e-6, with_scale=with_scale)
    if with_scale:
        with torch.no_grad():
            ours.weight.normal_(1.0, 0.3)
        theirs.load_state_dict(ours.state_dict())
    x = (4 * torch.randn(3, 5, 24, generator=torch.Generator().manual_seed(2))).to(dtype)
    assert torch.equal(ours.to(dtype)(x), theirs.to(dtype)(x))


def deepspec_context_kv(attn, h, positions, rotary):
    """DeepSpec's Gemma4DSparkAttention on ``target_hidden_states`` h [B, T, d], with transformers' modules:
    K = rope(k_norm(k_proj h)), V = v_norm(v_proj h) (k_eq_v: of k_proj h) → [B, H_kv, T, D] each."""
    B, T, _ = h.shape
    D = attn.head_dim
    k = attn.k_proj(h).view(B, T, -1, D)
    v = k if attn.v_proj is None else attn.v_proj(h).view(B, T, -1, D)
    cos, sin = rotary(h, positions, "full_attention")
    k = g4.apply_rotary_pos_emb(attn.k_norm(k), cos, sin, unsqueeze_dim=2)
    return k.transpose(1, 2), attn.v_norm(v).transpose(1, 2)


def deepspec_block(model, taps, ctx_positions, ids, positions, ctx_len):
    """DeepSpec's ``_forward_backbone`` + ``compute_logits`` for one block per request, built from transformers'
    Gemma-4 modules with ``model``'s weights: scaled embeddings, hidden_norm(fc(taps)), per layer the context K/V
    prefilled into a DynamicCache before transformers' own decoder layer runs the block (bidirectional, context
    rows < p), final norm, soft-capped lm_head → (final-normed states [B, Q, d], logits [B, Q, V])."""
    c = model.config
    cfg = hf_config(c, c.num_hidden_layers)
    embed = g4.Gemma4TextScaledWordEmbedding(c.vocab_size, c.hidden_size, 0, embed_scale=c.hidden_size ** 0.5)
    embed.weight = model.embed_tokens.weight
    hidden_norm, norm = g4.Gemma4RMSNorm(c.hidden_size, c.rms_norm_eps), g4.Gemma4RMSNorm(c.hidden_size,
                                                                                        c.rms_norm_eps)
    hidden_norm.load_state_dict(model.hidden_norm.state_dict())
    norm.load_state_dict(model.norm.state_dict())
    rotary = g4.Gemma4TextRotaryEmbedding(cfg)
    target = hidden_norm(model.fc(taps))  # [B, T, d]
    x = embed(ids)  # [B, Q, d] × √d
    B, Q, T = ids.shape[0], ids.shape[1], taps.shape[1]
    additive = torch.zeros(B, 1, Q, T + Q)
    additive[..., :T] = additive[..., :T].masked_fill(
        (torch.arange(T).view(1, T) >= ctx_len.view(B, 1)).view(B, 1, 1, T), float("-inf"))
    cache = transformers.DynamicCache()
    for i, ours in enumerate(model.layers):
        layer = g4.Gemma4TextDecoderLayer(cfg, i).eval()
        layer.load_state_dict(ours.state_dict())
        k, v = deepspec_context_kv(layer.self_attn, target, ctx_positions, rotary)
        cache.update(k, v, i)
        x = layer(x, shared_kv_states={}, position_embeddings=rotary(x, positions, "full_attention"),
                  attention_mask=additive, position_ids=positions, cache=cache)
    states = norm(x)
    logits = model.lm_head(states)
    cap = c.final_logit_softcapping
    return states, torch.tanh(logits / cap) * cap


@pytest.mark.parametrize("k_eq_v", [False, True], ids=["kv", "k-eq-v"])
def test_the_drafter_is_deepspecs_gemma4_backbone_over_transformers_modules(k_eq_v):
    """Whole drafter: embeddings × √d, context K/V from hidden_norm(fc(taps)), two Gemma-4 layers attending over
    [context ; block] (padding rows past p masked), final norm, soft-capped logits."""
    model = random_gemma4(gemma4_config(k_eq_v=k_eq_v, cap=5.0))  # a cap these logits reach
    c = model.config
    B, T = 2, 9
    gen = torch.Generator().manual_seed(1)
    taps = torch.randn(B, T, c.num_taps * c.hidden_size, generator=gen)
    ctx_positions = torch.arange(T).expand(B, T)
    ctx_len = torch.tensor([9, 6])
    k, v = model.context_kv(taps, ctx_positions)
    states = model.block_states(torch.tensor([3, 511]), k, v, ctx_len)
    ids, positions = model.block_ids(torch.tensor([3, 511]), ctx_len)
    with torch.no_grad():
        want_states, want_logits = deepspec_block(model, taps, ctx_positions, ids, positions, ctx_len)
    torch.testing.assert_close(states, want_states, rtol=1e-4, atol=1e-4)
    logits = model.base_logits(states)
    torch.testing.assert_close(logits, want_logits, rtol=1e-4, atol=1e-4)
    assert logits.abs().max() < c.final_logit_softcapping  # capped
    assert model.lm_head(states).abs().max() > c.final_logit_softcapping  # and the cap mattered here


def test_a_qwen3_style_scaled_attention_is_caught(monkeypatch):
    """The parity above can fail: the same drafter with scores × D^-0.5 (Qwen3's scale) differs from DeepSpec's."""
    import dspark_trt.reference.gemma4_layers as gl

    model = random_gemma4(gemma4_config(layers=1))
    c = model.config
    taps = torch.randn(1, 5, c.num_taps * c.hidden_size, generator=torch.Generator().manual_seed(4))
    ctx_positions = torch.arange(5).view(1, 5)
    ctx_len = torch.tensor([5])
    ids, positions = model.block_ids(torch.tensor([7]), ctx_len)
    with torch.no_grad():
        want, _ = deepspec_block(model, taps, ctx_positions, ids, positions, ctx_len)
        monkeypatch.setattr(gl.Gemma4DraftAttention, "score_scale", c.head_dim ** -0.5)
        k, v = model.context_kv(taps, ctx_positions)
        got = model.block_states(torch.tensor([7]), k, v, ctx_len)
    assert (got - want).abs().max() > 1e-2


def test_bf16_embeddings_are_scaled_by_the_bf16_rounded_root():
    """√64 = 8 is exact, so at d = 60 (√60 = 7.746, bf16 7.75): the block embeddings are E[ids] × bf16(√d)."""
    model = random_gemma4(gemma4_config(layers=1, hidden_size=60, intermediate_size=90), dtype=torch.bfloat16)
    ids = torch.tensor([[1, 2, 3]])
    want = model.embed_tokens(ids) * torch.tensor(7.75, dtype=torch.bfloat16)
    assert torch.equal(model.embed(ids), want)
    assert not torch.equal(model.embed(ids), (model.embed_tokens(ids).float() * 60 ** 0.5).bfloat16())


def test_layer_scalar_and_v_norm_are_state():
    """layer_scalar is a checkpoint buffer; v_norm has no weight (nothing to load); k_eq_v has no v_proj."""
    names = set(DSparkDrafter(gemma4_config(layers=1)).state_dict())
    assert "layers.0.layer_scalar" in names and not any("v_norm" in n for n in names)
    assert "layers.0.self_attn.v_proj.weight" in names
    assert "layers.0.self_attn.v_proj.weight" not in set(DSparkDrafter(gemma4_config(layers=1, k_eq_v=True))
                                                         .state_dict())
