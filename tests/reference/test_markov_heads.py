"""The gated and RNN Markov heads in the reference: the walk's corrected logits equal the heads' math applied
block-wise with teacher forcing (written here from the formulas, as speculators' ``MarkovHead.block_bias`` trains
them), top-k with k = V_d drafts the dense walk's tokens, the op references agree with the walk, and bad heads are
refused in one line."""

from __future__ import annotations

import json

import pytest
import torch

from dspark_trt import load_drafter
from dspark_trt.errors import DSparkTrtError
from dspark_trt.reference.markov import walk_candidates
from dspark_trt.reference.markov_heads import HeadFeatures, head_features
from dspark_trt.synthetic import write_tiny_checkpoint

HEADS = ("gated", "rnn")
V = 257


@pytest.fixture(scope="module", params=[(h, a) for h in HEADS for a in (True, False)],
                ids=lambda p: f"{p[0]}-{'anchor-first' if p[1] else 'bonus-anchor'}")
def drafter(request, tmp_path_factory):
    head, anchor_first = request.param
    ck = write_tiny_checkpoint(tmp_path_factory.mktemp(head) / "pair", seed=5, markov_head_type=head, vocab_size=V,
                               markov_rank=8, block_size=5, sample_from_anchor=anchor_first)
    return load_drafter(ck.drafter)


def round_inputs(drafter, B=3, T=11, seed=0):
    c = drafter.config
    g = torch.Generator().manual_seed(seed)
    taps = torch.randn(B, T, c.num_taps * c.hidden_size, generator=g)
    k, v = drafter.context_kv(taps, torch.arange(T).expand(B, T))
    anchor = torch.randint(0, V, (B,), generator=g)
    ctx_len = torch.tensor([T, 4, 7][:B])
    return anchor, k, v, ctx_len


def teacher_forced_logits(drafter, anchor, k, v, ctx_len, tokens):
    """[B, N, V_d] corrected logits of every slot with the predecessors fixed to ``tokens`` [B, N], computed over
    the whole query block as speculators trains (bonus-anchor: slot 0 carries the anchor, predecessor a)."""
    c, head = drafter.config, drafter.markov_head
    states = drafter.block_states(anchor, k, v, ctx_len)  # [B, Q, d]
    Q = states.shape[1]
    if c.sample_from_anchor:
        prev = torch.cat((anchor.view(-1, 1), tokens[:, :-1]), dim=1)  # [B, Q]: slot q's predecessor
    else:
        prev = torch.cat((anchor.view(-1, 1), anchor.view(-1, 1), tokens[:, :-1]), dim=1)
    e = head.markov_w1.weight[prev]  # [B, Q, r]
    w2 = head.markov_w2.weight
    if c.markov_head_type == "gated":
        gate = torch.sigmoid(head.gate_proj(torch.cat((states, e), dim=-1)))
        bias = (gate * e) @ w2.T  # [B, Q, V_d]
    else:
        state = torch.zeros(e.shape[0], c.markov_rank)
        out = []
        for q in range(Q):
            g, cand, o = head.joint_proj(torch.cat((state, e[:, q], states[:, q]), dim=-1)).chunk(3, dim=-1)
            state = torch.sigmoid(g) * state + (1 - torch.sigmoid(g)) * torch.tanh(cand)
            out.append(torch.tanh(o) @ w2.T)
        bias = torch.stack(out, dim=1)
    logits = drafter.base_logits(states) + c.logit_scale * bias  # [B, Q, V_d]
    return logits if c.sample_from_anchor else logits[:, 1:]


