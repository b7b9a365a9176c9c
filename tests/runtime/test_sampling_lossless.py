"""Lossless sampling: at T = 1 the tokens emitted with speculation follow the target's distribution exactly.

Small vocabulary (37), one prompt, thousands of requests with their own seeds, three new tokens each: the
empirical joint distributions of (x_P, x_P+1) and (x_P+1, x_P+2) are compared by chi-square with the exact
ones computed from the target (p(y) p(x|y) p(z|y,x), batched forwards). x_P comes from the prefill; x_P+1
and x_P+2 from verification rounds (accepted drafts, residual draws and bonus tokens). The same test with a deliberately wrong draft
distribution handed to the verifier (q at twice the temperature) must fail — so the test can fail.

With top-k / top-p the same test runs against the exact marginals of the *truncated* target (each step's
distribution truncated and renormalised by ``tests.helpers.truncate_probs``, an independent brute-force
reading of the definition), and a verifier that ignores the truncation must fail it.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import truncate_probs
from tests.runtime.runtime_helpers import make_decoder

scipy_stats = pytest.importorskip("scipy.stats")

PROMPT = [17, 9, 3, 25]
REQUESTS = 3000


@pytest.fixture(scope="module")
def decoder(small_vocab_pair):
    return make_decoder(small_vocab_pair)


@pytest.fixture(scope="module")
def exact_joint(decoder):
    return target_joint(decoder)


def target_joint(decoder, top_k: int = 0, top_p: float = 1.0):
    """[V, V, V] fp64: exact target probability of the first three new tokens at T = 1 (truncated by top-k /
    top-p at every step when given)."""
    model, V = decoder.target.model, decoder.target.vocab_size
    cut = (lambda p: truncate_probs(p, top_k, top_p)) if top_k or top_p < 1 else (lambda p: p)  # noqa: E731
    with torch.no_grad():
        p0 = cut(torch.softmax(model(torch.tensor([PROMPT])).logits[0, -1].double(), -1))  # [V]
        one = torch.tensor([PROMPT + [y] for y in range(V)])
        p1 = cut(torch.softmax(model(one).logits[:, -1].double(), -1))  # [V(y), V(x)]
        two = torch.tensor([PROMPT + [y, x] for y in range(V) for x in range(V)])
        p2 = cut(torch.softmax(model(two).logits[:, -1].double(), -1)).view(V, V, V)  # [y, x, z]
    return p0.view(V, 1, 1) * p1.view(V, V, 1) * p2


def chi_square_pvalues(tokens: list[list[int]], joint: torch.Tensor) -> list[float]:
    """p-values for (x_P, x_P+1) and (x_P+1, x_P+2) against ``joint`` [V, V, V]; cells expecting < 5 pooled."""
    V = joint.shape[0]
    t = torch.tensor(tokens)[:, :3]
    out = []
    for (a, b), expected in (((0, 1), joint.sum(2)), ((1, 2), joint.sum(0))):
        counts = torch.bincount(t[:, a] * V + t[:, b], minlength=V * V).double()
        e = expected.flatten() * len(tokens)
        if counts[e == 0].sum() > 0:  # a pair the (truncated) target cannot produce
            out.append(0.0)
            continue
        big = e >= 5
        assert big.sum() > 20, "too few cells for a meaningful test"
        small = ~big & (e > 0)  # pooled; impossible pairs were checked above
        obs = torch.cat((counts[big], counts[small].sum().view(1)))
        exp = torch.cat((e[big], e[small].sum().view(1)))
        if exp[-1] == 0:
            obs, exp = obs[:-1], exp[:-1]
        out.append(float(scipy_stats.chisquare(obs.numpy(), exp.numpy()).pvalue))
    return out


def run(decoder, topk, **options):
    return decoder.generate([PROMPT] * REQUESTS, 3, temperature=1.0, seed=list(range(REQUESTS)), topk=topk,
                            eos_token_id=[], **options)


@pytest.mark.parametrize("topk, options", [(None, {}), (4, {}), (None, {"confidence_threshold": 0.5}),
                                           (2, {"markov_topm": 3}), (4, {"verify_drafts": 1})],
                         ids=["dense", "top4", "dense-confidence-truncated", "top2-union3", "top4-verify-1"])
def test_speculative_sampling_matches_the_target_distribution(decoder, exact_joint, topk, options):
    out = run(decoder, topk, **options)
    assert out.stats.accepted > 0.2 * out.stats.rounds  # drafts are really accepted, not only corrected
    if "confidence_threshold" in options:
        assert out.stats.drafted < out.stats.rounds * decoder.config.num_draft_tokens  # truncation happened
    assert min(chi_square_pvalues(out.tokens, exact_joint)) > 1e-4


@pytest.mark.parametrize("topk, options", [(None, {}), (3, {}), (2, {"markov_topm": 4})],
                         ids=["dense", "top3", "top2-union4"])
def test_reduced_draft_vocabulary_sampling_is_lossless(small_vocab_reduced_pair, topk, options):
    """d2t: candidates are draft ids; the verifier must see them as target ids."""
    dec = make_decoder(small_vocab_reduced_pair)
    assert dec.config.has_reduced_vocab
    out = run(dec, topk, **options)
    assert out.stats.accepted > 0.2 * out.stats.rounds
    assert min(chi_square_pvalues(out.tokens, target_joint(dec))) > 1e-4


@pytest.mark.parametrize("topk, options", [(None, {}), (4, {}), (2, {"markov_topm": 3})],
                         ids=["dense", "top4", "top2-union3"])
def test_a_wrong_draft_distribution_fails_the_same_test(decoder, exact_joint, topk, options, monkeypatch):
    import dspark_trt.runtime.round as round_module
    from dspark_trt.reference.verify import draft_probs

    def wrong_q(cand_logits, cand_ids, tokens, temperature):  # drafts were sampled at T, verified as if at 2T
        return draft_probs(cand_logits, cand_ids, tokens, temperature * 2)

    monkeypatch.setattr(round_module, "draft_probs", wrong_q)
    out = run(decoder, topk, **options)
    assert min(chi_square_pvalues(out.tokens, exact_joint)) < 1e-6


@pytest.mark.parametrize("head, topk", [("gated", 4), ("rnn", None)], ids=["gated-top4", "rnn-dense"])
def test_gated_and_rnn_heads_sample_losslessly(request, head, topk):
    """The gated / RNN head's walk logits are what the verifier reads as q (rnn: bonus-anchor layout)."""
    dec = make_decoder(request.getfixturevalue(f"small_vocab_{head}_pair"))
    assert dec.config.markov_head_type == head
    out = run(dec, topk)
    assert out.stats.accepted > 0.2 * out.stats.rounds
    assert min(chi_square_pvalues(out.tokens, target_joint(dec))) > 1e-4


