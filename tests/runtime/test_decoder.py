"""SpeculativeDecoder: lossless greedy decoding, acceptance paths, cache rollback, stats, batching."""

from __future__ import annotations

import pytest
import torch

from tests.runtime.runtime_helpers import make_decoder, random_prompts
from dspark_trt.errors import DSparkTrtError
from dspark_trt.runtime import SpeculativeDecoder
from dspark_trt.runtime.drafters.torch import TorchDrafterBackend
from tests.runtime.scripted_drafter import ScriptedDrafterBackend

MASK = 256  # mask token of the vocabulary-257 distilled pairs


def prompts_for(decoder, n, seed, **kw):
    return random_prompts(n, decoder.target.vocab_size, seed=seed, avoid=(decoder.config.mask_token_id,), **kw)


# -- lossless greedy -------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch", [1, 3, 5])
@pytest.mark.parametrize("topk", [None, 1, 16, 257], ids=["dense", "k1", "k16", "kV"])
def test_greedy_speculation_equals_target_only_greedy(distilled_decoder, batch, topk):
    prompts = prompts_for(distilled_decoder, batch, seed=batch * 31 + (topk or 0))
    spec = distilled_decoder.generate(prompts, 24, topk=topk)
    base = distilled_decoder.generate(prompts, 24, draft=False)
    assert spec.tokens == base.tokens
    assert all(len(t) == 24 for t in spec.tokens)
    if topk != 1:  # k = 1 drafts only the base argmax: acceptance may legitimately vanish
        assert spec.stats.accepted > 0  # the acceptance path was taken, not only corrections


@pytest.mark.parametrize("batch", [3, 5])
def test_a_padded_backend_drafts_from_the_cache_it_binds(distilled_pair, distilled_decoder, batch):
    """The torch backend's padded path (graphs="eager": CUDA graphs' bucketing without capture): the decoder's
    ``DrafterState`` keeps the batch bucket's rows, every round binds it by address (the copying runner is never
    built), requests leave the batch as they finish, and the output is the target's, token for token."""
    from dspark_trt.runtime.drafters.torch import TorchDrafterBackend

    backend = TorchDrafterBackend.from_pretrained(distilled_pair.drafter, target_dir=distilled_pair.target,
                                                  dtype="fp32", device="cpu", graphs="eager")
    dec = SpeculativeDecoder(distilled_decoder.target, backend)
    prompts = prompts_for(dec, batch, seed=batch + 70)
    spec = dec.generate(prompts, 24, topk=16)
    assert spec.tokens == dec.generate(prompts, 24, draft=False).tokens
    assert spec.stats.accepted > 0 and backend._runner is None
    assert backend._bound_runner is not None


def test_greedy_with_a_random_drafter_is_lossless_too(random_pair):
    decoder = make_decoder(random_pair)
    prompts = prompts_for(decoder, 3, seed=5)
    for topk in (None, "off", 512):
        assert decoder.generate(prompts, 16, topk=topk).tokens == decoder.generate(prompts, 16, draft=False).tokens


@pytest.mark.parametrize("topk, topm", [(1, 4), (16, 8), (4, 257)], ids=["k1m4", "k16m8", "k4mV"])
def test_greedy_speculation_with_the_candidate_union_equals_target_only_greedy(distilled_decoder, topk, topm):
    prompts = prompts_for(distilled_decoder, 3, seed=topk + topm)
    spec = distilled_decoder.generate(prompts, 24, topk=topk, markov_topm=topm)
    assert spec.tokens == distilled_decoder.generate(prompts, 24, draft=False).tokens
    assert spec.stats.accepted > 0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_markov_topm_zero_is_todays_top_k(distilled_decoder, temperature):
    prompts = prompts_for(distilled_decoder, 3, seed=41)
    plain = distilled_decoder.generate(prompts, 16, topk=8, temperature=temperature, seed=2)
    zero = distilled_decoder.generate(prompts, 16, topk=8, temperature=temperature, seed=2, markov_topm=0)
    assert zero.tokens == plain.tokens and zero.stats.accepted == plain.stats.accepted


