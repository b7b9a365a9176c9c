"""The drafter's context cache is read where it lies: every draft round hands the backend the cache's own
memory (each layer's heads-first block, contiguous), never a per-round copy of the context, and decoding
stays lossless across a capacity-bucket growth (runtime/drafter_state.py, export/graphs.py).

Prompts of 117, 3 and 61 tokens: the drafter's cache starts in the 128-slot bucket and grows to 160 while
the batch decodes 40 tokens (and to 192 with a round's rows); greedy speculation must give the target-only
tokens with the torch and the onnxruntime drafters alike."""

from __future__ import annotations

import pytest

from tests.runtime.runtime_helpers import make_decoder, random_prompts

LENGTHS = (117, 3, 61)
NEW = 40


def prompts(decoder):
    vocab, mask = decoder.target.vocab_size, decoder.config.mask_token_id
    return [random_prompts(1, vocab, seed=7 + n, min_len=n, max_len=n, avoid=(mask,))[0] for n in LENGTHS]


class DraftRecorder:
    """Wraps ``backend.draft`` (the real backend still runs): what the runtime hands it each round."""

    def __init__(self, backend):
        self.backend, self.draft, self.rounds = backend, backend.draft, []
        backend.draft = self

    def __call__(self, anchor, ctx_k, ctx_v, ctx_len, **kw):
        blocks = [ctx_k[i].transpose(1, 2) for i in range(ctx_k.shape[0])]  # [B, H_kv, T, D]: what is read
        self.rounds.append({"ptr": ctx_k.data_ptr(), "capacity": ctx_k.shape[2], "batch": ctx_k.shape[1],
                            "contiguous": all(b.is_contiguous() for b in blocks),
                            "layer_ptrs": [b.data_ptr() for b in blocks]})
        return self.draft(anchor, ctx_k, ctx_v, ctx_len, **kw)

    def close(self):
        del self.backend.draft


def check_rounds(rounds):
    """The same buffers round after round (a new one only with a new capacity bucket or batch), each layer a
    contiguous block of it, and the capacity growing bucket by bucket."""
    assert len(rounds) > 5 and all(r["contiguous"] for r in rounds)
    assert sorted({r["capacity"] for r in rounds}) == [128, 160, 192]  # 117 + 40 tokens + a round's rows
    moves = sum(1 for a, b in zip(rounds, rounds[1:]) if a["ptr"] != b["ptr"])
    shapes = sum(1 for a, b in zip(rounds, rounds[1:]) if (a["capacity"], a["batch"]) != (b["capacity"], b["batch"]))
    assert 1 <= moves <= shapes, f"{moves} buffer moves for {shapes} bucket/batch changes: the context was copied"


def test_torch_drafter_reads_the_cache_in_place_and_stays_lossless(distilled_pair, monkeypatch):
    import dspark_trt.reference.layers as layers

    decoder = make_decoder(distilled_pair)
    ps = prompts(decoder)
    base = decoder.generate(ps, NEW, draft=False)
    attended, attention = [], layers.two_part_attention

    def recording_attention(q, ctx_k, ctx_v, *args):
        attended.append((ctx_k.data_ptr(), ctx_k.is_contiguous(), ctx_v.is_contiguous()))
        return attention(q, ctx_k, ctx_v, *args)

    monkeypatch.setattr(layers, "two_part_attention", recording_attention)
    recorder = DraftRecorder(decoder.backend)
    try:
        spec = decoder.generate(ps, NEW, topk=16)
    finally:
        recorder.close()
    assert spec.tokens == base.tokens and spec.stats.accepted > 0
    check_rounds(recorder.rounds)
    # the attention itself reads the cache's blocks (no copy in between): layer 0's block is the cache's start
    layer0 = {r["layer_ptrs"][0] for r in recorder.rounds}
    assert all(contiguous for _, contiguous, _ in attended) and {p for p, _, _ in attended} >= layer0


@pytest.mark.onnx
def test_onnxruntime_drafter_feeds_the_cache_to_the_session_in_place(distilled_pair, onnx_export):
    from dspark_trt.runtime import HFTarget, SpeculativeDecoder
    from dspark_trt.runtime.drafters.onnxruntime import OnnxRuntimeDrafterBackend

    target = HFTarget.from_pretrained(distilled_pair.target, dtype="fp32", device="cpu")
    backend = OnnxRuntimeDrafterBackend(onnx_export(distilled_pair, "fp32", 16), threads=1)
    decoder = SpeculativeDecoder(target, backend)
    ps = prompts(decoder)
    base = decoder.generate(ps, NEW, draft=False)
    backend.activate()
    session = backend._graph("draft").session
    fed, run = [], session.run

    def recording_run(names, arrays, *rest):  # the arrays onnxruntime gets: their memory addresses
        fed.append({k: a.__array_interface__["data"][0] for k, a in arrays.items() if k.startswith("ctx_")})
        return run(names, arrays, *rest)

    session.run = recording_run
    recorder = DraftRecorder(backend)
    try:
        spec = decoder.generate(ps, NEW, topk=16)
    finally:
        recorder.close()
        del session.run
    assert spec.tokens == base.tokens and spec.stats.accepted > 0
    check_rounds(recorder.rounds)
    L = decoder.config.num_hidden_layers
    assert len(fed) == len(recorder.rounds)
    for arrays, r in zip(fed, recorder.rounds):
        assert [arrays[f"ctx_key_{i}"] for i in range(L)] == r["layer_ptrs"]  # the cache's memory, not a copy


@pytest.mark.onnx
def test_an_export_of_an_older_context_interface_is_refused_in_one_line(tmp_path):
    from dspark_trt.errors import DSparkTrtError
    from dspark_trt.artifact.drafter_io import check_draft_interface, draft_input_names

    check_draft_interface(draft_input_names(1), "x")
    with pytest.raises(DSparkTrtError, match=r"stacked ctx_k .*re-export the drafter") as e:
        check_draft_interface(["anchor", "ctx_k", "ctx_v", "ctx_len", "temperature", "seed"], "OUT")
    assert "\n" not in str(e.value)
    with pytest.raises(DSparkTrtError, match=r"without ctx_start .*re-export the drafter") as e:  # v1: no offset
        check_draft_interface(["anchor", "ctx_key_0", "ctx_value_0", "ctx_len", "temperature", "seed"], "OUT")
    assert "\n" not in str(e.value)