def test_a_verifier_that_reads_the_vanilla_logits_of_an_rnn_head_fails(small_vocab_rnn_pair):
    """The same test can fail for a head: drafts walked with the RNN head, q read off the vanilla walk's logits."""
    from dspark_trt.reference.markov import walk_candidates
    from dspark_trt.runtime import HFTarget, SpeculativeDecoder
    from dspark_trt.runtime.drafters.torch import TorchDrafterBackend

    def vanilla_q(*args, head=None, **kwargs):
        res = walk_candidates(*args, head=head, **kwargs)
        res.cand_logits = walk_candidates(*args, **kwargs).cand_logits
        return res

    pair = small_vocab_rnn_pair
    backend = TorchDrafterBackend.from_pretrained(pair.drafter, target_dir=pair.target, dtype="fp32", device="cpu",
                                                  walk_fn=vanilla_q)
    dec = SpeculativeDecoder(HFTarget.from_pretrained(pair.target, dtype="fp32", device="cpu"), backend)
    out = run(dec, None)
    assert min(chi_square_pvalues(out.tokens, target_joint(dec))) < 1e-6


@pytest.mark.parametrize("head", ["gated", "rnn"])
def test_gated_and_rnn_heads_greedy_equal_the_target_alone(request, head):
    from tests.runtime.runtime_helpers import random_prompts

    dec = make_decoder(request.getfixturevalue(f"small_vocab_{head}_pair"))
    prompts = random_prompts(6, 37, seed=1, avoid=(dec.config.mask_token_id,))
    for topk in (None, 3):
        spec = dec.generate(prompts, 12, eos_token_id=[], topk=topk)
        assert spec.stats.accepted > 0.2 * spec.stats.rounds
        assert spec.tokens == dec.generate(prompts, 12, eos_token_id=[], draft=False).tokens


def test_target_only_sampling_matches_the_target_distribution(decoder, exact_joint):
    out = decoder.generate([PROMPT] * REQUESTS, 3, temperature=1.0, seed=list(range(REQUESTS)), draft=False,
                           eos_token_id=[])
    assert min(chi_square_pvalues(out.tokens, exact_joint)) > 1e-4


TRUNCATIONS = [(8, 1.0), (0, 0.6), (12, 0.7)]


@pytest.mark.parametrize("top_k, top_p", TRUNCATIONS, ids=["top_k8", "top_p0.6", "top_k12-top_p0.7"])
@pytest.mark.parametrize("topk", [None, 4], ids=["dense", "top4"])
def test_truncated_sampling_matches_the_truncated_target(decoder, topk, top_k, top_p):
    joint = target_joint(decoder, top_k, top_p)
    out = run(decoder, topk, top_k=top_k, top_p=top_p)
    assert out.stats.accepted > 0.2 * out.stats.rounds
    assert min(chi_square_pvalues(out.tokens, joint)) > 1e-4


def test_a_verifier_that_ignores_the_truncation_fails_the_same_test(decoder, monkeypatch):
    import dspark_trt.runtime.round as round_module
    from dspark_trt.reference.verify import verify_drafts

    def untruncated(*args, top_k=None, top_p=None, **kwargs):  # accepts against the full target distribution
        return verify_drafts(*args, **kwargs)

    monkeypatch.setattr(round_module, "verify_drafts", untruncated)
    out = run(decoder, 4, top_k=8, top_p=0.9)
    assert min(chi_square_pvalues(out.tokens, target_joint(decoder, 8, 0.9))) < 1e-6


def test_target_only_truncated_sampling_matches_the_truncated_target(decoder):
    out = decoder.generate([PROMPT] * REQUESTS, 3, temperature=1.0, seed=list(range(REQUESTS)), draft=False,
                           eos_token_id=[], top_k=10, top_p=0.8)
    assert min(chi_square_pvalues(out.tokens, target_joint(decoder, 10, 0.8))) > 1e-4