def test_the_union_with_a_scripted_backend_is_refused(distilled_decoder):
    backend = ScriptedDrafterBackend(distilled_decoder.config, [[1] * distilled_decoder.config.num_draft_tokens])
    dec = SpeculativeDecoder(distilled_decoder.target, backend)
    with pytest.raises(DSparkTrtError, match="backend has no candidate union yet; use --backend torch"):
        dec.generate([[1, 2]], 4, topk=4, markov_topm=2)


# -- acceptance paths with a scripted drafter --------------------------------------------------------------
@pytest.fixture(scope="module")
def scripted_setup(distilled_pair):
    decoder = make_decoder(distilled_pair)
    prompts = prompts_for(decoder, 3, seed=11, min_len=3, max_len=9)
    N = decoder.config.num_draft_tokens
    reference = decoder.generate(prompts, 40 + N + 1, draft=False).tokens
    full = [p + r for p, r in zip(prompts, reference)]
    return decoder, prompts, reference, full


PLANS = {
    "accept-all": lambda request, position: False,
    "accept-none": lambda request, position: True,
    "partial": lambda request, position: (position * 7 + request) % 5 == 0,
}


@pytest.mark.parametrize("plan", list(PLANS))
def test_scripted_acceptance_paths(scripted_setup, plan):
    decoder, prompts, reference, full = scripted_setup
    N = decoder.config.num_draft_tokens
    scripted = ScriptedDrafterBackend(decoder.config, full, wrong=PLANS[plan])
    out = SpeculativeDecoder(decoder.target, scripted).generate(prompts, 40)
    assert out.tokens == [r[:40] for r in reference]  # anchors never drifted: the target cache rolled back
    pairs = scripted.observed_rounds()
    assert pairs and all(expected == actual for expected, actual in pairs)
    actual = {a for _, a in pairs}
    if plan == "accept-all":
        assert actual == {N} and out.stats.mean_acceptance_length > N
    elif plan == "accept-none":
        assert actual == {0} and out.stats.accepted == 0
    else:
        assert {0, N} < actual | {0, N} and any(0 < a < N for a in actual)


def test_scripted_confidence_truncation_verifies_only_the_confident_prefix(scripted_setup):
    decoder, prompts, reference, full = scripted_setup
    N = decoder.config.num_draft_tokens
    # every draft is right, but confidence drops below the threshold from the 3rd slot on
    scripted = ScriptedDrafterBackend(decoder.config, full, confidence=lambda r, pos: 0.9 if pos % N else 0.1)
    out = SpeculativeDecoder(decoder.target, scripted).generate(prompts, 40, confidence_threshold=0.5)
    assert out.tokens == [r[:40] for r in reference]
    assert out.stats.drafted < out.stats.rounds * N  # truncated
    assert out.stats.accepted == out.stats.drafted  # everything shown was right, so all accepted
    counted = sum(1 for r in scripted.rounds)
    assert out.stats.rounds == counted


@pytest.mark.parametrize("cap", [1, 2])
def test_verify_drafts_caps_the_drafts_verified_per_round(scripted_setup, cap):
    decoder, prompts, reference, full = scripted_setup
    scripted = ScriptedDrafterBackend(decoder.config, full, wrong=PLANS["accept-all"])  # every draft is right
    out = SpeculativeDecoder(decoder.target, scripted).generate(prompts, 40, verify_drafts=cap)
    assert out.tokens == [r[:40] for r in reference]
    assert out.stats.drafted == out.stats.rounds * cap and out.stats.accepted == out.stats.drafted
    assert out.stats.per_position_acceptance[cap:] == [0.0] * (decoder.config.num_draft_tokens - cap)
    uncapped = SpeculativeDecoder(decoder.target, scripted).generate(prompts, 40,
                                                                     verify_drafts=decoder.config.num_draft_tokens)
    assert uncapped.stats.drafted == uncapped.stats.rounds * decoder.config.num_draft_tokens  # N: all of them


