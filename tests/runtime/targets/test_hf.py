"""HFTarget: layer taps, right-padded prefill, verify/commit rollback, hole masks, compaction, families."""

from __future__ import annotations

import pytest
import torch

from dspark_trt.errors import DSparkTrtError
from dspark_trt.runtime import HFTarget


@pytest.fixture(scope="module")
def target(random_pair):
    t = HFTarget.from_pretrained(random_pair.target, dtype="fp32", device="cpu")
    t.set_taps([1, 2, 4])
    return t


def fresh(target, seq):
    """Logits [T, V] and hidden states of one sequence, computed from scratch."""
    with torch.no_grad():
        out = target.model(torch.tensor([seq]), output_hidden_states=True)
    return out.logits[0], out.hidden_states


def test_taps_use_the_deepseek_to_hf_index_conversion(target):
    seq = [5, 6, 7, 8]
    out = target.prefill([torch.tensor(seq)])
    _, hs = fresh(target, seq)
    want = torch.cat([hs[2], hs[3], hs[5]], dim=-1)[0]  # DeepSeek ids 1, 2, 4 → output_hidden_states 2, 3, 5
    torch.testing.assert_close(out.taps[0], want)
    target.set_taps([-1])  # -1 = the embedding output
    out = target.prefill([torch.tensor(seq)])
    torch.testing.assert_close(out.taps[0], hs[0][0])
    target.set_taps([1, 2, 4])


@pytest.mark.parametrize("ids", [[0, -2], [6], [1, 2, 7]])
def test_tapping_beyond_the_last_layer_is_rejected(target, ids):
    with pytest.raises(DSparkTrtError, match=r"outside \[-1, 5\]"):
        target.set_taps(ids)
    target.set_taps([1, 2, 4])


def test_the_last_layer_is_tapped_before_the_final_norm(target):
    """speculators' --include-last-layer / vLLM: id L-1 is the last decoder layer's output, not the normed
    output_hidden_states[-1]."""
    seq = [5, 6, 7, 8]
    _, hs = fresh(target, seq)
    captured = []
    layer = target.model.model.layers[-1]
    handle = layer.register_forward_hook(lambda m, a, out: captured.append(out[0] if isinstance(out, tuple) else out))
    with torch.no_grad():
        target.model(torch.tensor([seq]))
    handle.remove()
    pre_norm = captured[0][0]  # [T, d]
    target.set_taps([1, 5])
    out = target.prefill([torch.tensor(seq)])
    torch.testing.assert_close(out.taps[0, :, :64], hs[2][0])
    torch.testing.assert_close(out.taps[0, :, 64:], pre_norm)
    torch.testing.assert_close(target.model.model.norm(pre_norm), hs[6][0])  # the post-norm state ...
    assert (out.taps[0, :, 64:] - hs[6][0]).abs().max() > 0.1  # ... is not what we tap
    target.set_taps([1, 2, 4])


def test_right_padded_prefill_equals_each_prompt_alone(target):
    prompts = [[5, 6, 7, 8, 9, 10], [100], [42, 43, 44]]
    out = target.prefill([torch.tensor(p) for p in prompts])
    assert target.lengths.tolist() == [6, 1, 3]
    for b, p in enumerate(prompts):
        logits, hs = fresh(target, p)
        torch.testing.assert_close(out.logits[b], logits[-1], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out.taps[b, : len(p)], torch.cat([hs[2], hs[3], hs[5]], -1)[0], atol=1e-5, rtol=1e-5)


def test_verify_commit_rolls_back_rejected_tokens(target):
    """Several rounds of verify + partial commit: every verify scores exactly as on the committed sequence."""
    g = torch.Generator().manual_seed(0)
    prompts = [[5, 6, 7], [9], [11, 12, 13, 14, 15]]
    seqs = [list(p) for p in prompts]
    target.prefill([torch.tensor(p) for p in prompts])
    for round_ in range(6):
        fed = torch.randint(0, 2400, (3, 4), generator=g)  # [B, Q]
        out = target.verify(fed)
        for b in range(3):
            logits, hs = fresh(target, seqs[b] + fed[b].tolist())
            torch.testing.assert_close(out.logits[b], logits[-4:], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(out.taps[b], torch.cat([hs[2], hs[3], hs[5]], -1)[0, -4:], atol=1e-5, rtol=1e-5)
        keep = torch.tensor([(round_ + b) % 5 for b in range(3)])  # 0 … 4 kept, per request
        target.commit(keep)
        for b in range(3):
            seqs[b] += fed[b, : int(keep[b])].tolist()
        assert target.lengths.tolist() == [len(s) for s in seqs]
        assert target.cached_slots() <= target.compact_ratio * max(len(s) for s in seqs) + 4
    with pytest.raises(DSparkTrtError, match="verify called twice"):
        target.verify(fed)
        target.verify(fed)


def test_single_request_rollback_crops_to_the_accepted_length(target):
    target.prefill([torch.tensor([1, 2, 3])])
    target.verify(torch.tensor([[4, 5, 6, 7]]))
    target.commit(torch.tensor([2]))
    assert target.cached_slots() == 5 and target.cache.get_seq_length() == 5  # exact crop, no holes


def test_select_drops_requests(target):
    prompts = [[5, 6, 7], [9, 10], [11]]
    target.prefill([torch.tensor(p) for p in prompts])
    target.select(torch.tensor([0, 2]))
    out = target.verify(torch.tensor([[20, 21], [22, 23]]))
    for b, p in enumerate([prompts[0] + [20, 21], prompts[2] + [22, 23]]):
        torch.testing.assert_close(out.logits[b], fresh(target, p)[0][-2:], atol=1e-5, rtol=1e-5)
    target.commit(torch.tensor([1, 2]))


def test_llama_family_target(tmp_path):
    from dspark_trt.runtime.decoder import SpeculativeDecoder
    from dspark_trt.runtime.drafters.torch import TorchDrafterBackend
    from dspark_trt.synthetic import write_tiny_checkpoint

    pair = write_tiny_checkpoint(tmp_path / "llama", target_family="llama", vocab_size=301, seed=3)
    target = HFTarget.from_pretrained(pair.target, dtype="fp32", device="cpu")
    assert type(target.model).__name__ == "LlamaForCausalLM"
    dec = SpeculativeDecoder(target, TorchDrafterBackend.from_pretrained(pair.drafter, target_dir=pair.target,
                                                                          device="cpu"))
    prompts = [[1, 2, 3], [7]]
    assert dec.generate(prompts, 10).tokens == dec.generate(prompts, 10, draft=False).tokens


def test_missing_target_dir_is_a_one_line_error(tmp_path):
    with pytest.raises(DSparkTrtError, match="no config.json in target directory"):
        HFTarget.from_pretrained(tmp_path)


def test_a_sliding_window_target_is_refused_in_one_line(tmp_path):
    """A Gemma-4 target (5 sliding : 1 global) runs from an export; HFTarget cannot roll its sliding cache back."""
    from dspark_trt.synthetic import write_preset

    target = write_preset("gemma4_12b", tmp_path / "gemma4", layers=6, vocab=600, dtype="fp32", hidden_size=64,
                          intermediate_size=96, head_dim=16, global_head_dim=32, num_attention_heads=4,
                          num_key_value_heads=2, sliding_window=8)
    with pytest.raises(DSparkTrtError) as e:
        HFTarget.from_pretrained(target.path, dtype="fp32", device="cpu")
    assert "sliding-window layers" in str(e.value) and "--export" in str(e.value) and "\n" not in str(e.value)
