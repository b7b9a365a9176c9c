"""The served model's Prometheus metrics (Triton Python-backend custom metrics, on Triton's metrics port).

One ``ModelMetrics`` per model instance, labelled ``model``, ``version`` and ``instance``::

    dspark_drafted_tokens_total        counter    drafts shown to the verifier
    dspark_accepted_tokens_total       counter    drafts accepted
    dspark_request_rounds_total        counter    request-rounds (one per request per round)
    dspark_generated_tokens_total      counter    tokens returned (after EOS / stop / max_tokens cuts)
    dspark_acceptance_length           histogram  per round: tokens per request-round, averaged over its batch
    dspark_batch_size                  histogram  per round: requests decoded together
    dspark_requests_in_flight          gauge      requests in the batch
    dspark_requests_queued             gauge      requests waiting for a batch row
    dspark_requests_finished_total     counter    by finish_reason: stop, length, cancelled, error
    dspark_requests_rejected_total     counter    by reason: invalid_argument, server_busy (never decoded)
    dspark_requests_failed_total       counter    by reason: decoding_error, internal_error

The mean acceptance length over any interval is exact from the counters:
``1 + Δaccepted / Δrequest_rounds`` (what ``generate`` reports as ``mean_acceptance_length``). Triton's own
``nv_inference_request_failure`` does not count requests the model answers with an error response, so the
rejected and failed counters here are where they show. ``pb`` is ``triton_python_backend_utils`` (passed in:
nothing here imports Triton).
"""

from __future__ import annotations

__all__ = ["ModelMetrics", "REJECT_REASONS", "FAIL_REASONS", "FINISH_REASONS"]

REJECT_REASONS = ("invalid_argument", "server_busy")
FAIL_REASONS = ("decoding_error", "internal_error")
FINISH_REASONS = ("stop", "length", "cancelled", "error")


class ModelMetrics:
    """The metric families and this instance's metrics; every update is one call on the metric."""

    def __init__(self, pb, labels: dict[str, str], *, num_draft_tokens: int, max_batch_size: int):
        family = pb.MetricFamily
        self._families = []  # kept alive: a family must outlive its metrics

        def make(name, description, kind, extra=None, buckets=None):
            fam = next((f for n, f in self._families if n == name), None)
            if fam is None:
                fam = family(name=name, description=description, kind=kind)
                self._families.append((name, fam))
            options = {"labels": {**labels, **(extra or {})}}
            if buckets is not None:
                options["buckets"] = buckets
            return fam.Metric(**options)

        C, G, H = family.COUNTER, family.GAUGE, family.HISTOGRAM
        self.drafted = make("dspark_drafted_tokens_total", "Drafts shown to the verifier", C)
        self.accepted = make("dspark_accepted_tokens_total", "Drafts the verifier accepted", C)
        self.request_rounds = make("dspark_request_rounds_total", "Request-rounds (one per request per round)", C)
        self.generated = make("dspark_generated_tokens_total", "Tokens returned to clients", C)
        N = int(num_draft_tokens)
        self.acceptance = make("dspark_acceptance_length", "Tokens per request-round, mean over a round's batch",
                               H, buckets=[1.0 + 0.5 * i for i in range(2 * N + 1)])
        sizes = sorted({2**i for i in range(max_batch_size.bit_length()) if 2**i < max_batch_size} | {max_batch_size})
        self.batch = make("dspark_batch_size", "Requests decoded together in a round", H,
                          buckets=[float(b) for b in sizes])
        self.in_flight = make("dspark_requests_in_flight", "Requests in the decoding batch", G)
        self.queued = make("dspark_requests_queued", "Requests waiting for a batch row", G)
        self.finished = {r: make("dspark_requests_finished_total", "Requests finished, by finish_reason", C,
                                 {"finish_reason": r}) for r in FINISH_REASONS}
        self.rejected = {r: make("dspark_requests_rejected_total", "Requests refused before decoding, by reason",
                                 C, {"reason": r}) for r in REJECT_REASONS}
        self.failed = {r: make("dspark_requests_failed_total", "Requests that failed, by reason", C,
                               {"reason": r}) for r in FAIL_REASONS}

    def round(self, drafted: list[int], accepted: list[int]) -> None:
        """One decoding round: per request of the batch, drafts verified and accepted."""
        B = len(drafted)
        if not B:
            return
        self.drafted.increment(float(sum(drafted)))
        self.accepted.increment(float(sum(accepted)))
        self.request_rounds.increment(float(B))
        self.acceptance.observe(1.0 + sum(accepted) / B)
        self.batch.observe(float(B))

    def load(self, in_flight: int, queued: int) -> None:
        self.in_flight.set(float(in_flight))
        self.queued.set(float(queued))

    def finish(self, reason: str, tokens: int) -> None:
        if reason in self.finished:
            self.finished[reason].increment(1.0)
        if tokens:
            self.generated.increment(float(tokens))

    def reject(self, reason: str) -> None:
        self.rejected[reason].increment(1.0)

    def fail(self, reason: str) -> None:
        self.failed[reason].increment(1.0)