# -- a distilled drafter: acceptance really happens, and both caches roll back -----------------------------
class SpyBackend(TorchDrafterBackend):
    """The torch backend, recording every draft call's inputs with the request index of each row."""

    def __init__(self, drafter):
        super().__init__(drafter)
        self.active, self.calls = [], []

    def set_active_requests(self, requests):
        self.active = list(requests)

    def draft(self, anchor, ctx_k, ctx_v, ctx_len, **kw):
        self.calls.append((list(self.active), anchor.clone(), ctx_k.clone(), ctx_v.clone(), ctx_len.clone()))
        return super().draft(anchor, ctx_k, ctx_v, ctx_len, **kw)


def test_distilled_drafter_accepts_and_both_caches_roll_back(distilled_decoder):
    dec = distilled_decoder
    spy = SpyBackend(dec.backend.drafter)
    prompts = prompts_for(dec, 3, seed=21, min_len=2, max_len=10)
    out = SpeculativeDecoder(dec.target, spy).generate(prompts, 30)
    assert out.tokens == dec.generate(prompts, 30, draft=False).tokens
    assert out.stats.mean_acceptance_length > 1.5

    # acceptance per round from consecutive anchor positions: zero, partial (and usually full) all occur
    last, accepted = {}, []
    for rows, _, _, _, ctx_len in spy.calls:
        for r, p in zip(rows, ctx_len.tolist()):
            if r in last:
                accepted.append(p - last[r] - 1)
            last[r] = p
    N = dec.config.num_draft_tokens
    assert 0 in accepted and any(0 < a < N for a in accepted)

    # drafter cache: what the runtime handed over equals the context K/V recomputed from scratch
    drafter, model = dec.backend.drafter, dec.target.model
    full = [p + t for p, t in zip(prompts, out.tokens)]
    fresh = {}
    with torch.no_grad():
        for r, seq in enumerate(full):
            hs = model(torch.tensor([seq]), output_hidden_states=True).hidden_states
            taps = torch.cat([hs[i] for i in dec.config.hf_hidden_state_indices], dim=-1)
            fresh[r] = drafter.context_kv(taps, torch.arange(len(seq)).view(1, -1))
    for rows, anchor, ctx_k, ctx_v, ctx_len in spy.calls:
        for b, r in enumerate(rows):
            p = int(ctx_len[b])
            assert int(anchor[b]) == full[r][p]  # the anchor is the token at the anchor position
            k, v = fresh[r]
            torch.testing.assert_close(ctx_k[:, b, :p], k[:, 0, :p], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(ctx_v[:, b, :p], v[:, 0, :p], atol=1e-4, rtol=1e-4)


def test_cache_compaction_changes_nothing(distilled_pair, distilled_decoder):
    compacting = make_decoder(distilled_pair, compact_ratio=1.0)  # compact whenever a hole exists
    prompts = prompts_for(distilled_decoder, 4, seed=41)
    a = compacting.generate(prompts, 30)
    assert a.tokens == distilled_decoder.generate(prompts, 30).tokens
    assert a.tokens == distilled_decoder.generate(prompts, 30, draft=False).tokens


# -- layouts ------------------------------------------------------------------------------------------------
def test_layouts_feed_the_drafter_per_spec(distilled_pair, distilled_bonus_pair):
    """Both layouts: every round's draft equals the reference drafter on a context recomputed from scratch
    (anchor = the token at position p, context = positions 0 … p-1), with N from the layout."""
    for pair, n in ((distilled_pair, 7), (distilled_bonus_pair, 6)):
        dec = make_decoder(pair)
        assert dec.config.num_draft_tokens == n
        spy = SpyBackend(dec.backend.drafter)
        prompts = prompts_for(dec, 2, seed=n)
        out = SpeculativeDecoder(dec.target, spy).generate(prompts, 12)
        assert out.tokens == dec.generate(prompts, 12, draft=False).tokens
        full = [p + t for p, t in zip(prompts, out.tokens)]
        for rows, anchor, ctx_k, ctx_v, ctx_len in spy.calls:
            for b, r in enumerate(rows):
                p = int(ctx_len[b])
                with torch.no_grad():
                    hs = dec.target.model(torch.tensor([full[r][:p]]), output_hidden_states=True).hidden_states
                    taps = torch.cat([hs[i] for i in dec.config.hf_hidden_state_indices], dim=-1)
                    k, v = spy.drafter.context_kv(taps, torch.arange(p).view(1, -1))
                    want = spy.drafter.draft(torch.tensor([full[r][p]]), k, v, torch.tensor([p]))
                    got = spy.drafter.draft(anchor[b: b + 1], ctx_k[:, b: b + 1], ctx_v[:, b: b + 1], ctx_len[b: b + 1])
                assert got.tokens.shape == (1, n)
                assert torch.equal(got.tokens, want.tokens)


@pytest.mark.parametrize("fixture", ["distilled_pair", "distilled_bonus_pair"])
def test_layout_mix_up_loses_acceptance(request, fixture):
    """A drafter run with the other layout than it was trained for (the silent ~1.1 failure) accepts less."""
    dec = make_decoder(request.getfixturevalue(fixture))
    prompts = prompts_for(dec, 6, seed=3)
    right = dec.generate(prompts, 40)
    drafter = dec.backend.drafter
    drafter.config = drafter.config.replace(sample_from_anchor=not drafter.config.sample_from_anchor)
    wrong = SpeculativeDecoder(dec.target, TorchDrafterBackend(drafter)).generate(prompts, 40)
    assert wrong.tokens == right.tokens  # still lossless ...
    if fixture == "distilled_pair":
        assert right.stats.mean_acceptance_length > 1.5
        assert wrong.stats.mean_acceptance_length < 0.8 * right.stats.mean_acceptance_length  # ... but worse
    else:  # see the report: on this bigram-like target the anchor slot alone predicts well
        assert right.stats.mean_acceptance_length > 1.3
        assert wrong.stats.mean_acceptance_length != pytest.approx(right.stats.mean_acceptance_length)


# -- stats ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_stats_are_consistent(distilled_decoder, temperature):
    prompts = prompts_for(distilled_decoder, 4, seed=51)
    eos = distilled_decoder.generate(prompts, 12, draft=False).tokens[1][5]  # request 1 stops early
    s = distilled_decoder.generate(prompts, 30, temperature=temperature, seed=[1, 2, 3, 4], eos_token_id=[eos]).stats
    N = s.num_draft_tokens
    assert s.requests == 4 and 0 <= s.accepted <= s.drafted <= s.rounds * N
    assert 1.0 <= s.mean_acceptance_length <= N + 1
    assert sum(s.drafted_at) == s.drafted and sum(s.accepted_at) == s.accepted
    assert all(0.0 <= a <= 1.0 for a in s.per_position_acceptance)
    assert s.accepted_at == sorted(s.accepted_at, reverse=True)  # slot j accepted ⇒ all slots before it
    assert s.generated_tokens <= s.requests + s.accepted + s.rounds  # +1 token per request from the prefill
    if temperature == 0.0:
        assert s.generated_tokens < 4 * 30  # the EOS cut
    parts = s.prefill_seconds + s.draft_seconds + s.verify_seconds + s.other_seconds
    assert 0 < parts <= s.total_seconds * 1.001 and s.tokens_per_second > 0
    d = s.to_dict()
    assert d["mean_acceptance_length"] == s.mean_acceptance_length and len(d["per_position_acceptance"]) == N


def test_stats_add_up_without_eos(distilled_decoder):
    prompts = prompts_for(distilled_decoder, 3, seed=61)
    s = distilled_decoder.generate(prompts, 25, eos_token_id=[]).stats
    N = s.num_draft_tokens
    assert s.generated_tokens == 3 * 25
    # each request emits 1 (prefill) + Σ (accepted + 1) tokens; only its last round may overshoot, by ≤ N
    overshoot = s.requests + s.accepted + s.rounds - s.generated_tokens
    assert 0 <= overshoot <= s.requests * N
    assert s.drafted == s.rounds * N  # no confidence threshold: every round verifies N drafts
    assert s.steps <= s.rounds


# -- batching --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_batch_gives_the_same_tokens_as_each_request_alone(distilled_decoder, temperature):
    dec = distilled_decoder
    prompts = prompts_for(dec, 4, seed=71, min_len=1, max_len=14)
    seeds = [5, 6, 7, 8]
    alone_first = [dec.generate([p], 20, temperature=temperature, seed=s).tokens[0] for p, s in zip(prompts, seeds)]
    eos = alone_first[2][3]  # request 2 stops after 4 tokens; others may stop too, at their own points
    batch = dec.generate(prompts, 20, temperature=temperature, seed=seeds, eos_token_id=[eos])
    alone = [dec.generate([p], 20, temperature=temperature, seed=s, eos_token_id=[eos]).tokens[0]
             for p, s in zip(prompts, seeds)]
    assert batch.tokens == alone
    assert len(batch.tokens[2]) <= 4 and batch.tokens[2][-1] == eos
    assert len({len(t) for t in batch.tokens}) > 1  # different stop points


def test_sampling_is_reproducible_and_seed_dependent(distilled_decoder):
    prompts = prompts_for(distilled_decoder, 2, seed=81)
    a = distilled_decoder.generate(prompts, 16, temperature=1.0, seed=3)
    b = distilled_decoder.generate(prompts, 16, temperature=1.0, seed=3)
    c = distilled_decoder.generate(prompts, 16, temperature=1.0, seed=4)
    assert a.tokens == b.tokens and a.tokens != c.tokens


# -- bad input ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("inputs, kwargs, message", [
    ([[]], {}, "prompt 0 is empty"),
    ([[1, 2], [3, 257]], {}, "prompt 1 has token id 257 outside the target vocabulary [0, 257)"),
    ([[1, -1]], {}, "token id -1 outside"),
    ([], {}, "no prompts given"),
    ("hello", {}, "text prompts need a tokenizer"),
    ([[1, 2]], {"max_new_tokens": 0}, "max_new_tokens must be >= 1"),
    ([[1, 2]], {"temperature": -1.0}, "temperature must be finite and >= 0"),
    ([[1, 2]], {"seed": -3}, "seed must be >= 0"),
    ([[1, 2]], {"topk": 258}, "top-k 258 must be in [1, draft_vocab_size=257]"),
    ([[1, 2]], {"seed": [1, 2]}, "seed has 2 values for 1 requests"),
    ([[1, 2]], {"confidence_threshold": 1.5}, "confidence_threshold must be in [0, 1]"),
    ([[1, 2]], {"verify_drafts": 0}, "verify_drafts must be an integer in 1 …"),
    ([[1, 2]], {"verify_drafts": 99}, "verify_drafts must be an integer in 1 …"),
    ([[1, 2]], {"verify_drafts": 1.5}, "verify_drafts must be an integer in 1 …"),
    ([[1, 2]], {"topk": 4, "markov_topm": 258}, "--markov-topm 258 must be in [0, draft_vocab_size=257]"),
    ([[1, 2]], {"topk": None, "markov_topm": 2}, "--markov-topm needs a top-k head"),
    ([[1, 2]], {"topk": 0}, "--topk 0: use an integer K >= 1 (candidates per draft slot) or 'off'"),
])
def test_bad_requests_raise_one_line_errors(distilled_decoder, inputs, kwargs, message):
    with pytest.raises(DSparkTrtError) as e:
        distilled_decoder.generate(inputs, **{"max_new_tokens": 4, **kwargs})
    assert message in str(e.value) and "\n" not in str(e.value)


