"""``SpeculativeDecoder``: a target model, a DSpark drafter backend, and the lossless loop between them.

One batched step for the active requests (docs/dspark.md §9), anchor ``a`` at position ``p``::

    draft     backend.draft(a, ctx K/V, p)           → d_1 … d_N, candidates, corrected logits Z, confidence
    truncate  n = leading slots with confidence ≥ threshold   (n = N without a threshold), then n ≤ verify_drafts
    q         reference.draft_probs(Z, candidates, d, T)      the exact distribution each d_j was drawn from
    verify    target.verify([a, d_1 … d_n])                   → p_1 … p_{n+1}, taps of positions p … p+n
              reference.verify_drafts(p, d, q)                → acc accepted, one emitted token y
    commit    target keeps a, d_1 … d_acc (KV rollback); drafter context += their taps; anchor ← y at p+acc+1

The verifier and the target-only baseline (``draft=False``) are the reference oracle functions, with the
same noise keys: ``sample_tokens`` at position t draws what the verifier's bonus draw at position t would.
Requests are independent (own lengths, seeds, temperatures, stop points); finished ones leave the batch.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Sequence

import torch

from ..errors import DSparkTrtError
from ..reference.markov import draft_to_target
from ..reference.verify import draft_probs, sample_tokens, verify_drafts
from .drafters.base import DrafterBackend, backend_class
from .drafter_state import DrafterState
from .nonfinite import NonFiniteMonitor
from .stop import StopStrings
from .stats import GenerationResult, GenerationStats, Stopwatch
from .targets.base import Target
from .targets.hf import HFTarget

__all__ = ["SpeculativeDecoder", "check_context_budget", "check_pair", "check_sampling", "check_truncation"]

log = logging.getLogger("dspark")


def check_pair(config, target: Target) -> None:
    """A drafter must match its target: vocabulary, hidden size, tapped layers. One-line error otherwise."""
    fix = "use the drafter trained for this target (or the target it was trained for)"
    if config.vocab_size != target.vocab_size:
        raise DSparkTrtError(f"drafter vocab_size {config.vocab_size} != target vocab_size {target.vocab_size}; {fix}")
    if config.hidden_size != target.hidden_size:
        raise DSparkTrtError(f"drafter hidden_size {config.hidden_size} != target hidden_size {target.hidden_size}: "
                             f"the drafter fuses {config.num_taps}×{config.hidden_size} tapped features; {fix}")
    if not 0 <= config.mask_token_id < target.vocab_size:
        raise DSparkTrtError(f"drafter mask_token_id {config.mask_token_id} is outside the target vocabulary "
                             f"[0, {target.vocab_size}); fix mask_token_id in the drafter's config.json")
    target.set_taps(config.target_layer_ids)  # rejects ids beyond the target's depth


def check_sampling(temperature: torch.Tensor, seed: torch.Tensor) -> None:
    """Per-request sampling settings: temperature [B] finite and ≥ 0, seed [B] ≥ 0; one-line errors."""
    if not bool(torch.isfinite(temperature).all()) or bool((temperature < 0).any()):
        raise DSparkTrtError("temperature must be finite and >= 0 (0 = greedy)")
    if bool((seed < 0).any()):
        raise DSparkTrtError("seed must be >= 0")


def check_truncation(top_k: torch.Tensor, top_p: torch.Tensor) -> None:
    """Per-request truncated sampling: top_k [B] ≥ 0 (0 = off), top_p [B] in (0, 1] (1 = off); one-line errors."""
    if bool((top_k < 0).any()):
        raise DSparkTrtError(f"top_k must be >= 0 (0 = off), got {int(top_k.min())}")
    if not bool(torch.isfinite(top_p).all()) or bool(((top_p <= 0) | (top_p > 1)).any()):
        raise DSparkTrtError("top_p must be in (0, 1] (1 = off)")


def check_context_budget(prompt_lengths: Sequence[int], max_new_tokens: int, max_context: int | None) -> None:
    """Refuse, before anything runs, a request whose prompt + ``max_new_tokens`` exceeds ``max_context`` (the
    graphs' or engines' KV bound; None: unbounded). One line naming the limit and the fix."""
    if max_context is None or not prompt_lengths:
        return
    longest = max(int(n) for n in prompt_lengths)
    if longest + int(max_new_tokens) > int(max_context):
        raise DSparkTrtError(f"prompt ({longest} tokens) + max_new_tokens ({int(max_new_tokens)}) exceeds the model's "
                             f"context of {int(max_context)} tokens; shorten the prompt or ask for at most "
                             f"{max(int(max_context) - longest, 0)} new tokens (an export's bound: dspark-export "
                             f"--max-context)")


def resolve_draft_options(c, topk: int | None, confidence_threshold: float | None, *, default_topk: int | None):
    """(top-k, threshold) for drafter config ``c``: ``None`` → ``default_topk``, 0 → dense; checked."""
    topk = default_topk if topk is None else (None if int(topk) == 0 else int(topk))
    if topk is not None and not 1 <= topk <= c.draft_vocab_size:
        raise DSparkTrtError(f"top-k {topk} must be in [1, draft_vocab_size={c.draft_vocab_size}]; use a smaller "
                             f"--topk or 'off'")
    if confidence_threshold is not None:
        if not 0.0 <= float(confidence_threshold) <= 1.0:
            raise DSparkTrtError(f"confidence_threshold must be in [0, 1], got {confidence_threshold}")
        if not c.enable_confidence_head:
            raise DSparkTrtError("this drafter has no confidence head; drop confidence_threshold")
    return topk, confidence_threshold


def resolve_verify_drafts(c, verify_drafts: int | str | None) -> int | str | None:
    """The cap on drafts verified per round: ``None`` (or N) verifies all N; an integer in 1 … N; or ``"auto"``
    (``verify_policy``: chosen each round from the measured verify cost and acceptance)."""
    if verify_drafts is None:
        return None
    N = c.num_draft_tokens
    if isinstance(verify_drafts, str) and verify_drafts.strip().lower() == "auto":
        return "auto"
    if isinstance(verify_drafts, bool) or not isinstance(verify_drafts, int) or not 1 <= verify_drafts <= N:
        raise DSparkTrtError(f"verify_drafts must be an integer in 1 … {N} (the drafter's block N) or 'auto', got "
                             f"{verify_drafts!r}; leave it unset to verify all {N}")
    return verify_drafts if verify_drafts < N else None


class SpeculativeDecoder:
    """Speculative decoding with a DSpark drafter, lossless with respect to the target.

    Args:
        target: a ``Target`` (e.g. ``HFTarget``).
        backend: a ``DrafterBackend`` (e.g. ``TorchDrafterBackend``) for a drafter trained for this target.
        tokenizer (*optional*): encodes string prompts and decodes outputs.

    Example:
        >>> dec = SpeculativeDecoder.from_pretrained("drafter/", "target/")
        >>> out = dec.generate([[1, 2, 3], [4, 5]], max_new_tokens=32)
        >>> out.tokens, out.stats.mean_acceptance_length
    """

    def __init__(self, target: Target, backend: DrafterBackend, *, tokenizer=None):
        self.target = target
        self.backend = backend
        self.config = backend.config
        self.tokenizer = tokenizer
        self.default_topk = self.config.draft_topk  # generate(topk=None); an export's own top-k in from_export
        check_pair(self.config, target)
        if self.config.has_reduced_vocab and getattr(backend, "d2t", None) is None:
            raise DSparkTrtError(f"backend {backend.name!r} does not expose the drafter's d2t table, needed for a "
                                 f"reduced draft vocabulary ({self.config.draft_vocab_size} < {self.config.vocab_size})")
        self._verify_policy = None  # verify_drafts="auto": built on first use (verify_policy)

    def verify_policy(self, batch: int | None = None):
        """The ``VerifyPolicy`` of ``verify_drafts="auto"``, with the verify cost of ``batch``'s bucket measured
        (at the batch being decoded: N widths, twice each, rolled back) the first time it is needed; the policy
        and its acceptance counts are kept on the decoder."""
        from .verify_policy import VerifyPolicy, measure_verify_costs

        N = self.config.num_draft_tokens
        if self._verify_policy is None:
            self._verify_policy = VerifyPolicy(N)
        if batch is not None and self._verify_policy.needs_cost(batch):
            self._verify_policy.set_cost(batch, measure_verify_costs(self.target, range(2, N + 2)))
        return self._verify_policy

    @classmethod
    def from_pretrained(cls, drafter_dir: str | Path, target_dir: str | Path | None = None, *,
                        backend: str = "torch", device=None, dtype=None, target_dtype=None, tokenizer: bool = True,
                        **backend_options) -> "SpeculativeDecoder":
        """Load the target (``HFTarget``), the drafter into backend ``backend``, and the target's tokenizer.

        ``target_dir`` defaults to the verifier a speculators drafter names, when that is a local directory."""
        from ..loader import resolve_target_dir

        target_dir = resolve_target_dir(drafter_dir, target_dir)
        if target_dir is None:
            raise DSparkTrtError(f"no target for {drafter_dir}: pass target_dir (the drafter names no local "
                                 f"verifier directory)")
        target = HFTarget.from_pretrained(target_dir, device=device, dtype=target_dtype or dtype)
        drafter = backend_class(backend).from_pretrained(drafter_dir, target_dir=target_dir, device=target.device,
                                                         dtype=dtype, **backend_options)
        return cls(target, drafter, tokenizer=load_tokenizer(target_dir) if tokenizer else None)

    @classmethod
    def from_export(cls, export_dir: str | Path, *, backend: str = "onnxruntime", device=None, tokenizer: bool = True,
                    **backend_options) -> "SpeculativeDecoder":
        """The exported target and drafter of a ``dspark-export`` directory, run by ``backend``
        (``onnxruntime``: the ONNX graphs), with the tokenizer from ``OUT/tokenizer/``; no transformers model."""
        from ..artifact.export_dir import ExportDir
        from .targets.base import target_class

        export = ExportDir(export_dir)
        export.target  # one line saying how to add it when absent
        target = target_class(backend).from_export(export_dir, device=device, **backend_options)
        drafter_cls = backend_class(backend)
        if not hasattr(drafter_cls, "from_export"):
            raise DSparkTrtError(f"drafter backend {backend!r} cannot run from an export directory; use "
                                 f"backend='onnxruntime'")
        drafter = drafter_cls.from_export(export_dir, device=device, **backend_options)
        tok = None
        if tokenizer and export.tokenizer_dir is not None:
            tok = load_tokenizer(export.tokenizer_dir)
        decoder = cls(target, drafter, tokenizer=tok)
        decoder.default_topk = export.topk  # the graphs draft with the export's top-k
        return decoder

    @property
    def max_context(self) -> int | None:
        """The longest sequence (prompt + new tokens) this decoder can hold: the smaller KV bound of its target and
        drafter graphs or engines (``--max-context`` of the export); None when neither has one (transformers)."""
        bounds = [getattr(self.target, "max_context", None), getattr(self.backend, "max_context", None)]
        bounds = [int(b) for b in bounds if b]
        return min(bounds) if bounds else None

    def check_context(self, inputs, max_new_tokens: int) -> None:
        """``check_context_budget`` for ``inputs`` (as ``generate`` takes them) against ``max_context``."""
        check_context_budget([len(p) for p in self._prompts(inputs)], max_new_tokens, self.max_context)

    @property
    def _d2t(self) -> torch.Tensor | None:
        return self.backend.d2t if self.config.has_reduced_vocab else None

    # -- inputs ---------------------------------------------------------------------------------------
    def _prompts(self, inputs) -> list[torch.Tensor]:
        if isinstance(inputs, str) or (isinstance(inputs, (list, tuple)) and inputs and isinstance(inputs[0], str)):
            texts = [inputs] if isinstance(inputs, str) else list(inputs)
            if self.tokenizer is None:
                raise DSparkTrtError("text prompts need a tokenizer, and the target directory has none; "
                                     "pass token ids instead (--input-ids)")
            inputs = [self.tokenizer.encode(t, add_special_tokens=False) for t in texts]
        if isinstance(inputs, torch.Tensor):
            inputs = [inputs] if inputs.dim() == 1 else list(inputs)
        elif isinstance(inputs, (list, tuple)) and inputs and isinstance(inputs[0], int):
            inputs = [inputs]
        if not isinstance(inputs, (list, tuple)) or not inputs:
            raise DSparkTrtError("no prompts given: pass a list of token-id lists (or text with a tokenizer)")
        V = self.target.vocab_size
        prompts = []
        for i, p in enumerate(inputs):
            t = torch.as_tensor(p, dtype=torch.int64).flatten()
            if t.numel() == 0:
                raise DSparkTrtError(f"prompt {i} is empty: every request needs at least one token")
            bad = t[(t < 0) | (t >= V)]
            if bad.numel():
                raise DSparkTrtError(f"prompt {i} has token id {int(bad[0])} outside the target vocabulary [0, {V}); "
                                     f"use ids from the target's tokenizer")
            prompts.append(t)
        return prompts

    def _per_request(self, value, B: int, name: str, dtype) -> torch.Tensor:
        values = list(value) if isinstance(value, (list, tuple)) else [value] * B
        if len(values) != B:
            raise DSparkTrtError(f"{name} has {len(values)} values for {B} requests; give one value or one per request")
        return torch.tensor(values, dtype=dtype, device=self.target.device)

    def _resolve_markov_topm(self, markov_topm, topk) -> int:
        """The candidate union's M for a round (0 = top-k only); one-line errors where it cannot apply.

        ``None`` → an export's own M (``backend.fixed_markov_topm``), else the drafter config's
        ``draft_markov_topm`` where it can apply (a top-k round on a union-capable backend), else 0."""
        c = self.config
        fixed = getattr(self.backend, "fixed_markov_topm", None)
        supports = getattr(self.backend, "supports_markov_topm", False)
        if markov_topm is None:
            if topk is None:
                markov_topm = 0
            elif fixed is not None:
                markov_topm = fixed
            else:
                markov_topm = c.draft_markov_topm if supports else 0
        markov_topm = int(markov_topm)
        if markov_topm:
            if not 0 < markov_topm <= c.draft_vocab_size:
                raise DSparkTrtError(f"--markov-topm {markov_topm} must be in [0, draft_vocab_size="
                                     f"{c.draft_vocab_size}]; use a smaller M")
            if topk is None:
                raise DSparkTrtError("--markov-topm needs a top-k head (the dense head already scores every token); "
                                     "pass --topk K or --markov-topm 0")
        if fixed is not None and topk is not None:  # an export: its M only (a top-k mismatch: the backend says so)
            from .drafters.base import check_export_variant

            check_export_variant("this export", have_topk=topk, have_markov_topm=fixed, topk=topk,
                                 markov_topm=markov_topm)
        if markov_topm and not supports:
            raise DSparkTrtError(f"the {self.backend.name} backend has no candidate union yet; use --backend "
                                 f"torch or --markov-topm 0")
        return markov_topm

    # -- generation -----------------------------------------------------------------------------------
    @torch.inference_mode()
    def generate(
        self,
        inputs,
        max_new_tokens: int = 64,
        *,
        temperature: float | Sequence[float] = 0.0,
        topk: int | None = None,
        seed: int | Sequence[int] = 0,
        eos_token_id: int | Sequence[int] | None = None,
        confidence_threshold: float | None = None,
        draft: bool = True,
        markov_topm: int | None = None,
        verify_drafts: int | None = None,
        top_p: float | Sequence[float] = 1.0,
        top_k: int | Sequence[int] = 0,
        stop: Sequence[str] | None = None,
    ) -> GenerationResult:
        """Generate up to ``max_new_tokens`` per request.

        Args:
            inputs: token ids (a list of lists, a 1-D list, a tensor [B, T] or a list of 1-D tensors), or text
                (a string or list of strings) when a tokenizer is available.
            temperature: < 1e-5 is greedy; one value or one per request.
            topk (*optional*): candidates per draft slot for the top-k Markov head; ``None`` uses the drafter
                config's ``draft_topk`` (dense when unset; an export's own top-k with ``from_export``), ``0``
                forces dense.
            seed: noise key, ≥ 0; one value or one per request. Results do not depend on the batch.
            eos_token_id (*optional*): stop ids; ``None`` uses the target's, ``[]`` never stops early.
            confidence_threshold (*optional*): verify only the leading drafts whose confidence is ≥ this.
            draft: ``False`` runs the target alone with the same sampler (the baseline).
            verify_drafts (*optional*): verify at most this many drafts per round (1 … N; default all N). Where a
                target forward costs more with more tokens (a CPU: ``dspark bench report``'s verification cost),
                verifying only the drafts likely to be accepted is faster; the output is the same. ``"auto"``
                chooses it each round from the verify cost measured on this machine (once per decoder and batch
                bucket, on first use) and the acceptance seen so far (``runtime/verify_policy.py``).
            markov_topm: M > 0 adds the candidate union: each slot also scores the M tokens the Markov head
                favours most after its predecessor (needs a top-k; torch backend, or an export made with
                ``dspark-export --markov-topm M``); 0 = top-k only; ``None`` uses an export's own M, else the
                config's ``draft_markov_topm`` where it applies (a top-k round on a union-capable backend).
            top_p, top_k: truncated sampling of the *target's* distribution at temperature T (nucleus / top-k;
                1 and 0 = off; one value or one per request); lossless: the output follows the truncated target
                exactly (``reference/sampling.py``). Not ``topk``, which sizes the drafter's candidate sets.
            stop (*optional*): stop strings (up to 4; needs the tokenizer): a request ends when its text holds
                one; its tokens end with the first token that completes it and its text is cut before it.
        """
        prompts = self._prompts(inputs)
        B = len(prompts)
        if int(max_new_tokens) < 1:
            raise DSparkTrtError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        check_context_budget([len(p) for p in prompts], max_new_tokens, self.max_context)
        temp = self._per_request(temperature, B, "temperature", torch.float32)
        seeds = self._per_request(seed, B, "seed", torch.int64)
        check_sampling(temp, seeds)
        tks = self._per_request(top_k, B, "top_k", torch.int64)
        tps = self._per_request(top_p, B, "top_p", torch.float32)
        check_truncation(tks, tps)
        topk, confidence_threshold = resolve_draft_options(self.config, topk, confidence_threshold,
                                                           default_topk=self.default_topk)
        markov_topm = self._resolve_markov_topm(markov_topm, topk)
        eos = self.target.eos_token_ids if eos_token_id is None else (
            (eos_token_id,) if isinstance(eos_token_id, int) else tuple(eos_token_id))
        stops = self.stop_check(stop) if stop else None
        requests = [_Request(i, p, int(max_new_tokens), float(t), int(s), eos, stop=stops, top_k=k, top_p=tp)
                    for i, (p, t, s, k, tp) in enumerate(zip(prompts, temp.tolist(), seeds.tolist(), tks.tolist(),
                                                             tps.tolist()))]
        run = _Run(self, topk, confidence_threshold, draft, requests=B,
                   verify_cap=resolve_verify_drafts(self.config, verify_drafts))
        run.union = {"markov_topm": markov_topm} if markov_topm else {}  # only union-capable backends see it
        stats = run.loop(requests)
        out = [r.out for r in requests]
        texts = None
        if self.tokenizer is not None:
            texts = [self.tokenizer.decode(t, skip_special_tokens=False) for t in out]
            if stop:
                texts = [StopStrings(stop).cut(t) for t in texts]
        return GenerationResult(tokens=out, stats=stats, texts=texts)

    def stop_check(self, stop):
        """The ``_Request`` stop check for stop strings ``stop`` (needs the tokenizer)."""
        stops = StopStrings(stop)
        if self.tokenizer is None:
            raise DSparkTrtError("stop strings need the target's tokenizer, and this model has none; stop on token "
                                 "ids instead (eos_token_id / end_id)")
        tokenizer = self.tokenizer
        return lambda out, start: stops.tokens_through(tokenizer, out, start)


class _Request:
    """One request inside a ``_Run``: its settings and the tokens it has emitted so far.

    ``stop``: an optional check ``stop(out, start) -> keep | None`` run after each round's tokens (``start``:
    tokens before them); ``keep`` ends the request there (stop strings, ``runtime/stop.py``)."""

    def __init__(self, rid: int, prompt: torch.Tensor, max_new: int, temperature: float, seed: int, eos, *,
                 stop=None, top_k: int = 0, top_p: float = 1.0):
        self.id, self.prompt, self.max_new, self.temperature, self.seed = rid, prompt, max_new, temperature, seed
        self.top_k, self.top_p = int(top_k), float(top_p)  # truncated sampling (0 / 1 = off)
        self.eos = set(eos)
        self.stop = stop
        self.out: list[int] = []
        self.finish: str | None = None  # "stop" (EOS or a stop string) or "length", once finished
        self.rounds = self.drafted = self.accepted = 0  # this request's share of the stats
        self.max_batch = 0  # the most requests decoded together in a round while this one was active

    def emit(self, tokens: list[int]) -> bool:
        """Append new tokens (up to EOS / the budget / a stop string); True when the request is finished."""
        start = len(self.out)
        for t in tokens:
            self.out.append(t)
            if t in self.eos or len(self.out) >= self.max_new:
                self.finish = "stop" if t in self.eos else "length"
                break
        if self.stop is not None:
            keep = self.stop(self.out, start)
            if keep is not None:
                del self.out[keep:]
                self.finish = "stop"
        return self.finish is not None


class _Run:
    """A batch of requests being decoded: the round logic shared by ``generate`` and ``RequestScheduler``.

    ``admit`` prefills new requests into the batch (at a round boundary), ``step`` runs one round for every
    active request, finished requests leave the batch; ``loop`` runs until the batch is empty.
    """

    def __init__(self, dec: SpeculativeDecoder, topk, threshold, draft, *, requests: int = 0,
                 verify_cap: int | None = None):
        self.dec, self.topk, self.threshold, self.speculative = dec, topk, threshold, draft
        self.verify_cap = verify_cap  # at most this many drafts verified per round (None: all N)
        self.union: dict = {}  # {"markov_topm": M} with the candidate union
        self.on_round = None  # optional on_round(drafted, accepted): per-request lists after each round
        self.requests: dict[int, _Request] = {}  # active requests by id
        self.rows = torch.zeros(0, dtype=torch.int64)  # request id of each active batch row
        self.temp_rows = torch.zeros(0, dtype=torch.float32, device=dec.target.device)  # [B] per row
        self.seed_rows = torch.zeros(0, dtype=torch.int64, device=dec.target.device)  # [B] per row
        self.top_k_rows = torch.zeros(0, dtype=torch.int64, device=dec.target.device)  # [B] per row, 0 = off
        self.top_p_rows = torch.zeros(0, dtype=torch.float32, device=dec.target.device)  # [B] per row, 1 = off
        self.anchor = torch.zeros(0, dtype=torch.int64)  # [B] last emitted token: the next round's anchor
        self.state: DrafterState | None = None
        self.stats = GenerationStats(speculative=draft, num_draft_tokens=dec.config.num_draft_tokens,
                                     requests=requests)
        self.clock = Stopwatch(self.stats, dec.target.device)
        self.monitor = NonFiniteMonitor(dec.config, drafter_dtype=getattr(dec.backend, "dtype", None))

    # per-row views of the per-request settings
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

    def _emit(self, row: int, tokens: list[int]) -> bool:
        """Append a request's new tokens (up to EOS / the budget); True when the request is finished."""
        return self.requests[int(self.rows[row])].emit(tokens)

    def _record(self, n: torch.Tensor, accepted: torch.Tensor) -> None:
        """Stats of one round: n, accepted [B] per row."""
        self.stats.record_round(n, accepted)
        B = len(self.rows)
        drafted, accepted = n.tolist(), accepted.tolist()
        for rid, d, a in zip(self.rows.tolist(), drafted, accepted):
            r = self.requests[rid]
            r.rounds, r.drafted, r.accepted, r.max_batch = r.rounds + 1, r.drafted + d, r.accepted + a, max(r.max_batch, B)
        if self.on_round is not None:
            self.on_round(drafted, accepted)

    def loop(self, requests: list[_Request]) -> GenerationStats:
        import time

        start = time.perf_counter()
        finished = self.admit(requests)
        while self.rows.numel():
            finished += self.step()
        self.stats.generated_tokens = sum(len(r.out) for r in finished)
        self.stats.total_seconds = time.perf_counter() - start
        return self.stats

    def admit(self, requests: list[_Request]) -> list[_Request]:
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

    def step(self) -> list[_Request]:
        """One round for every active request; returns the requests that finished (they left the batch)."""
        anchor, done = self._speculative_step(self.anchor) if self.speculative else self._target_step(self.anchor)
        self.anchor = anchor
        with self.clock("other"):
            return self._drop(done)

    def remove(self, ids) -> list[_Request]:
        """Take requests out of the batch at a round boundary (e.g. cancelled); returns them."""
        ids = set(ids)
        return self._drop([rid in ids for rid in self.rows.tolist()])

    def _target_step(self, anchor: torch.Tensor):
        target = self.dec.target
        with self.clock("verify"):
            p = target.lengths.clone()  # anchor position
            logits = target.verify(anchor.view(-1, 1).to(target.device), with_taps=False).logits  # [B, 1, V]
            nxt = sample_tokens(logits[:, 0], self.temp, self.seed, p + 1, **self.truncation)  # [B]
        with self.clock("other"):
            target.commit(torch.ones_like(p))
            self._record(torch.zeros_like(p), torch.zeros_like(p))
            done = [self._emit(b, [t]) for b, t in enumerate(nxt.tolist())]
        return nxt, done

    def _speculative_step(self, anchor: torch.Tensor):
        dec, target, backend, state = self.dec, self.dec.target, self.dec.backend, self.state
        started = time.perf_counter()
        N = dec.config.num_draft_tokens
        with self.clock("draft"):
            ctx_k, ctx_v = state.context()
            ctx_len = state.ctx_len  # [B] anchor position p
            res = backend.draft(anchor.to(state.k.device), ctx_k, ctx_v, ctx_len, topk=self.topk,
                                temperature=self.temp, seed=self.seed, ctx_start=state.start, **self.union)
            self.monitor.draft(res, self.rows)  # non-finite inputs or logits: one warning per request
        with self.clock("verify"):
            drafts = res.tokens.to(target.device)  # [B, N]
            n = torch.full((drafts.shape[0],), N, dtype=torch.int64, device=target.device)  # [B] drafts to verify
            if self.threshold is not None:
                sure = (res.confidence.to(target.device) >= self.threshold).to(torch.int64)  # [B, N]
                n = torch.cumprod(sure, dim=1).sum(1)
            policy = dec.verify_policy(len(n)) if self.verify_cap == "auto" else None
            if policy is not None:
                n = n.clamp_max(policy.choose(len(n)))
            elif self.verify_cap is not None:
                n = n.clamp_max(self.verify_cap)
            room = getattr(target, "verify_room", None)
            if dec.max_context is not None and room is not None:  # near the KV bound: verify fewer (lossless)
                n = n.clamp_max(max(room(dec.max_context, int(n.max()) + 1) - 1, 0))
            width = int(n.max()) + 1
            cand = draft_to_target(res.cand_ids, dec._d2t).to(target.device)  # [B, N, k] target ids
            q = draft_probs(res.cand_logits.to(target.device), cand, drafts, self.temp)  # [B, N, k]
            fed = torch.cat((anchor.view(-1, 1).to(target.device), drafts[:, : width - 1]), dim=1)  # [B, W]
            ver = target.verify(fed)  # logits [B, W, V], taps [B, W, m·d]
            p = ctx_len.to(target.device)
            accepted = torch.zeros_like(n)
            emitted = torch.full((fed.shape[0], N + 1), -1, dtype=torch.int64, device=target.device)
            temp, seed, truncation = self.temp, self.seed, self.truncation
            for m in torch.unique(n).tolist():  # requests verifying the same number of drafts, together
                rows = (n == m).nonzero().view(-1)
                r = verify_drafts(ver.logits[rows, : m + 1], drafts[rows, :m], cand[rows, :m], q[rows, :m],
                                  temperature=None if temp is None else temp[rows], seed=seed[rows],
                                  positions=p[rows] + 1, **{k: v[rows] for k, v in truncation.items()})
                accepted[rows] = r.num_accepted
                emitted[rows, : m + 1] = r.tokens
        with self.clock("other"):
            target.commit(accepted + 1)  # the anchor and the accepted drafts stay; rejected drafts roll back
            self._record(n, accepted)
            nxt = emitted.gather(1, accepted.view(-1, 1)).squeeze(1)  # [B] the correction / bonus token
            done = [self._emit(b, row[: a + 1]) for b, (row, a) in enumerate(zip(emitted.tolist(), accepted.tolist()))]
        with self.clock("draft"):
            W = fed.shape[1]
            pos = p.view(-1, 1) + torch.arange(W, device=p.device)  # [B, W] positions of a, d_1, ...
            k, v = backend.context_kv(ver.taps, pos)
            self.monitor.context(ver.taps, k, v, accepted + 1, self.rows)
            state.append(k, v, (accepted + 1).to(state.ctx_len.device))
        if policy is not None:
            policy.observe(n, accepted, time.perf_counter() - started, fed.shape[1])
        return nxt, done

    def _drop(self, done: list[bool]) -> list[_Request]:
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


def load_tokenizer(target_dir: str | Path):
    """The target's tokenizer when its directory has one (offline), else None."""
    target_dir = Path(target_dir)
    if not any((target_dir / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(target_dir, local_files_only=True)
    except Exception as e:  # a broken tokenizer should not block token-id generation
        log.warning("ignoring the tokenizer in %s (%s)", target_dir, str(e).splitlines()[0] if str(e) else e)
        return None
