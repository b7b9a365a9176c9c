"""Step 4 of gpu-check: CUDA graphs on a Qwen3-8B-shaped drafter (random bf16 weights). The torch backend's
captured round against the same padded round run eagerly, token for token, at batch buckets 1/4/8, with the
context copied into the bucket and bound by address (a ``DrafterState``); then the round's time eager vs
replayed (``"kind": "eager_vs_graph"``) and copied vs bound (``"kind": "copied_vs_bound"``)."""

from __future__ import annotations

import statistics

import torch

from .common import GRAPH_BUCKETS, assert_graphs_captured, median_ms, qwen3_8b_drafter_config

__all__ = ["GraphChecks", "replay_step", "timing_step"]


def _drafter(num_layers: int, seed: int = 0):
    """A Qwen3-8B-shaped DSpark drafter with random bf16 weights, built on the GPU (nothing downloaded)."""
    from ...reference.drafter import DSparkDrafter

    torch.manual_seed(seed)
    with torch.device("cuda"):
        drafter = DSparkDrafter(qwen3_8b_drafter_config(num_layers)).to(torch.bfloat16).eval()
    with torch.no_grad():  # logits with a realistic spread (default init gives near-uniform ones)
        drafter.lm_head.weight.mul_(8.0)
    return drafter


def _round_inputs(drafter, B: int, T: int, seed: int):
    c = drafter.config
    g = torch.Generator(device="cuda").manual_seed(seed)
    kv = (c.num_hidden_layers, B, T, c.num_key_value_heads, c.head_dim)
    ctx_k = torch.randn(kv, generator=g, device="cuda").to(torch.bfloat16)
    ctx_v = torch.randn(kv, generator=g, device="cuda").to(torch.bfloat16)
    ctx_len = torch.randint(T // 2, T + 1, (B,), generator=g, device="cuda")
    ctx_len[0] = T
    anchor = torch.randint(0, c.vocab_size, (B,), generator=g, device="cuda")
    temperature = torch.where(torch.arange(B, device="cuda") % 2 == 0, 0.0, 0.8)  # greedy and sampled rows
    seeds = torch.randint(0, 2**40, (B,), generator=g, device="cuda")
    return anchor, ctx_k, ctx_v, ctx_len, temperature, seeds


class GraphChecks:
    """The drafter and its three torch backends (graph, padded eager, plain), built once for both steps."""

    def __init__(self, num_layers: int, context: int, topk: int):
        from ...runtime.drafters.torch import TorchDrafterBackend

        self.context, self.topk, self.num_layers = context, topk, num_layers
        self.drafter = _drafter(num_layers)
        self.graphed = TorchDrafterBackend(self.drafter, graphs="graph")
        self.padded_eager = TorchDrafterBackend(self.drafter, graphs="eager")
        self.plain = TorchDrafterBackend(self.drafter, graphs="off")
        self.timings: list[dict] = []

    def same_tokens(self, B: int) -> str:
        rounds = 0
        for seed in range(3):  # every replay with new inputs and new noise keys
            x = _round_inputs(self.drafter, B, self.context - 17 * seed, seed)
            kw = dict(topk=self.topk, temperature=x[4], seed=x[5])
            want = self.padded_eager.draft(*x[:4], **kw)
            got = self.graphed.draft(*x[:4], **kw)
            assert torch.equal(got.tokens, want.tokens), f"B={B} round {seed}: replay drafted other tokens"
            rounds += 1
        entries = [e for e in self.graphed._runner.entries.values() if e.key.batch == B]
        assert entries and all(e.graph is not None for e in entries), \
            f"B={B}: no graph captured ({entries[0].eager_reason if entries else 'no entry'})"
        assert_graphs_captured(f"B={B}", {"draft (copied)": self.graphed._runner})
        return f"{rounds} rounds equal, buckets {sorted({(e.key.batch, e.key.context) for e in entries})}"

    def timing(self, B: int) -> tuple[str, dict]:
        x = _round_inputs(self.drafter, B, self.context, 99)
        kw = dict(topk=self.topk, temperature=x[4], seed=x[5])
        eager_ms = median_ms(lambda: self.plain.draft(*x[:4], **kw))
        graph_ms = median_ms(lambda: self.graphed.draft(*x[:4], **kw))
        row = {"kind": "eager_vs_graph", "batch": B, "context": self.context, "topk": self.topk,
               "layers": self.num_layers, "eager_ms": round(eager_ms, 3), "graph_ms": round(graph_ms, 3),
               "speedup": round(eager_ms / graph_ms, 2)}
        self.timings.append(row)
        return f"eager {eager_ms:.3f} ms, graph {graph_ms:.3f} ms = {eager_ms / graph_ms:.2f}x", row

    def _bound_state(self, B: int, T: int, seed: int):
        """Round inputs, and a DrafterState of the batch bucket's rows holding the same context (what the
        decoder hands a padded backend: its buffers are bound to the graph, not copied)."""
        from ...runtime.drafter_state import DrafterState

        x = _round_inputs(self.drafter, B, T, seed)
        c = self.drafter.config
        state = DrafterState(c.num_hidden_layers, B, T, c.num_key_value_heads, c.head_dim, dtype=x[1].dtype,
                             device=x[1].device, rows=self.graphed.state_rows(B))
        state.append(x[1], x[2], x[3])
        return x, state

    def bound_tokens(self, B: int) -> str:
        for seed in range(3):
            x, state = self._bound_state(B, self.context - 17 * seed, seed)
            kw = dict(topk=self.topk, temperature=x[4], seed=x[5])
            want = self.padded_eager.draft(x[0], *state.context(), state.ctx_len, **kw)
            got = self.graphed.draft(x[0], *state.context(), state.ctx_len, **kw)
            assert torch.equal(got.tokens, want.tokens), f"B={B} round {seed}: the bound replay drafted other tokens"
        entries = list(self.graphed._bound_runner.entries.values())
        assert entries and all(e.graph is not None for e in entries), \
            f"B={B}: no bound graph captured ({entries[0].eager_reason if entries else 'no entry'})"
        # every capture since the first round, those of dropped (stale) entries included
        assert_graphs_captured(f"B={B}", {"draft (bound)": self.graphed._bound_runner})
        return f"3 rounds equal, bound bucket {sorted({(e.key.batch, e.key.context) for e in entries})}"

    def copied_vs_bound(self, B: int) -> tuple[str, dict]:
        x, state = self._bound_state(B, self.context, 99)
        kw = dict(topk=self.topk, temperature=x[4], seed=x[5])
        bound = (x[0], *state.context(), state.ctx_len)
        copied_ms, bound_ms = [], []
        for _ in range(5):  # interleaved: the copying bucket and the bound cache take turns
            copied_ms.append(median_ms(lambda: self.graphed.draft(*x[:4], **kw), repeats=5, warmup=1))
            bound_ms.append(median_ms(lambda: self.graphed.draft(*bound, **kw), repeats=5, warmup=1))
        c, b = statistics.median(copied_ms), statistics.median(bound_ms)
        row = {"kind": "copied_vs_bound", "batch": B, "context": self.context, "copied_ms": round(c, 3),
               "bound_ms": round(b, 3), "bound_over_copied": round(b / c, 3)}
        self.timings.append(row)
        return f"context copied {c:.3f} ms, bound {b:.3f} ms = {b / c:.2f}x", row


def _graph_checks(run) -> GraphChecks:
    if "graph_checks" not in run.state:
        o = run.options
        run.state["graph_checks"] = GraphChecks(o.layers, o.context, o.topk)
    return run.state["graph_checks"]


def replay_step(run) -> None:
    """Replay == eager at every bucket, context copied and bound; a capture that fell back is a FAIL row."""
    checks = run.checks
    graphs = _graph_checks(run)
    for B in GRAPH_BUCKETS:
        checks.run(f"graph replay == eager B={B}", lambda B=B: graphs.same_tokens(B))
    for B in GRAPH_BUCKETS:
        checks.run(f"bound DrafterState replay == eager B={B}", lambda B=B: graphs.bound_tokens(B))
    run.results["torch_max_reserved"] = torch.cuda.max_memory_reserved()


def timing_step(run) -> None:
    """A draft round's time eager vs replayed, and context copied vs bound, per bucket."""
    checks = run.checks
    graphs = _graph_checks(run)
    for B in GRAPH_BUCKETS:
        checks.run(f"draft round eager vs graph B={B}", lambda B=B: graphs.timing(B))
    for B in GRAPH_BUCKETS:
        checks.run(f"draft round context copied vs bound B={B}", lambda B=B: graphs.copied_vs_bound(B))
    run.results["graphs"] = list(graphs.timings)
    run.results["torch_max_reserved"] = torch.cuda.max_memory_reserved()