def test_speculators_format_with_reduced_vocab_through_from_pretrained(tmp_path):
    from dspark_trt.synthetic import write_tiny_checkpoint

    pair = write_tiny_checkpoint(tmp_path / "spec", format="speculators", vocab_size=301, draft_vocab_size=200,
                                 seed=5)
    dec = SpeculativeDecoder.from_pretrained(pair.drafter, pair.target, device="cpu")
    assert dec.config.source_format == "speculators" and dec.backend.d2t is not None and dec.tokenizer is None
    prompts = [[1, 2, 3], [250, 7]]
    assert dec.generate(prompts, 12, topk=50).tokens == dec.generate(prompts, 12, draft=False).tokens
    sampled = dec.generate(prompts, 12, temperature=0.8, seed=[3, 4])
    assert all(0 <= t < 301 for row in sampled.tokens for t in row)


def test_causal_windowed_speculators_drafter_is_lossless(tiny_causal_pair):
    """A drafter with speculators' causal sliding-window layer: greedy speculation = the target alone, over
    contexts longer than the window; the recorded verifier is the default target."""
    from tests.runtime.runtime_helpers import make_decoder, random_prompts

    dec = make_decoder(tiny_causal_pair)
    assert dec.config.layer_attention(0) == (4, True)
    prompts = random_prompts(2, 2499, seed=6, min_len=6, max_len=9)
    assert dec.generate(prompts, 10, topk=16).tokens == dec.generate(prompts, 10, draft=False).tokens
    default = SpeculativeDecoder.from_pretrained(tiny_causal_pair.drafter, None, device="cpu", dtype="fp32")
    assert default.generate(prompts, 10, topk=16).tokens == dec.generate(prompts, 10, draft=False).tokens


