"""Drafters written by vLLM's speculators (its own ``from_training_args`` + ``save_pretrained``) load into the
reference and draft what speculators' own ``forward`` computes: one greedy round, per attention pattern and per
Markov head (vanilla, gated, rnn: speculators' ``MarkovHead.block_bias`` over the whole query block, the
bonus-anchor layout's anchor slot included).

speculators pins an older transformers than this project installs, so these tests run in their own venv in CI
(``.ci/run``: ``.venv-interop``); elsewhere they are skipped (marker ``speculators``).

One round in speculators' training ``forward``: a packed sequence whose only valid anchor is position ``p`` (the
loss mask), so the query block is ``[x_p, M, …]`` at positions ``p …`` and the context is the taps of positions
``< p`` — exactly the reference's round with ``ctx_len = p``. The block tokens after the anchor are set to the
reference's greedy drafts (teacher forcing), so speculators' Markov bias conditions on the same predecessors;
its Markov-corrected logits and confidence logits are captured from the call to ``compute_metrics``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytestmark = [pytest.mark.speculators, pytest.mark.slow]

P = 9  # context tokens before the anchor
BLOCK = 4
MASK_ID = 2499  # the tiny target's last id
CAPTURE_IDS = [2, 3, 5]  # speculators' aux_hidden_state_layer_ids (DeepSeek ids + 1)


@dataclasses.dataclass(frozen=True)
class Variant:
    full_attention_indices: tuple[int, ...]  # draft layers with full attention; the rest slide
    sliding_window: int
    non_causal: bool | None = None  # None: speculators' default (causal for dspark)
    sample_from_anchor: bool = True
    draft_vocab_size: int | None = None  # reduced vocabulary (t2d/d2t)
    confidence: bool = True
    confidence_markov: bool | None = None  # the confidence head reads W1[prev] too (None: = confidence)
    markov_head_type: str = "vanilla"  # gated / rnn: speculators' MarkovHead.block_bias over the query block


VARIANTS = {
    "bidirectional": Variant(full_attention_indices=(0, 1), sliding_window=2048),
    "defaults-causal": Variant(full_attention_indices=(), sliding_window=2048),  # the training CLI's defaults
    "windowed-mixed-bonus-reduced": Variant(full_attention_indices=(1,), sliding_window=5, sample_from_anchor=False,
                                            draft_vocab_size=600),
    "windowed-noncausal": Variant(full_attention_indices=(), sliding_window=3, non_causal=True, confidence=False),
    # the gated and RNN heads: each in both layouts, with a full and a reduced draft vocabulary, its confidence
    # head with and without the Markov features
    "gated": Variant(full_attention_indices=(0, 1), sliding_window=2048, markov_head_type="gated"),
    "gated-bonus-reduced-conf-hidden-only": Variant(full_attention_indices=(1,), sliding_window=5,
                                                    sample_from_anchor=False, draft_vocab_size=600,
                                                    confidence_markov=False, markov_head_type="gated"),
    "rnn-bonus-reduced": Variant(full_attention_indices=(0, 1), sliding_window=2048, sample_from_anchor=False,
                                 draft_vocab_size=600, markov_head_type="rnn"),
    "rnn-conf-hidden-only": Variant(full_attention_indices=(), sliding_window=3, non_causal=True,
                                    confidence_markov=False, markov_head_type="rnn"),
}


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    from dspark_trt.synthetic import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("interop") / "pair", seed=3).target


def speculators_drafter(target_dir, variant: Variant, out_dir):
    """A DSpark drafter built and saved by speculators' own code, its weights randomised to make the test sharp."""
    from speculators.models.dspark import DSparkDraftModel
    from speculators.train.cli import create_transformer_layer_config

    layer_config = create_transformer_layer_config(
        verifier_name_or_path=str(target_dir), num_layers=2, draft_arch="qwen3", hidden_act=None,
        sliding_window=variant.sliding_window, full_attention_indices=list(variant.full_attention_indices))
    vocab = layer_config.vocab_size
    draft_vocab = variant.draft_vocab_size or vocab
    t2d = d2t = None
    if variant.draft_vocab_size:
        ids = torch.randperm(vocab, generator=torch.Generator().manual_seed(1))[:draft_vocab].sort().values
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[ids] = True
        d2t = ids - torch.arange(draft_vocab)
    kwargs = dict(draft_vocab_size=draft_vocab, verifier_name_or_path=str(target_dir), target_layer_ids=CAPTURE_IDS,
                  mask_token_id=MASK_ID, block_size=BLOCK, markov_rank=16, draft_attn_impl="eager",
                  sample_from_anchor=variant.sample_from_anchor, enable_confidence_head=variant.confidence,
                  confidence_head_with_markov=variant.confidence if variant.confidence_markov is None
                  else variant.confidence_markov, markov_head_type=variant.markov_head_type)
    if variant.non_causal is not None:
        kwargs["sliding_window_non_causal"] = variant.non_causal
    torch.manual_seed(0)
    model = DSparkDraftModel.from_training_args(verifier_config=layer_config, t2d=t2d, d2t=d2t, **kwargs)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith(("embed_tokens", "lm_head", "verifier_")):
                continue  # the verifier's (lm_head: its rows, for a reduced vocabulary)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.startswith("markov_head."):
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(out_dir)
    return model.eval()


