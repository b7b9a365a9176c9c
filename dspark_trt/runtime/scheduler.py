"""In-flight batching: requests join a running ``SpeculativeDecoder`` batch between rounds and leave when done.

    sched = RequestScheduler(decoder)                      # topk / confidence threshold: scheduler-wide
    h = sched.submit([1, 2, 3], max_new_tokens=32, temperature=1.0, seed=7, on_update=callback)
    sched.start()                                          # a background thread runs rounds while work exists
    h.wait(); h.tokens, h.finish_reason                    # or stream: callback(h, new_tokens, finished)
    h.cancel()                                             # leaves at the next round boundary

One iteration of the loop (``step``): take the requests cancelled since the last round out of the batch,
prefill the requests submitted since then into it (``Target.extend``, ``DrafterState.join``), run one
round of the decoder (the same ``Batch`` as ``SpeculativeDecoder.generate``), then hand every
request its newly committed tokens; finished requests (EOS, ``max_new_tokens``) leave the batch.

Requests are independent — own lengths, temperatures, seeds; noise keyed by (seed, position, token); a
hole-masked target cache — so each request gets exactly the tokens ``generate`` gives it alone, whoever
else shares its rounds. Callbacks run on the loop thread: keep them short (queue or send, never block).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ..errors import DSparkTrtError, ServerBusy
from ..topk import DEFAULT_TOPK
from .batch import Batch
from .decoder import SpeculativeDecoder
from .draft_options import resolve_draft_options, resolve_verify_drafts
from .requests import (Request, check_context_budget, check_max_new_tokens, check_sampling, check_truncation,
                       eos_ids)

__all__ = ["RequestScheduler", "RequestHandle", "SchedulerStats"]

log = logging.getLogger("dspark")

#: on_update(handle, new_tokens, finished): the tokens committed for this request in the last round
UpdateCallback = Callable[["RequestHandle", list, bool], None]
#: on_round(drafted, accepted): one round's drafts verified and accepted, one entry per request in the batch
RoundCallback = Callable[[list, list], None]
#: a request in this many failed batches fails even when its rounds alone succeed
MAX_STRIKES = 3


class RequestHandle:
    """A submitted request: its tokens so far, how it ended, its acceptance statistics; ``cancel()``."""

    def __init__(self, rid: int, request: Request, on_update: UpdateCallback | None):
        self.id = rid
        self._request = request
        self._on_update = on_update
        self._sent = 0
        self._done = threading.Event()
        self.cancelled = False
        self.finish_reason: str | None = None  # "stop" (EOS / stop string), "length", "cancelled", "error"
        self.error: BaseException | None = None
        self.strikes = 0  # failed batches this request was in

    @property
    def tokens(self) -> list[int]:
        return list(self._request.out)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def prompt_length(self) -> int:
        return len(self._request.prompt)

    @property
    def rounds(self) -> int:
        return self._request.rounds

    @property
    def drafted(self) -> int:
        return self._request.drafted

    @property
    def accepted(self) -> int:
        return self._request.accepted

    @property
    def mean_acceptance_length(self) -> float:
        r = self._request
        return (r.accepted + r.rounds) / r.rounds if r.rounds else 0.0

    @property
    def max_batch(self) -> int:
        """The most requests decoded together in one round while this request was in the batch."""
        return self._request.max_batch

    def cancel(self) -> None:
        """Leave the batch at the next round boundary (no effect once finished)."""
        self.cancelled = True

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def _deliver(self, finished: bool) -> None:
        out = self._request.out
        new, self._sent = out[self._sent:], len(out)
        if finished:
            r = self._request
            self.finish_reason = self.finish_reason or r.finish or ("stop" if out and out[-1] in r.eos else "length")
        if (new or finished) and self._on_update is not None:
            try:
                self._on_update(self, new, finished)
            except Exception:  # a client's callback must not stop the batch
                log.exception("request %d: on_update callback failed", self.id)
        if finished:
            self._done.set()


@dataclass
class SchedulerStats:
    """What the loop did: iterations, requests, and how many requests shared each round."""

    steps: int = 0
    requests: int = 0
    finished: int = 0
    cancelled: int = 0
    failed: int = 0
    rejected: int = 0  # refused by max_queue (ServerBusy)
    generated_tokens: int = 0
    drafted: int = 0  # drafts verified, all requests
    accepted: int = 0
    batch_sizes: Counter = field(default_factory=Counter)  # batch size → rounds run with it

    @property
    def max_batch(self) -> int:
        return max(self.batch_sizes, default=0)

    @property
    def mean_batch(self) -> float:
        n = sum(self.batch_sizes.values())
        return sum(b * c for b, c in self.batch_sizes.items()) / n if n else 0.0

    def summary(self) -> str:
        return (f"{self.requests} requests ({self.finished} finished, {self.cancelled} cancelled, {self.failed} "
                f"failed), {self.generated_tokens} tokens in {self.steps} rounds, batch mean {self.mean_batch:.2f} "
                f"max {self.max_batch}")


class RequestScheduler:
    """Continuous batching over one ``SpeculativeDecoder`` (see the module docstring).

    Args:
        decoder: the decoder; its target must implement ``extend`` (``HFTarget`` does).
        topk (*optional*): candidates per draft slot, as in ``generate`` (``DEFAULT_TOPK``: the drafter's own;
            None: dense).
        confidence_threshold (*optional*): as in ``generate``.
        verify_drafts (*optional*): as in ``generate``.
        draft (bool, defaults to True): ``False`` decodes with the target alone (the baseline).
        max_batch_size (int, defaults to 64): requests decoded together; later ones wait for a free row.
        max_context (*optional*): refuse requests whose prompt + ``max_new_tokens`` exceeds this
            (default: the decoder's ``max_context``, the KV bound of an export's graphs or engines).
        max_queue (*optional*): how many requests may wait for a batch row; ``submit`` refuses the next one
            with ``ServerBusy`` (default: no bound).
        on_round (*optional*): ``on_round(drafted, accepted)`` after every round, on the loop thread, with one
            entry per request of the round (metrics; keep it short).

    A round that raises fails only the request(s) that make it fail (``_recover``): the others resume in a
    new batch and still get exactly their ``generate`` tokens.
    """

    def __init__(self, decoder: SpeculativeDecoder, *, topk: int | str | None = DEFAULT_TOPK,
                 confidence_threshold: float | None = None, draft: bool = True, max_batch_size: int = 64,
                 max_context: int | None = None, verify_drafts: int | None = None, max_queue: int | None = None,
                 on_round: RoundCallback | None = None):
        if not callable(getattr(decoder.target, "extend", None)):
            raise DSparkTrtError(f"{type(decoder.target).__name__} has no extend(prompts): in-flight batching needs "
                                 f"a target that can add requests to a running batch (HFTarget can)")
        if int(max_batch_size) < 1:
            raise DSparkTrtError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.decoder = decoder
        self.topk, self.confidence_threshold = resolve_draft_options(
            decoder.config, topk, confidence_threshold, default_topk=getattr(decoder, "default_topk", None))
        self.verify_cap = resolve_verify_drafts(decoder.config, verify_drafts)
        self.draft = draft
        self.max_batch_size = int(max_batch_size)
        if max_queue is not None and int(max_queue) < 0:
            raise DSparkTrtError(f"max_queue must be >= 0 (requests allowed to wait), got {max_queue}")
        self.max_queue = None if max_queue is None else int(max_queue)
        self.on_round = on_round
        self.max_context = max_context if max_context is not None else decoder.max_context
        self.stats = SchedulerStats()
        self._run: Batch | None = None
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._pending: list[RequestHandle] = []  # submitted, not yet in the batch
        self._active: dict[int, RequestHandle] = {}  # in the batch
        self._thread: threading.Thread | None = None
        self._stopping = False

    # -- submitting ---------------------------------------------------------------------------------------
    def submit(self, prompt, max_new_tokens: int = 64, *, temperature: float = 0.0, seed: int = 0,
               eos_token_id: int | Sequence[int] | None = None, stop: Sequence[str] | None = None,
               top_p: float = 1.0, top_k: int = 0, on_update: UpdateCallback | None = None) -> RequestHandle:
        """Queue one request (thread-safe); it joins the batch at the next round boundary.

        Args as in ``SpeculativeDecoder.generate`` for one request (``prompt``: token ids, or text with a
        tokenizer). Invalid requests raise ``DSparkTrtError`` here, before anything runs; ``ServerBusy`` when
        ``max_queue`` requests already wait.
        """
        dec = self.decoder
        nested = isinstance(prompt, (list, tuple)) and any(isinstance(t, (list, tuple, str)) for t in prompt)
        prompts = dec.prompts([prompt] if isinstance(prompt, (list, tuple)) and not nested else prompt)
        if len(prompts) != 1 or nested:
            raise DSparkTrtError(f"submit takes one prompt, got {len(prompts)}; submit each request separately")
        tokens = prompts[0]
        check_max_new_tokens(max_new_tokens)
        check_sampling(torch.tensor([float(temperature)]), torch.tensor([int(seed)]))
        check_truncation(torch.tensor([int(top_k)]), torch.tensor([float(top_p)]))
        stops = dec.stop_check(stop) if stop else None
        check_context_budget([len(tokens)], max_new_tokens, self.max_context)
        eos = eos_ids(eos_token_id, dec.target.eos_token_ids)
        rid = next(self._ids)
        request = Request(rid, tokens, int(max_new_tokens), float(temperature), int(seed), eos, stop=stops,
                           top_k=int(top_k), top_p=float(top_p))
        handle = RequestHandle(rid, request, on_update)
        with self._lock:
            if self._stopping:
                raise DSparkTrtError("the scheduler is stopped; create a new one")
            if self.max_queue is not None:
                free = max(self.max_batch_size - len(self._active), 0)  # rows the next round boundary fills
                waiting = len(self._pending) - free
                if waiting >= self.max_queue:
                    self.stats.rejected += 1
                    raise ServerBusy(f"server busy: {waiting} request(s) already wait for a batch row (max_queue "
                                     f"{self.max_queue}, max_batch_size {self.max_batch_size}); retry later")
            self._pending.append(handle)
            self.stats.requests += 1
            self._wake.notify()
        return handle

    @property
    def busy(self) -> bool:
        with self._lock:
            return bool(self._pending or self._active)

    def load(self) -> tuple[int, int]:
        """(requests in the batch, requests waiting to join it)."""
        with self._lock:
            return len(self._active), len(self._pending)

    # -- the loop -----------------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> bool:
        """One iteration: cancellations out, new requests in, one round, tokens delivered. False when idle."""
        with self._lock:
            if self._stopping:
                for h in [*self._pending, *self._active.values()]:
                    h.cancel()
            joining_cancelled = [h for h in self._pending if h.cancelled]
            waiting = [h for h in self._pending if not h.cancelled]
            room = max(self.max_batch_size - len(self._active), 0)
            joining, self._pending = waiting[:room], waiting[room:]
        run = self._run
        cancelled = [h for h in self._active.values() if h.cancelled]
        try:
            if cancelled:
                run.remove([h.id for h in cancelled])
            for h in cancelled + joining_cancelled:
                self._active.pop(h.id, None)
                self._finish(h, "cancelled")
            if joining:
                if run is None or not self._active:
                    run = self._run = self._new_run()
                self._active.update((h.id, h) for h in joining)
                self._collect(run.admit([h._request for h in joining]))
            if not self._active:
                return bool(self._pending)
            self._count_round(len(self._active))
            self._collect(run.step())
        except Exception as e:  # a failed round fails the request(s) that make it fail, never the loop
            self._recover(list(self._active.values()), e)
        for h in self._active.values():
            h._deliver(False)
        return bool(self._active or self._pending)

    def _new_run(self) -> Batch:
        run = Batch(self.decoder, self.topk, self.confidence_threshold, self.draft, verify_cap=self.verify_cap)
        run.on_round = self._on_round
        return run

    def _on_round(self, drafted: list, accepted: list) -> None:
        self.stats.drafted += sum(drafted)
        self.stats.accepted += sum(accepted)
        if self.on_round is not None:
            try:
                self.on_round(drafted, accepted)
            except Exception:  # metrics must not stop the batch
                log.exception("on_round callback failed")

    def _count_round(self, batch: int) -> None:
        self.stats.batch_sizes[batch] += 1
        self.stats.steps += 1

    def _recover(self, handles: list[RequestHandle], error: BaseException) -> None:
        """A round (or a prefill) of ``handles`` raised: the batch is dropped, and each request runs one round
        alone. Those that raise again fail (alone, with their own error); the others resume together in a
        new batch from the tokens they have (``Batch.admit``), so they still get exactly their ``generate``
        tokens. A request in ``MAX_STRIKES`` failed batches fails too (a fault that needs the whole batch)."""
        self._run = None
        self._active.clear()
        for h in handles:
            h.strikes += 1
        if len(handles) == 1:
            log.error("request %d failed in a round: %s: %s", handles[0].id, type(error).__name__, error)
            self._fail(handles[0], error)
            return
        log.warning("a round of %d requests failed (%s: %s); running each alone to find the failing one(s)",
                    len(handles), type(error).__name__, error)
        survivors = []
        for h in handles:
            if h.cancelled:
                self._finish(h, "cancelled")
                continue
            if h.strikes >= MAX_STRIKES:
                log.error("request %d failed in %d batches; failing it", h.id, h.strikes)
                self._fail(h, error)
                continue
            alone = self._new_run()
            self._active[h.id] = h
            try:
                finished = alone.admit([h._request])
                if not finished:
                    self._count_round(1)
                    finished = alone.step()
            except Exception as e:
                self._active.pop(h.id)
                log.error("request %d fails its round alone: %s: %s", h.id, type(e).__name__, e)
                self._fail(h, e)
                continue
            if finished:
                self._collect(finished)
            else:
                self._active.pop(h.id)
                survivors.append(h)
        if not survivors:
            return
        run = self._run = self._new_run()
        self._active.update((h.id, h) for h in survivors)
        try:
            self._collect(run.admit([h._request for h in survivors]))  # resumed where each one was
        except Exception as e:
            self._recover(survivors, e)

    def _fail(self, h: RequestHandle, error: BaseException) -> None:
        h.error = error
        self._finish(h, "error")

    def _collect(self, finished) -> None:
        for r in finished:
            h = self._active.pop(r.id)
            self.stats.finished += 1
            self.stats.generated_tokens += len(r.out)
            h._deliver(True)

    def _finish(self, h: RequestHandle, reason: str) -> None:
        h.finish_reason = reason
        if reason == "cancelled":
            self.stats.cancelled += 1
        elif reason == "error":
            self.stats.failed += 1
        h._deliver(True)

    def run_until_idle(self) -> None:
        """Run rounds on this thread until no request is pending or active."""
        while self.step():
            pass

    def start(self) -> None:
        """Run the loop on a background thread: rounds while there is work, asleep otherwise."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._serve, name="dspark-scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Cancel everything not finished, let the loop drain, and stop the thread."""
        with self._lock:
            self._stopping = True  # the loop cancels every request at its next step
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        else:
            self.run_until_idle()

    def _serve(self) -> None:
        while True:
            with self._lock:
                while not (self._pending or self._active or self._stopping):
                    self._wake.wait()
                if self._stopping and not (self._pending or self._active):
                    return
            try:
                self.step()
            except Exception:  # never let the loop thread die
                log.exception("scheduler step failed")
                time.sleep(0.01)
