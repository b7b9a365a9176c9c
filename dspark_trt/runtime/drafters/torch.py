"""The ``torch`` drafter backend: the reference ``DSparkDrafter`` itself, on any device.

``draft`` is ``DSparkDrafter.draft`` (``block_hidden`` → ``base_logits`` → candidate selection → walk). By
default (``walk_fn=None``) the selection and walk are chosen per round by ``plugins.dispatch``: with top-k,
the fused Triton DSparkTopKMarkov kernel on CUDA and the Numba kernels on the CPU, else the oracle
``reference.markov``. A given ``walk_fn`` (``walk_candidates``' signature) walks the reference's candidates.

CUDA graphs (``graphs="auto"``, the default, on CUDA): the whole round — backbone, top-k, fused Triton walk —
is captured once per (batch bucket, context bucket, top-k) by ``runtime.cuda_graphs.GraphRunner`` and
replayed; a batch is padded to its bucket and the results are unpadded. The runtime's ``DrafterState`` keeps
the batch bucket's rows (``state_rows``), so its buffers *are* the bucket's context inputs: bound by address
(``InputSpec.bound``; one graph per (rows, capacity)), never copied — only the anchors, lengths, temperatures
and seeds are. A context of any other shape (a caller's own tensors) is copied into the bucket's static
buffers (``context_buckets``). ``graphs="eager"`` runs those same padded paths without capturing (how the CPU
tests check the padding and the binding), ``"off"`` the plain round.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Literal

import torch

from ...plugins.dispatch import REFERENCE, MarkovImpl, select_markov_impl
from ...errors import DSparkTrtError
from ...reference.markov import MarkovWalkResult
from ..cuda_graphs import BoundAddresses, BucketPolicy, GraphRunner, InputSpec, bound_context_plan, cache_rows
from .base import DrafterBackend

__all__ = ["TorchDrafterBackend"]


class TorchDrafterBackend(DrafterBackend):
    """Runs a reference ``DSparkDrafter`` (weights on ``drafter``'s device/dtype).

    Args:
        drafter: a loaded ``reference.DSparkDrafter`` (``dspark_trt.load_drafter``).
        walk_fn (*optional*): replaces the Markov walk; same signature and result as
            ``reference.markov.walk_candidates``. Default: the device's native kernel, else the reference.
        graphs (*optional*, defaults to ``"auto"``): ``"graph"`` captures the round in CUDA graphs per bucket,
            ``"eager"`` runs the same padded bucket path without graphs, ``"off"`` the plain round;
            ``"auto"`` = ``"graph"`` on CUDA, else ``"off"``.
        max_batch (*optional*, defaults to 8): largest batch bucket (1, 2, 4, … max_batch).
        max_context (*optional*, defaults to 8192): largest context bucket (128, 256, … max_context).
            A round beyond either runs unpadded and eagerly.
        bind_context (*optional*, defaults to True): with graphs, bind a ``DrafterState`` of ``state_rows(B)``
            rows by address; False copies every context into the bucket's buffers (what this backend did
            before; ``dspark bench context --draft-padded`` times both).

    Example:
        >>> with TorchDrafterBackend.from_pretrained("drafter/", target_dir="target/") as backend:
        ...     k, v = backend.context_kv(taps, positions)
    """

    name = "torch"

    def __init__(self, drafter, *, walk_fn: Callable[..., MarkovWalkResult] | None = None,
                 graphs: Literal["auto", "graph", "eager", "off"] = "auto", max_batch: int = 8,
                 max_context: int = 8192, bind_context: bool = True):
        self.drafter = drafter
        self.config = drafter.config
        self.device = drafter.embed_tokens.weight.device
        self.dtype = drafter.embed_tokens.weight.dtype
        self.walk_fn = walk_fn  # None: plugins.dispatch chooses per (device, case)
        self.d2t = drafter.d2t_or_none  # [V_d] or None
        if graphs not in ("auto", "graph", "eager", "off"):
            raise DSparkTrtError(f"graphs={graphs!r}: use auto, graph, eager or off")
        if graphs == "auto":
            graphs = "graph" if self.device.type == "cuda" else "off"
        self.graphs = graphs
        self.policy = BucketPolicy(max_batch=max_batch, max_context=max_context)
        self.bind_context = bind_context
        self._runner: GraphRunner | None = None  # the context copied into the bucket's buffers
        self._bound_runner: GraphRunner | None = None  # the context bound: a DrafterState of state_rows(B) rows
        self._bound = BoundAddresses()  # the buffers the bound runner's graphs read

    @classmethod
    def from_pretrained(cls, drafter_dir: str | Path, *, target_dir: str | Path | None = None, dtype=None,
                        device=None, **kwargs) -> "TorchDrafterBackend":
        from ...loader import load_drafter

        from ...devices import resolve_device

        device = resolve_device(device)
        dtype = dtype if dtype is not None else ("bf16" if device.type == "cuda" else "fp32")
        return cls(load_drafter(drafter_dir, dtype=dtype, device=device, target_dir=target_dir), **kwargs)

    @torch.inference_mode()
    def context_kv(self, taps: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.drafter.context_kv(taps.to(self.device), positions.to(self.device))

    supports_markov_topm = True  # the candidate union (--markov-topm M > 0)

    @torch.inference_mode()
    def draft(self, anchor, ctx_k, ctx_v, ctx_len, *, topk, temperature, seed,
              markov_topm: int = 0, ctx_start: torch.Tensor | None = None) -> MarkovWalkResult:
        B, T = anchor.shape[0], ctx_k.shape[2]
        start = torch.zeros_like(ctx_len) if ctx_start is None else ctx_start
        if self.graphs != "off":
            zeros = torch.zeros(B, device=self.device)
            # heads first [L, rows, H_kv, T, D]: each layer's block contiguous (the DrafterState's own buffers)
            inputs = {"anchor": anchor, "ctx_k": ctx_k.transpose(2, 3), "ctx_v": ctx_v.transpose(2, 3),
                      "ctx_len": ctx_len, "ctx_start": start,
                      "temperature": zeros if temperature is None else temperature,  # < 1e-5: greedy
                      "seed": zeros.to(torch.int64) if seed is None else seed}
            plan = bound_context_plan(B, inputs["ctx_k"], inputs["ctx_v"], batch_dim=1, context_dim=3,
                                      max_batch=self.policy.max_batch,
                                      max_context=self.policy.max_context) if self.bind_context else None
            if plan is not None:  # the cache is the bucket: bound by address, nothing of it copied
                if self._bound.moved(inputs["ctx_k"], inputs["ctx_v"]) and self._bound_runner is not None:
                    self._bound_runner.drop(lambda key: True)  # graphs bound to the old buffers: stale
                return self._graph_runner(bound=True)(plan, inputs, variant=(topk, markov_topm))
            if B <= self.policy.max_batch and T <= self.policy.max_context:
                inputs["ctx_k"], inputs["ctx_v"] = inputs["ctx_k"][:, :B], inputs["ctx_v"][:, :B]
                return self._graph_runner()(self.policy.plan(B, T), inputs, variant=(topk, markov_topm))
        return self._round(anchor, ctx_k[:, :B], ctx_v[:, :B], ctx_len, topk=topk, temperature=temperature,
                           seed=seed, markov_topm=markov_topm, ctx_start=start)

    def state_rows(self, batch: int) -> int:
        """The batch bucket with graphs (the ``DrafterState``'s buffers are then the bucket's bound inputs), else
        ``batch``."""
        return batch if self.graphs == "off" else cache_rows(batch, self.policy.max_batch)

    def _round(self, anchor, ctx_k, ctx_v, ctx_len, *, topk, temperature, seed, markov_topm: int = 0,
               ctx_start: torch.Tensor | None = None) -> MarkovWalkResult:
        impl = self._auto_impl(topk, markov_topm) if self.walk_fn is None else REFERENCE._replace(walk=self.walk_fn)
        return self.drafter.draft(anchor, ctx_k, ctx_v, ctx_len, topk=topk, temperature=temperature, seed=seed,
                                  walk=impl.walk, select=impl.select, markov_topm=markov_topm, ctx_start=ctx_start)

    # -- CUDA graphs -------------------------------------------------------------------------------------
    def input_specs(self, bound: bool = False) -> tuple[InputSpec, ...]:
        """The round's static inputs: padded requests get anchor 0, context 0 (nothing to attend to but their
        own block), greedy temperature, seed and ``ctx_start`` 0; padded context slots are zeros beyond
        ``ctx_len``. The context is heads first, ``[L, B, H_kv, T, D]`` (``DrafterState``'s layout, each layer's
        block contiguous for the attention products): ``bound``, the cache's own buffers (``state_rows`` rows,
        its capacity); else copied into the bucket's buffers every round."""
        c = self.config
        kv = (c.num_hidden_layers, 0, c.num_key_value_heads, 0, c.head_dim)
        return (InputSpec("anchor", (0,), torch.int64), InputSpec("ctx_k", kv, self.dtype, 1, 3, bound=bound),
                InputSpec("ctx_v", kv, self.dtype, 1, 3, bound=bound), InputSpec("ctx_len", (0,), torch.int64),
                InputSpec("ctx_start", (0,), torch.int64), InputSpec("temperature", (0,), torch.float32),
                InputSpec("seed", (0,), torch.int64))

    def _graph_runner(self, bound: bool = False) -> GraphRunner:
        runner = self._bound_runner if bound else self._runner
        if runner is None:
            def round_fn(x: dict[str, torch.Tensor], key) -> MarkovWalkResult:
                return self._round(x["anchor"], x["ctx_k"].transpose(2, 3), x["ctx_v"].transpose(2, 3), x["ctx_len"],
                                   topk=key.variant[0],
                                   markov_topm=key.variant[1], ctx_start=x["ctx_start"],
                                   temperature=x["temperature"], seed=x["seed"])

            runner = GraphRunner(round_fn, self.input_specs(bound), role="draft", device=self.device,
                                 mode="graph" if self.graphs == "graph" else "eager")
            if bound:
                self._bound_runner = runner
            else:
                self._runner = runner
        return runner

    def activate(self) -> None:
        if self.graphs == "graph":
            self._graph_runner().activate()
            self._graph_runner(bound=True).activate()

    def deactivate(self) -> None:
        for runner in (self._runner, self._bound_runner):
            if runner is not None:
                runner.deactivate()
        self._bound = BoundAddresses()

    def _auto_impl(self, topk: int | None, markov_topm: int = 0) -> MarkovImpl:
        """``plugins.dispatch.MarkovImpl`` for this drafter's device, dtype, ``topk`` and ``markov_topm``."""

        c = self.config
        return select_markov_impl(self.device, topk=topk, rank=c.markov_rank, num_draft_tokens=c.num_draft_tokens,
                                  logits_dtype=torch.float32, weights_dtype=self.dtype, markov_topm=markov_topm,
                                  draft_vocab_size=c.draft_vocab_size, markov_head_type=c.markov_head_type)