def speculators_round(model, taps, input_ids):
    """speculators' own DSpark ``forward`` on one anchor at ``P``: (corrected logits [1, BLOCK, V_d], confidence
    logits [1, BLOCK] or None), captured where ``forward`` hands them to ``compute_metrics``."""
    from speculators.models.dspark import core

    captured = {}

    def capture(logits, targets, confidence_logits, *args, **kwargs):
        captured.update(logits=logits, confidence=confidence_logits)
        return logits.new_zeros(()), {}

    S = input_ids.shape[1]
    loss_mask = torch.zeros(1, S, dtype=torch.long)
    loss_mask[0, P] = 1  # the one valid anchor
    real = core.compute_metrics
    core.compute_metrics = capture
    try:
        with torch.no_grad():
            model(hidden_states=taps, input_ids=input_ids, loss_mask=loss_mask,
                  verifier_last_hidden_states=torch.zeros(1, S, model.hidden_size),
                  document_ids=torch.zeros(1, S, dtype=torch.long), max_anchors=1)
    finally:
        core.compute_metrics = real
    return captured["logits"], captured["confidence"]


def draft_ids(tokens, d2t):
    """Target ids → draft ids (inverse of ``t = d + d2t[d]``)."""
    if d2t is None:
        return tokens
    table = {int(d + d2t[d]): d for d in range(d2t.numel())}
    return torch.tensor([[table[int(t)] for t in row] for row in tokens])


@pytest.mark.parametrize("name", list(VARIANTS))
def test_reference_round_matches_speculators_forward(target_dir, tmp_path, name):
    from dspark_trt import load_drafter

    variant = VARIANTS[name]
    spec = speculators_drafter(target_dir, variant, tmp_path / "drafter")
    drafter = load_drafter(tmp_path / "drafter")  # no target_dir: the verifier speculators recorded
    c = drafter.config
    assert c.num_target_layers == 6  # from the target directory: speculators never writes it
    assert (c.markov_head_type, c.confidence_head_with_markov) == (
        variant.markov_head_type, variant.confidence and variant.confidence_markov is not False)

    g = torch.Generator().manual_seed(4)
    S = P + BLOCK + 1
    taps = torch.randn(1, S, c.num_taps * c.hidden_size, generator=g)
    input_ids = torch.randint(0, MASK_ID, (1, S), generator=g)
    anchor, ctx_len = input_ids[:, P], torch.tensor([P])
    k, v = drafter.context_kv(taps, torch.arange(S).view(1, S))  # rows ≥ P are padding, masked by ctx_len
    ours = drafter.draft(anchor, k, v, ctx_len, topk=None)  # greedy, dense: cand_logits = all corrected logits

    n = c.num_draft_tokens
    input_ids[0, P + 1:P + BLOCK] = ours.tokens[0, :BLOCK - 1]  # teacher-force speculators' Markov predecessors
    logits, conf_logits = speculators_round(spec, taps, input_ids)
    slots = slice(BLOCK - n, BLOCK)  # bonus-anchor: slot 0 carries the anchor only
    theirs = logits[:, slots]  # [1, N, V_d]
    torch.testing.assert_close(ours.cand_logits, theirs, atol=2e-5, rtol=2e-5)
    d2t = drafter.d2t_or_none
    chosen = theirs.gather(-1, draft_ids(ours.tokens, d2t).unsqueeze(-1)).squeeze(-1)  # [1, N]
    torch.testing.assert_close(chosen, theirs.max(-1).values, atol=1e-5, rtol=0)  # greedy under speculators too
    if variant.confidence:
        torch.testing.assert_close(ours.confidence, torch.sigmoid(conf_logits[:, slots]), atol=1e-6, rtol=1e-5)
    else:
        assert ours.confidence is None and conf_logits is None

    if c.markov_head_type != "vanilla":  # the head matters: the same round walked as a vanilla head differs
        from dspark_trt.reference.markov import walk_candidates

        hidden = drafter.block_hidden(anchor, k, v, ctx_len)
        vanilla = walk_candidates(drafter.base_logits(hidden), None, anchor, drafter.markov_head.markov_w1.weight,
                                  drafter.markov_head.markov_w2.weight, d2t=d2t)
        assert (vanilla.cand_logits - theirs).abs().max() > 1e-2
    if not c.bidirectional_full_attention:  # the pattern matters: read as DeepSeek's, the round differs
        drafter.config = c.replace(layer_types=("full_attention",) * c.num_hidden_layers)
        wrong = drafter.draft(anchor, k, v, ctx_len, topk=None)
        assert (wrong.cand_logits - theirs).abs().max() > 1e-2