def test_context_window_drafter_is_lossless(tiny_windowed_pair):
    """The recipe's context window (every layer reads the last 4 context rows here, bidirectional in the block):
    greedy speculation = the target alone over contexts several windows long (that the window changes the drafts
    is tests/export/test_graphs.py's)."""
    from tests.runtime.runtime_helpers import make_decoder, random_prompts

    dec = make_decoder(tiny_windowed_pair)
    assert dec.config.layer_attention(0) == (4, False)
    prompts = random_prompts(2, 2499, seed=7, min_len=9, max_len=14)
    spec = dec.generate(prompts, 12, topk=16)
    assert spec.stats.rounds > 0 and spec.tokens == dec.generate(prompts, 12, draft=False).tokens


def _recorded_drafts(dec, prompts, monkeypatch, *, sliding: bool, **options):
    """Tokens, and every round's draft tokens, of ``dec.generate`` with the drafter's cache sliding or whole."""
    from dspark_trt.config import DSparkConfig
    from dspark_trt.runtime.drafter_state import DrafterState

    if not sliding:  # the cache every drafter had before: every context row, the window applied by the mask alone
        monkeypatch.setattr(DSparkConfig, "context_window", property(lambda self: None))
    slides, drafts, rows = [], [], []
    slide, draft, context_kv = DrafterState._slide, dec.backend.draft, dec.backend.context_kv
    monkeypatch.setattr(DrafterState, "_slide", lambda self, n: slides.append(n.tolist()) or slide(self, n))

    def recorded(*args, **kwargs):
        result = draft(*args, **kwargs)
        drafts.append(result.tokens.tolist())
        return result

    monkeypatch.setattr(dec.backend, "draft", recorded)
    monkeypatch.setattr(dec.backend, "context_kv",
                        lambda taps, pos: rows.append(pos[0].tolist()) or context_kv(taps, pos))
    out = dec.generate(prompts, **options)
    monkeypatch.undo()
    return out.tokens, drafts, (slides, rows[0])


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_a_sliding_drafter_cache_drafts_what_the_whole_cache_drafts(tiny_windowed_pair, monkeypatch, sampled,
                                                                     backend, request):
    """Past ``most`` = bucket(W + W/2) = 128 context rows the windowed drafter's cache slides (keeps its last W
    rows, ``ctx_start`` the offset): every round drafts exactly what the cache holding every row drafts, for
    two requests of different lengths, greedy and sampled, in the reference (torch) and through the exported
    draft graph (onnxruntime); the output is the target's (lossless)."""
    from tests.runtime.runtime_helpers import make_decoder, random_prompts

    dec = make_decoder(tiny_windowed_pair)
    if backend == "onnxruntime":
        from dspark_trt.runtime.drafters.onnxruntime import OnnxRuntimeDrafterBackend

        dec = SpeculativeDecoder(dec.target, OnnxRuntimeDrafterBackend.from_pretrained(
            tiny_windowed_pair.drafter, target_dir=tiny_windowed_pair.target, dtype="fp32", topk=16,
            cache_dir=request.getfixturevalue("onnx_cache_dir")))
    prompts = (random_prompts(1, 2499, seed=8, min_len=40, max_len=40)
               + random_prompts(1, 2499, seed=9, min_len=150, max_len=150))  # the longer one's rows slide
    options = dict(max_new_tokens=48, topk=16, **({"temperature": 0.8, "seed": 3} if sampled else {}))
    tokens, drafts, (slides, prefill) = _recorded_drafts(dec, prompts, monkeypatch, sliding=True, **options)
    whole_tokens, whole_drafts, (none, whole) = _recorded_drafts(dec, prompts, monkeypatch, sliding=False, **options)
    assert slides and not none  # the cache slid (the prompts alone pass 128 rows, or rounds take them there)
    shortest, longest = min(map(len, prompts)), max(map(len, prompts))
    assert whole == list(range(longest))  # the prefill's context K/V: every prompt row …
    assert prefill == list(range(shortest - 4, longest))  # … or, sliding, from the shortest prompt's window on
    assert len(drafts) > 5 and drafts == whole_drafts and tokens == whole_tokens
    if not sampled:
        assert tokens == dec.generate(prompts, 48, draft=False).tokens


