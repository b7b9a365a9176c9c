"""Attention over a capacity cache + new slots, against the softmax over the concatenated, head-repeated K/V
(what transformers computes), with holes, padding, GQA groups and an empty past; and the target graph module
itself (eager, no export) against the transformers model with its own cache."""

from __future__ import annotations

import inspect

import pytest
import torch

from dspark_trt.export.capacity_attention import LayerKV, capacity_attention, slot_bias


class _Module:  # what the attention interface reads from the attention module: nothing but its layer
    layer_idx = 0


def _reference(query, past_k, past_v, new_k, new_v, mask, scale):
    """softmax over [past ; new] with GQA heads repeated, the slot mask and causality among the new slots."""
    B, Hq, Q, D = query.shape
    g = Hq // past_k.shape[1]
    k = torch.cat((past_k, new_k), dim=2).repeat_interleave(g, dim=1).float()  # [B, Hq, P + Q, D]
    v = torch.cat((past_v, new_v), dim=2).repeat_interleave(g, dim=1).float()
    P = past_k.shape[2]
    allowed = mask.bool().view(B, 1, 1, P + Q).expand(B, 1, Q, P + Q).clone()
    allowed[..., P:] &= torch.ones(Q, Q, dtype=torch.bool).tril()
    scores = (query.float() @ k.transpose(2, 3)) * scale
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return (weights @ v).transpose(1, 2)  # [B, Q, Hq, D]


@pytest.mark.parametrize("P,Q,Hq,Hkv", [(7, 1, 6, 2), (7, 5, 6, 3), (1, 4, 4, 4), (130, 8, 9, 3)])
def test_matches_softmax_over_the_concatenated_cache(P, Q, Hq, Hkv):
    g = torch.Generator().manual_seed(P * 31 + Q)
    B, D = 3, 16
    query = torch.randn(B, Hq, Q, D, generator=g)
    past_k, past_v = torch.randn(B, Hkv, P, D, generator=g), torch.randn(B, Hkv, P, D, generator=g)
    new_k, new_v = torch.randn(B, Hkv, Q, D, generator=g), torch.randn(B, Hkv, Q, D, generator=g)
    mask = torch.ones(B, P + Q, dtype=torch.int64)
    mask[0, P // 2:P] = 0  # unused capacity (P = 1: an empty cache, its one slot masked)
    mask[1, 1:P:2] = 0  # holes
    mask[2, P + Q - 1] = 0 if Q > 1 else 1  # a padded new token (prefill of a shorter prompt)
    kv = LayerKV(past_k, past_v)
    out, weights = capacity_attention(_Module(), query, new_k, new_v, slot_bias(mask, P, Hq // Hkv), scaling=D ** -0.5,
                                      dspark_kv=kv)
    assert weights is None and kv.new_key is new_k and kv.new_value is new_v
    torch.testing.assert_close(out, _reference(query, past_k, past_v, new_k, new_v, mask, D ** -0.5),
                               atol=1e-5, rtol=1e-5)


def test_masked_slots_do_not_leak_and_a_fully_masked_row_stays_finite():
    g = torch.Generator().manual_seed(0)
    B, H, P, Q, D = 1, 2, 6, 2, 8
    query, new_k, new_v = (torch.randn(B, H, Q, D, generator=g) for _ in range(3))  # Hq = Hkv: groups of 1
    past_k, past_v = torch.randn(B, H, P, D, generator=g), torch.randn(B, H, P, D, generator=g)
    mask = torch.tensor([[1, 1, 0, 0, 0, 0, 1, 1]])
    out = capacity_attention(_Module(), query, new_k, new_v, slot_bias(mask, P, 1), dspark_kv=LayerKV(past_k, past_v))[0]
    poisoned_k, poisoned_v = past_k.clone(), past_v.clone()
    poisoned_k[:, :, 2:], poisoned_v[:, :, 2:] = 1e4, -1e4  # stale slots past the used ones: any finite values
    again = capacity_attention(_Module(), query, new_k, new_v, slot_bias(mask, P, 1),
                               dspark_kv=LayerKV(poisoned_k, poisoned_v))[0]
    torch.testing.assert_close(again, out)
    nothing = torch.zeros(1, P + Q, dtype=torch.int64)  # a padded request with no valid slot at all
    out = capacity_attention(_Module(), query, new_k, new_v, slot_bias(nothing, P, 1), dspark_kv=LayerKV(past_k, past_v))[0]
    assert bool(torch.isfinite(out).all())


@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen2"])
def test_target_graph_module_matches_transformers_with_its_cache(family, tmp_path):
    """The graph module (eager) over a capacity cache with unused slots = the transformers model over exactly
    the used slots (DynamicCache), logits and taps, the last layer tapped before the final norm."""
    from transformers import DynamicCache

    from dspark_trt.export.target_graph import TargetGraph
    from dspark_trt.export.target_onnx import load_target_model
    from dspark_trt.synthetic import write_tiny_checkpoint

    pair = write_tiny_checkpoint(tmp_path / family, target_family=family, vocab_size=257, num_target_layers=3, seed=2)
    model = load_target_model(pair.target, torch.float32)
    graph = TargetGraph(model, [-1, 2])
    L, H, D = graph.shape.num_layers, graph.shape.num_key_value_heads, graph.shape.head_dim
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 257, (1, 9), generator=g)
    with torch.no_grad():
        empty = [torch.randn(1, H, 1, D, generator=g) for _ in range(L)]  # capacity 1, nothing used
        first = torch.cat((torch.zeros(1, 1), torch.ones(1, 9)), dim=1).to(torch.int64)
        logits0, taps0, k0, v0 = graph(prompt, torch.arange(9).view(1, 9), first, torch.arange(9).view(1, 9), empty,
                                       empty)
        cap = 16  # capacity 16, 9 used: slots 9 … 15 hold garbage the mask hides
        keys = [torch.cat((k0[i], torch.randn(1, H, cap - 9, D, generator=g)), dim=2) for i in range(L)]
        values = [torch.cat((v0[i], torch.randn(1, H, cap - 9, D, generator=g)), dim=2) for i in range(L)]
        new = torch.randint(0, 257, (1, 3), generator=g)
        mask = torch.cat((torch.ones(1, 9), torch.zeros(1, cap - 9), torch.ones(1, 3)), dim=1).to(torch.int64)
        logits, taps, new_k, new_v = graph(new, torch.arange(9, 12).view(1, 3), mask, torch.tensor([[2, 0]]), keys,
                                           values)

        cache = DynamicCache()
        kw = {"cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values": cache}
        ref = model(prompt, use_cache=True, output_hidden_states=True, **kw)
        hs0 = ref.hidden_states
        ref = model(new, use_cache=True, output_hidden_states=True, **kw)
    torch.testing.assert_close(logits0, ref_logits0 := model(prompt).logits, atol=1e-5, rtol=1e-5)
    assert ref_logits0.dtype == logits0.dtype
    torch.testing.assert_close(taps0[..., :64], hs0[0], atol=1e-6, rtol=1e-6)  # tap -1: the embeddings
    torch.testing.assert_close(logits, ref.logits[:, [2, 0]], atol=1e-5, rtol=1e-5)  # logits_index picks rows
    torch.testing.assert_close(model.model.norm(taps[..., 64:]), ref.hidden_states[-1], atol=1e-5, rtol=1e-5)
    layer = cache.layers[1] if hasattr(cache, "layers") else None
    if layer is not None:
        torch.testing.assert_close(new_k[1], layer.keys[:, :, 9:12], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(new_v[1], layer.values[:, :, 9:12], atol=1e-6, rtol=1e-6)