def test_the_walk_applies_the_head_as_trained(drafter):
    anchor, k, v, ctx_len = round_inputs(drafter)
    res = drafter.draft(anchor, k, v, ctx_len, topk=None)
    want = teacher_forced_logits(drafter, anchor, k, v, ctx_len, res.tokens)
    torch.testing.assert_close(res.cand_logits, want, atol=2e-5, rtol=2e-5)
    assert torch.equal(res.tokens, want.argmax(-1))  # greedy: the argmax of the corrected logits
    # the head matters: the same walk read as vanilla drafts other logits
    vanilla = walk_candidates(drafter.base_logits(drafter.block_hidden(anchor, k, v, ctx_len)), None, anchor,
                              drafter.markov_head.markov_w1.weight, drafter.markov_head.markov_w2.weight)
    assert (vanilla.cand_logits - res.cand_logits).abs().max() > 1e-3


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_topk_with_k_equal_to_the_vocabulary_drafts_the_dense_tokens(drafter, sampled):
    anchor, k, v, ctx_len = round_inputs(drafter, seed=1)
    opts = {}
    if sampled:
        opts = dict(temperature=torch.tensor([1.0, 0.0, 0.7]), seed=torch.tensor([3, 4, 5]))
    dense = drafter.draft(anchor, k, v, ctx_len, topk=None, **opts)
    full = drafter.draft(anchor, k, v, ctx_len, topk=V, **opts)
    assert torch.equal(dense.tokens, full.tokens)
    gathered = dense.cand_logits.gather(-1, full.cand_ids)  # top-k candidates in their own order
    torch.testing.assert_close(full.cand_logits, gathered, atol=1e-5, rtol=1e-5)
    small = drafter.draft(anchor, k, v, ctx_len, topk=16, **opts)  # k < V: the candidates' logits are the dense ones
    torch.testing.assert_close(small.cand_logits, teacher_forced_logits(drafter, anchor, k, v, ctx_len, small.tokens)
                               .gather(-1, small.cand_ids), atol=2e-5, rtol=2e-5)


def test_the_op_references_walk_what_the_drafter_walks(drafter):
    from dspark_trt.plugins.contract import HEAD_OPS, REFERENCE_OPS

    c = drafter.config
    anchor, k, v, ctx_len = round_inputs(drafter, seed=2)
    res = drafter.draft(anchor, k, v, ctx_len, topk=16)
    states = drafter.block_states(anchor, k, v, ctx_len)
    head = drafter.head_features(anchor, states)
    hidden = drafter.prediction_slots(states)
    base = drafter.base_logits(hidden)
    vals, ids = torch.topk(base.float(), 16, dim=-1)
    conf_base, conf_w = drafter.confidence_parts(hidden)
    B, N = vals.shape[:2]
    inputs = dict(cand_values=vals, cand_ids=ids.to(torch.int32), anchor=anchor.to(torch.int32),
                  markov_w1=drafter.markov_head.markov_w1.weight, markov_w2=drafter.markov_head.markov_w2.weight,
                  d2t=torch.zeros(c.draft_vocab_size, dtype=torch.int32), temperature=torch.zeros(B),
                  seed=torch.zeros(B, dtype=torch.int32), position=(ctx_len + 1).to(torch.int32),
                  conf_base=conf_base, conf_w=conf_w)
    if head.kind == "gated":
        inputs.update(gate_hidden=head.hidden_part, gate_w=head.weight)
    else:
        inputs.update(joint_hidden=head.hidden_part, joint_w=head.weight, rnn_state0=head.start())
    assert [t.name for t in HEAD_OPS[head.kind][1]] == list(inputs)  # the contract's input order
    tokens, logits, conf = REFERENCE_OPS[head.kind](*inputs.values(), logit_scale=c.logit_scale)
    assert torch.equal(tokens.to(torch.int64), res.tokens)
    torch.testing.assert_close(conf, res.confidence)
    order = res.cand_ids.argsort(-1)  # compare per candidate id (any top-k order)
    torch.testing.assert_close(logits.gather(-1, ids.argsort(-1)), res.cand_logits.gather(-1, order))


def test_head_features_split_the_projection():
    g = torch.Generator().manual_seed(0)
    B, N, d, r = 2, 3, 5, 4
    h, e = torch.randn(B, N, d, generator=g), torch.randn(B, r, generator=g)
    w, b = torch.randn(r, d + r, generator=g), torch.randn(r, generator=g)
    feats = head_features("gated", h, w, b)
    u, state = feats.step(e, 1, None)
    torch.testing.assert_close(u, torch.sigmoid(torch.cat((h[:, 1], e), -1) @ w.T + b) * e)
    assert state is None
    wj, bj = torch.randn(3 * r, 2 * r + d, generator=g), torch.randn(3 * r, generator=g)
    s = torch.randn(B, r, generator=g)
    u, s1 = head_features("rnn", h, wj, bj, state0=s).step(e, 2, s)
    gate, cand, out = (torch.cat((s, e, h[:, 2]), -1) @ wj.T + bj).chunk(3, -1)
    torch.testing.assert_close(u, torch.tanh(out))
    torch.testing.assert_close(s1, torch.sigmoid(gate) * s + (1 - torch.sigmoid(gate)) * torch.tanh(cand))


