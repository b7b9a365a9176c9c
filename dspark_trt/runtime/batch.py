"""The batch of active requests that a decode drives round after round: ``admit`` prefills requests into it,
``step`` runs one round for all of them, ``remove`` takes some out; finished requests leave it.

``SpeculativeDecoder.generate`` runs one ``Batch`` to the end (``loop``); ``RequestScheduler`` keeps one open and
admits requests between rounds. The round itself is ``round.speculative_round`` (or ``target_round``); around
it the batch keeps what a round must not: the per-row settings, the timers (prefill / draft / verify / other),
the statistics, the non-finite monitor, the verify policy of ``verify_drafts="auto"`` and the KV-room clamp.
"""

from __future__ import annotations

import time

import torch

from ..reference.verify import sample_tokens
from .drafter_state import DrafterState
from .nonfinite import NonFiniteMonitor
from .requests import Request
from .round import RoundOutput, RoundParams, speculative_round, target_round
from .stats import GenerationStats, Stopwatch

__all__ = ["Batch"]


class Batch:
    """Requests being decoded together by ``decoder`` (a ``SpeculativeDecoder``).

    Args:
        decoder: its target, drafter backend and config.
        topk, threshold: the resolved draft options (``draft_options.resolve_draft_options``).
        draft: ``False`` decodes with the target alone (the baseline).
        requests: how many requests the stats count (``generate``'s batch; 0 for a scheduler).
        verify_cap (*optional*): at most this many drafts verified per round, or ``"auto"`` (None: all N).
        markov_topm: the candidate union's M (0: top-k only).
    """

    def __init__(self, decoder, topk, threshold, draft: bool, *, requests: int = 0,
                 verify_cap: int | str | None = None, markov_topm: int = 0):
        self.dec, self.topk, self.threshold, self.speculative = decoder, topk, threshold, draft
        self.verify_cap = verify_cap  # at most this many drafts verified per round (None: all N; "auto")
        self.union: dict = {"markov_topm": markov_topm} if markov_topm else {}  # only union-capable backends see it
        self.on_round = None  # optional on_round(drafted, accepted): per-request lists after each round
        self.requests: dict[int, Request] = {}  # active requests by id
        dev = decoder.target.device
        self.rows = torch.zeros(0, dtype=torch.int64)  # request id of each active batch row
        self.temp_rows = torch.zeros(0, dtype=torch.float32, device=dev)  # [B] per row
        self.seed_rows = torch.zeros(0, dtype=torch.int64, device=dev)  # [B] per row
        self.top_k_rows = torch.zeros(0, dtype=torch.int64, device=dev)  # [B] per row, 0 = off
        self.top_p_rows = torch.zeros(0, dtype=torch.float32, device=dev)  # [B] per row, 1 = off
        self.anchor = torch.zeros(0, dtype=torch.int64)  # [B] last emitted token: the next round's anchor
        self.state: DrafterState | None = None
        self.stats = GenerationStats(speculative=draft, num_draft_tokens=decoder.config.num_draft_tokens,
                                     requests=requests)
        self.clock = Stopwatch(self.stats, dev)
        self.monitor = NonFiniteMonitor(decoder.config, drafter_dtype=getattr(decoder.backend, "dtype", None))

    # -- per-row views of the per-request settings ---------------------------------------------------------
    @property
    def temp(self):
        return None if bool((self.temp_rows < 1e-5).all()) else self.temp_rows

    @property
    def seed(self):
        return self.seed_rows

    @property
    def truncation(self) -> dict:
        """``top_k`` / ``top_p`` keyword arguments of the samplers; empty when no row truncates."""
        if self.top_k_rows.numel() and (bool((self.top_k_rows > 0).any()) or bool((self.top_p_rows < 1).any())):
            return {"top_k": self.top_k_rows, "top_p": self.top_p_rows}
        return {}

    def params(self) -> RoundParams:
        """What the next round is asked, for the rows active now."""
        return RoundParams(topk=self.topk, threshold=self.threshold, union=self.union, temperature=self.temp,
                           seed=self.seed, truncation=self.truncation, d2t=self.dec.d2t)

    # -- driving ------------------------------------------------------------------------------------------
    def loop(self, requests: list[Request]) -> GenerationStats:
        """Admit ``requests`` and run rounds until every one has finished; the run's stats."""
        start = time.perf_counter()
        finished = self.admit(requests)
        while self.rows.numel():
            finished += self.step()
        self.stats.generated_tokens = sum(len(r.out) for r in finished)
        self.stats.total_seconds = time.perf_counter() - start
        return self.stats

    def admit(self, requests: list[Request]) -> list[Request]:
        """Prefill ``requests`` into the batch (after the active rows); returns those finished at once.

        A request that has already emitted tokens (it left another batch, e.g. after a failed round) resumes
        where it was: its prompt and emitted tokens but the last are prefilled, and the last is its anchor,
        exactly the state a round leaves behind, so it goes on with the tokens it would have had."""
        target, backend, c = self.dec.target, self.dec.backend, self.dec.config
        resumed = [bool(r.out) for r in requests]
        prompts = [torch.cat((r.prompt, torch.tensor(r.out[:-1], dtype=torch.int64))) if r.out else r.prompt
                   for r in requests]
        dev = target.device
        temp = torch.tensor([r.temperature for r in requests], dtype=torch.float32, device=dev)  # [Bn]
        seed = torch.tensor([r.seed for r in requests], dtype=torch.int64, device=dev)  # [Bn]
        top_k = torch.tensor([r.top_k for r in requests], dtype=torch.int64, device=dev)  # [Bn]
        top_p = torch.tensor([r.top_p for r in requests], dtype=torch.float32, device=dev)  # [Bn]
        truncation = {"top_k": top_k, "top_p": top_p} if any(r.top_k or r.top_p < 1 for r in requests) else {}
        joining = bool(self.rows.numel())
        with self.clock("prefill"):
            pre = target.extend(prompts) if joining else target.prefill(prompts)
            lens = torch.tensor([len(p) for p in prompts], dtype=torch.int64, device=dev)  # first new positions
            first = sample_tokens(pre.logits, None if bool((temp < 1e-5).all()) else temp, seed, lens,
                                  **truncation)  # [Bn]
            if any(resumed):  # a resumed request's anchor is its last emitted token
                last = torch.tensor([r.out[-1] if r.out else -1 for r in requests], dtype=torch.int64, device=dev)
                first = torch.where(torch.tensor(resumed, device=dev), last, first)
            if self.speculative:
                Bn = len(requests)
                cap = int(lens.max()) + c.num_draft_tokens + 2  # the prompt and a round: a bucket ≥ that, grown later
                W = c.context_window  # windowed: prompt rows before min(len) - W are read by no request's round
                skip = max(0, int(lens.min()) - W) if W is not None else 0
                taps = pre.taps[:, skip:]  # [Bn, T - skip, m·d]
                kv = backend.context_kv(taps, torch.arange(skip, pre.taps.shape[1]).expand(Bn, -1))
                self.monitor.context(taps, kv[0], kv[1], lens - skip, [r.id for r in requests])
                state = DrafterState(c.num_hidden_layers, Bn, cap, c.num_key_value_heads, c.head_dim,
                                     dtype=kv[0].dtype, device=kv[0].device, limit=self.dec.max_context,
                                     window=W,  # sliding when every layer is windowed: O(W)
                                     rows=None if joining else self._state_rows(Bn))
                state.begin_at(skip)
                state.append(kv[0], kv[1], lens - skip)
                self.state = (self.state.join(state, self._state_rows(self.state.batch + Bn)) if joining
                              else state)
        self.requests.update((r.id, r) for r in requests)
        self.rows = torch.cat((self.rows, torch.tensor([r.id for r in requests], dtype=torch.int64)))
        self.temp_rows = torch.cat((self.temp_rows, temp))
        self.seed_rows = torch.cat((self.seed_rows, seed))
        self.top_k_rows = torch.cat((self.top_k_rows, top_k))
        self.top_p_rows = torch.cat((self.top_p_rows, top_p))
        self.anchor = torch.cat((self.anchor.to(first.device), first))
        B0 = len(self.rows) - len(requests)
        done = [False] * B0 + [False if again else r.emit([int(t)])
                               for r, t, again in zip(requests, first.tolist(), resumed)]
        self._notify()
        return self._drop(done)

    def step(self) -> list[Request]:
        """One round for every active request; returns the requests that finished (they left the batch)."""
        out = self._speculative_round() if self.speculative else target_round(self.dec.target, self.anchor,
                                                                               self.params(), phase=self.clock)
        self.anchor = out.next_anchor
        with self.clock("other"):
            self._record(out.n, out.accepted)
            done = [self.requests[rid].emit(tokens) for rid, tokens in zip(self.rows.tolist(), out.tokens())]
            return self._drop(done)

    def remove(self, ids) -> list[Request]:
        """Take requests out of the batch at a round boundary (e.g. cancelled); returns them."""
        ids = set(ids)
        return self._drop([rid in ids for rid in self.rows.tolist()])

    # -- around the round ---------------------------------------------------------------------------------
    def _speculative_round(self) -> RoundOutput:
        """``speculative_round`` with the cap on n, then the monitor's checks and the policy's observation."""
        started = time.perf_counter()
        limit = _Limit(self.dec, self.verify_cap)
        out = speculative_round(self.dec.target, self.dec.backend, self.state, self.anchor, self.params(),
                                limit=limit, phase=self.clock)
        with self.clock("draft"):
            self.monitor.draft(out.draft, self.rows)  # non-finite inputs or logits: one warning per request
            self.monitor.context(*out.context, out.accepted + 1, self.rows)
        if limit.policy is not None:
            limit.policy.observe(out.n, out.accepted, time.perf_counter() - started, out.width)
        return out

    def _record(self, n: torch.Tensor, accepted: torch.Tensor) -> None:
        """Stats of one round: n, accepted [B] per row."""
        self.stats.record_round(n, accepted)
        B = len(self.rows)
        drafted, accepted = n.tolist(), accepted.tolist()
        for rid, d, a in zip(self.rows.tolist(), drafted, accepted):
            r = self.requests[rid]
            r.rounds, r.drafted, r.accepted = r.rounds + 1, r.drafted + d, r.accepted + a
            r.max_batch = max(r.max_batch, B)
        if self.on_round is not None:
            self.on_round(drafted, accepted)

    def _drop(self, done: list[bool]) -> list[Request]:
        """Remove finished requests from the target, the drafter state and the batch; returns them."""
        if not any(done):
            return []
        finished = [self.requests.pop(int(rid)) for rid, d in zip(self.rows.tolist(), done) if d]
        keep = torch.tensor([i for i, d in enumerate(done) if not d], dtype=torch.int64)
        self.rows = self.rows[keep]
        self.temp_rows = self.temp_rows[keep.to(self.temp_rows.device)]
        self.seed_rows = self.seed_rows[keep.to(self.seed_rows.device)]
        self.top_k_rows = self.top_k_rows[keep.to(self.top_k_rows.device)]
        self.top_p_rows = self.top_p_rows[keep.to(self.top_p_rows.device)]
        self.anchor = self.anchor[keep.to(self.anchor.device)]
        if keep.numel():
            self.dec.target.select(keep)
            if self.speculative:
                self.state.select(keep, self._state_rows(len(keep)))  # in place while the bucket stays
        self._notify()
        return finished

    def _state_rows(self, batch: int) -> int:
        """Rows of the drafter's cache for ``batch`` requests: a padded backend's batch bucket (its graphs bind the
        cache by address), else ``batch``."""
        rows = getattr(self.dec.backend, "state_rows", None)
        return batch if rows is None else int(rows(batch))

    def _notify(self) -> None:
        """Optional backend hook: backends that keep per-request state learn which requests are active."""
        hook = getattr(self.dec.backend, "set_active_requests", None)
        if hook is not None and self.speculative:
            hook(self.rows.tolist())


class _Limit:
    """A round's ``limit(n) -> n``: the verify policy's choice (``"auto"``, measured on first use at this batch)
    or the fixed cap, then the room left in the target's KV cache near an export's bound (verifying fewer drafts
    is lossless). Keeps the policy it asked, for its observation of the round."""

    def __init__(self, decoder, verify_cap: int | str | None):
        self.dec, self.cap = decoder, verify_cap
        self.policy = None

    def __call__(self, n: torch.Tensor) -> torch.Tensor:  # [B] int64 → [B] int64
        dec, target = self.dec, self.dec.target
        if self.cap == "auto":
            self.policy = dec.verify_policy(len(n))
            n = n.clamp_max(self.policy.choose(len(n)))
        elif self.cap is not None:
            n = n.clamp_max(self.cap)
        room = getattr(target, "verify_room", None)
        if dec.max_context is not None and room is not None:  # near the KV bound: verify fewer (lossless)
            n = n.clamp_max(max(room(dec.max_context, int(n.max()) + 1) - 1, 0))
        return n
