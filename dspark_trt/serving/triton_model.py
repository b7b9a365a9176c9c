"""The Triton Python-backend model (decoupled): tensors in, ``RequestScheduler`` calls, responses out.

The repository's ``model.py`` re-exports ``TritonPythonModel`` from here. No decoding logic: ``execute``
checks each request (``protocol.parse_request``), submits it to the library's scheduler and returns at
once; the scheduler's own thread runs the rounds (in-flight batching: requests join between rounds) and
calls back with each request's newly committed tokens, which become responses — one per round with
``stream=true``, else one at the end. A closed stream is polled (``is_cancelled``) on every callback and
cancels the request. Errors are responses, never exceptions that take the instance down: a bad request is
INVALID_ARG, a full queue (``max_queue``) UNAVAILABLE ("server busy"), a request whose round raises
INTERNAL (alone: the scheduler isolates it). Each instance reports its Prometheus metrics
(``serving/metrics.py``) and, with several GPU instances, runs on the GPU Triton gives it.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np

from ..errors import DSparkTrtError, ServerBusy
from ..runtime.stop import StopText
from .protocol import INPUTS, parse_request

__all__ = ["TritonPythonModel"]


class TritonPythonModel:
    def initialize(self, args):
        import triton_python_backend_utils as pb_utils

        from dataclasses import replace

        from .faults import install_from_env
        from .served_decoder import build_scheduler
        from .settings import ModelSettings

        self.pb = pb_utils
        self.log = pb_utils.Logger
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException(
                "the dspark model is decoupled: set model_transaction_policy { decoupled: true } in config.pbtxt "
                "(dspark triton-repo writes it)")
        params = {k: v.get("string_value", "") for k, v in (config.get("parameters") or {}).items()}
        try:
            version_dir = Path(args["model_repository"]) / str(args["model_version"])  # relative paths: --copy
            settings = ModelSettings.from_parameters(params).resolved(version_dir)
            if args.get("model_instance_kind") == "GPU" and settings.device == "cuda":  # --gpus: this instance's
                settings = replace(settings, device=f"cuda:{int(args.get('model_instance_device_id', 0))}")
            self.settings = settings
            self.scheduler = build_scheduler(self.settings)
        except DSparkTrtError as e:
            raise pb_utils.TritonModelException(f"dspark: {e}") from None
        self.decoder = self.scheduler.decoder
        self.vocab_size = self.decoder.target.vocab_size
        fault = install_from_env(self.decoder)  # off unless $DSPARK_TRT_FAULT_POSITION is set (faults.py)
        if fault is not None:
            self.log.log_warn(f"dspark: fault injection on: rounds of requests at position >= {fault} raise")
        self.metrics = self._metrics(args)
        self.scheduler.on_round = self._on_round
        self.scheduler.start()
        self._last_summary = 0.0
        self._lock = threading.Lock()
        self.log.log_info(f"dspark: serving {self.settings.export_dir or self.settings.drafter_dir} with runtime "
                          f"{self.settings.runtime} on {self.settings.device}, max batch "
                          f"{self.settings.max_batch_size}, max queue {self.scheduler.max_queue}, context limit "
                          f"{self.scheduler.max_context}")

    def _metrics(self, args):
        """This instance's ``ModelMetrics``; None (and one warning) where the server has no custom metrics."""
        from .metrics import ModelMetrics

        labels = {"model": str(args.get("model_name", "")), "version": str(args.get("model_version", "")),
                  "instance": str(args.get("model_instance_name", ""))}
        try:
            return ModelMetrics(self.pb, labels, num_draft_tokens=self.decoder.config.num_draft_tokens,
                                max_batch_size=self.scheduler.max_batch_size)
        except Exception as e:  # an older Python backend: serve without them
            self.log.log_warn(f"dspark: no custom metrics ({type(e).__name__}: {e}); serving without them")
            return None

    def _on_round(self, drafted, accepted) -> None:
        """Scheduler thread, after each round: speculation metrics and the load gauges."""
        if self.metrics is not None:
            self.metrics.round(drafted, accepted)
            self.metrics.load(*self.scheduler.load())

    # -- requests -----------------------------------------------------------------------------------------
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                self._submit(request, sender)
            except ServerBusy as e:
                self._count("reject", "server_busy")
                self._fail(sender, str(e), code="UNAVAILABLE")
            except DSparkTrtError as e:
                self._count("reject", "invalid_argument")
                self._fail(sender, str(e), invalid=True)
            except Exception as e:  # never let one request take the instance down
                self.log.log_error(f"dspark: request failed before decoding: {type(e).__name__}: {e}")
                self._count("fail", "internal_error")
                self._fail(sender, f"internal error: {type(e).__name__}: {e}", invalid=False)
        if self.metrics is not None:
            self.metrics.load(*self.scheduler.load())
        return None

    def _count(self, kind: str, reason: str) -> None:
        if self.metrics is not None:
            getattr(self.metrics, kind)(reason)

    def _submit(self, request, sender) -> None:
        tensors = {}
        for name in INPUTS:
            t = self.pb.get_input_tensor_by_name(request, name)
            if t is not None:
                tensors[name] = t.as_numpy()
        req = parse_request(tensors, vocab_size=self.vocab_size, max_context=self.scheduler.max_context)
        tokenizer = self.decoder.tokenizer
        if isinstance(req.prompt, str) and tokenizer is None:
            raise DSparkTrtError("this model has no tokenizer: send input_ids instead of text_input")
        if req.stop and tokenizer is None:
            raise DSparkTrtError("this model has no tokenizer, so it cannot match stop strings: send end_id (stop "
                                 "token ids) instead of stop")
        text = StopText(tokenizer, req.stop) if tokenizer is not None else None
        self.scheduler.submit(req.prompt, **req.submit_kwargs(),
                              on_update=lambda handle, new, finished: self._on_update(
                                  sender, req.stream, text, handle, new, finished))

    def _on_update(self, sender, stream: bool, text, handle, new, finished: bool) -> None:
        """Scheduler thread: after each round with this request's new tokens (streaming / final answer)."""
        if not finished and sender.is_cancelled():
            handle.cancel()
            return
        if finished and self.metrics is not None:
            self.metrics.finish(handle.finish_reason, len(handle.tokens))
            self.metrics.load(*self.scheduler.load())
        if handle.finish_reason == "error":
            self._count("fail", "decoding_error")
            self._fail(sender, f"decoding failed: {handle.error}", invalid=False)
            return
        if handle.finish_reason == "cancelled" and sender.is_cancelled():
            sender.send(flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            self._maybe_log_summary()
            return
        if stream:
            piece = text.push(new) if text is not None else ""
            if finished and text is not None:
                piece += text.finish()
            if not finished and not new:
                return
            response = self._response(new, piece, handle if finished else None)
        elif finished:
            tokens = handle.tokens
            full = self.decoder.tokenizer.decode(tokens, skip_special_tokens=False) if text is not None else ""
            if text is not None and text.stop is not None:
                full = text.stop.cut(full)  # the text ends before the stop string
            response = self._response(tokens, full, handle)
        else:
            return
        sender.send(response, flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if finished else 0)
        if finished:
            self._maybe_log_summary()

    def _response(self, ids, text: str, handle):
        pb = self.pb
        outputs = [pb.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_)),
                   pb.Tensor("output_ids", np.asarray(list(ids), dtype=np.int64))]
        if handle is not None:
            outputs += [
                pb.Tensor("finish_reason", np.array([handle.finish_reason.encode()], dtype=np.object_)),
                pb.Tensor("mean_acceptance_length", np.array([handle.mean_acceptance_length], dtype=np.float32)),
                pb.Tensor("drafted", np.array([handle.drafted], dtype=np.int64)),
                pb.Tensor("accepted", np.array([handle.accepted], dtype=np.int64)),
                pb.Tensor("batch_size", np.array([handle.max_batch], dtype=np.int32)),
                pb.Tensor("prompt_tokens", np.array([handle.prompt_length], dtype=np.int64)),
                pb.Tensor("rounds", np.array([handle.rounds], dtype=np.int64)),
            ]
        return pb.InferenceResponse(output_tensors=outputs)

    def _fail(self, sender, message: str, *, invalid: bool = False, code: str | None = None) -> None:
        pb = self.pb
        code = getattr(pb.TritonError, code or ("INVALID_ARG" if invalid else "INTERNAL"))
        try:
            sender.send(pb.InferenceResponse(error=pb.TritonError(message, code)),
                        flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as e:  # the client may be gone
            self.log.log_warn(f"dspark: could not send an error response: {e}")

    def _maybe_log_summary(self) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last_summary < 5.0 and self.scheduler.busy:
                return
            self._last_summary = now
        self.log.log_info(f"dspark: {self.scheduler.stats.summary()}")

    def finalize(self):
        scheduler = getattr(self, "scheduler", None)
        if scheduler is not None:
            scheduler.stop(timeout=30)
            self.log.log_info(f"dspark: stopped; {scheduler.stats.summary()}")