def test_bad_head_inputs_are_refused_in_one_line():
    with pytest.raises(DSparkTrtError, match=r"weight has shape \[4, 5\], expected \[4, 4\]"):
        HeadFeatures("gated", torch.zeros(1, 2, 4), torch.zeros(4, 5))
    with pytest.raises(DSparkTrtError, match="state0 has shape"):
        HeadFeatures("rnn", torch.zeros(1, 2, 12), torch.zeros(12, 8), torch.zeros(2, 4))
    head = HeadFeatures("gated", torch.zeros(1, 2, 4), torch.zeros(4, 4))
    with pytest.raises(DSparkTrtError, match="vanilla Markov head only.*--markov-topm 0"):
        walk_candidates(torch.zeros(1, 2, 3), torch.zeros(1, 2, 3, dtype=torch.int64), torch.zeros(1, dtype=torch.int64),
                        torch.zeros(10, 4), torch.zeros(10, 4), union_table=torch.zeros(10, 2, dtype=torch.int32),
                        base_logits=torch.zeros(1, 2, 10), head=head)


def _edit(path, **changes):
    raw = json.loads(path.read_text())
    raw.update(changes)
    path.write_text(json.dumps(raw))


def test_bad_checkpoints_are_refused_in_one_line(tmp_path):
    from safetensors.torch import load_file, save_file

    ck = write_tiny_checkpoint(tmp_path / "gated", seed=0, markov_head_type="gated")
    weights = ck.drafter / "model.safetensors"
    tensors = load_file(weights)
    save_file({n: t for n, t in tensors.items() if "gate_proj" not in n}, weights)
    with pytest.raises(DSparkTrtError) as err:
        load_drafter(ck.drafter)
    msg = str(err.value)
    assert "\n" not in msg and "missing tensor markov_head.gate_proj.weight" in msg and "markov_head_type='gated'" in msg

    ck = write_tiny_checkpoint(tmp_path / "rnn", seed=0, markov_head_type="rnn", markov_rank=8)
    weights = ck.drafter / "model.safetensors"
    tensors = load_file(weights)
    tensors["markov_head.joint_proj.weight"] = tensors["markov_head.joint_proj.weight"][:, :-1].contiguous()
    save_file(tensors, weights)
    with pytest.raises(DSparkTrtError, match=r"joint_proj.weight has shape \[24, 79\], expected \[24, 80\]"):
        load_drafter(ck.drafter)

    _edit(ck.drafter / "config.json", markov_head_type="vanilla")  # an rnn head's tensor on a vanilla config
    with pytest.raises(DSparkTrtError, match="unexpected tensor markov_head.joint_proj.bias.*fix markov_head_type"):
        load_drafter(ck.drafter)
    _edit(ck.drafter / "config.json", markov_head_type="lstm")
    with pytest.raises(DSparkTrtError, match="markov_head_type 'lstm' is not supported.*'vanilla', 'gated', 'rnn'"):
        load_drafter(ck.drafter)
    _edit(ck.drafter / "config.json", markov_head_type="rnn", draft_markov_topm=4)
    with pytest.raises(DSparkTrtError, match="draft_markov_topm 4 needs the vanilla Markov head.*set it to 0"):
        load_drafter(ck.drafter)


def test_the_union_is_refused_for_gated_and_rnn_before_any_round(tmp_path):
    from dspark_trt.runtime.draft_options import resolve_markov_topm

    config = load_drafter(write_tiny_checkpoint(tmp_path / "p", seed=0, markov_head_type="rnn").drafter).config

    class Backend:  # what resolve_markov_topm reads of a drafter backend
        name, supports_markov_topm, fixed_markov_topm = "torch", True, None

    assert resolve_markov_topm(config, Backend(), 0, 16) == 0
    with pytest.raises(DSparkTrtError, match="--markov-topm 4 needs the vanilla Markov head: this drafter's rnn head"):
        resolve_markov_topm(config, Backend(), 4, 16)
    assert resolve_markov_topm(config.replace(markov_head_type="vanilla"), Backend(), 4, 16) == 4