# -- the KV bound of an export ------------------------------------------------------------------------------------
def bounded_decoder(export, bound):
    """The export's decoder (onnxruntime target + drafter) with both graphs' KV bound set to ``bound`` (None: the
    target unbounded, the drafter's bound far away)."""
    dec = SpeculativeDecoder.from_export(export, backend="onnxruntime", device="cpu", threads=1)
    dec.target.max_context, dec.backend.max_context = bound, bound or 1 << 30
    return dec


@pytest.mark.onnx
@pytest.mark.slow  # the qwen3 export (shared with other tests)
def test_a_request_past_the_kv_bound_is_refused_before_anything_runs(qwen3_topk_export):
    dec = bounded_decoder(qwen3_topk_export, 32)
    calls = []
    prefill = dec.target.prefill
    dec.target.prefill = lambda prompts: calls.append(len(prompts)) or prefill(prompts)
    assert dec.max_context == 32
    with pytest.raises(DSparkTrtError) as e:
        dec.generate([[5, 6, 7] * 3, [1, 2]], max_new_tokens=24)  # 9 + 24 > 32
    message = str(e.value)
    assert "\n" not in message
    assert "prompt (9 tokens) + max_new_tokens (24) exceeds the model's context of 32" in message
    assert "at most 23 new tokens" in message and calls == []  # refused before the prefill
    with pytest.raises(DSparkTrtError, match="exceeds the model's context of 32"):
        dec.check_context([[5] * 20], 13)  # the CLI and the benchmark check every chunk up front with this
    dec.check_context([[5] * 20], 12)  # exactly at the bound: fine


@pytest.mark.onnx
@pytest.mark.slow
@pytest.mark.parametrize("prompts", [[list(range(5, 15))], [list(range(5, 15)), [42, 7]]],
                         ids=["one", "two-with-holes"])
def test_requests_up_to_the_kv_bound_finish_with_the_unbounded_tokens(qwen3_topk_export, prompts):
    """prompt + max_new_tokens = the bound: the last rounds verify fewer drafts (and holes are compacted) instead of
    asking for more KV slots than the graphs have; the tokens are those of an unbounded run (lossless)."""
    new = 32 - len(prompts[0])
    want = bounded_decoder(qwen3_topk_export, None).generate(prompts, new, eos_token_id=[])
    got = bounded_decoder(qwen3_topk_export, 32).generate(prompts, new, eos_token_id=[])
    assert got.tokens == want.tokens and all(len(t) == new for t in got.tokens)
    assert got.stats.rounds > 0
