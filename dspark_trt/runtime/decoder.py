"""``SpeculativeDecoder``: a target model, a DSpark drafter backend, and the lossless loop between them.

This module builds a decoder (``from_pretrained``: a checkpoint pair; ``from_export``: a ``dspark-export``
directory) and runs ``generate``: the requests are checked (``requests``), the draft options resolved against
the drafter (``draft_options``), and one ``batch.Batch`` drives ``round.speculative_round`` until every request
has finished. Requests are independent (own lengths, seeds, temperatures, stop points); finished ones leave the
batch. ``RequestScheduler`` (``scheduler``) drives the same batch with requests that come and go.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import torch

from ..errors import DSparkTrtError
from ..topk import DEFAULT_TOPK
from .drafters.base import DrafterBackend, backend_class
from .batch import Batch
from .draft_options import resolve_draft_options, resolve_markov_topm, resolve_verify_drafts
from .requests import (Request, check_context_budget, check_max_new_tokens, check_sampling, check_truncation, eos_ids,
                       per_request, token_prompts)
from .stop import StopStrings
from .stats import GenerationResult
from .targets.base import Target
from .targets.hf import HFTarget

__all__ = ["SpeculativeDecoder", "check_pair", "load_tokenizer"]

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
        self.default_topk = self.config.draft_topk  # what DEFAULT_TOPK means; an export's own top-k in from_export
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
        check_context_budget([len(p) for p in self.prompts(inputs)], max_new_tokens, self.max_context)

    @property
    def d2t(self) -> torch.Tensor | None:
        """[V_d] the drafter's draft → target id table when its vocabulary is reduced, else None."""
        return self.backend.d2t if self.config.has_reduced_vocab else None

    def prompts(self, inputs) -> list[torch.Tensor]:
        """``inputs`` as ``generate`` takes them → one int64 [T_i] tensor per request (text through the
        tokenizer); ids outside the target vocabulary refused (``requests.token_prompts``)."""
        return token_prompts(inputs, self.tokenizer, self.target.vocab_size)

    # -- generation -----------------------------------------------------------------------------------
    @torch.inference_mode()
    def generate(
        self,
        inputs,
        max_new_tokens: int = 64,
        *,
        temperature: float | Sequence[float] = 0.0,
        topk: int | str | None = DEFAULT_TOPK,
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
            topk (*optional*): candidates per draft slot for the top-k Markov head; ``None`` (or ``"off"``) the
                dense head; ``DEFAULT_TOPK`` (the default) the drafter config's ``draft_topk`` (dense when unset;
                an export's own top-k with ``from_export``). See ``dspark_trt.topk``.
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
        prompts = self.prompts(inputs)
        B, dev = len(prompts), self.target.device
        check_max_new_tokens(max_new_tokens)
        check_context_budget([len(p) for p in prompts], max_new_tokens, self.max_context)
        temp = per_request(temperature, B, "temperature", torch.float32, dev)
        seeds = per_request(seed, B, "seed", torch.int64, dev)
        check_sampling(temp, seeds)
        tks = per_request(top_k, B, "top_k", torch.int64, dev)
        tps = per_request(top_p, B, "top_p", torch.float32, dev)
        check_truncation(tks, tps)
        topk, confidence_threshold = resolve_draft_options(self.config, topk, confidence_threshold,
                                                           default_topk=self.default_topk)
        markov_topm = resolve_markov_topm(self.config, self.backend, markov_topm, topk)
        eos = eos_ids(eos_token_id, self.target.eos_token_ids)
        stops = self.stop_check(stop) if stop else None
        requests = [Request(i, p, int(max_new_tokens), float(t), int(s), eos, stop=stops, top_k=k, top_p=tp)
                    for i, (p, t, s, k, tp) in enumerate(zip(prompts, temp.tolist(), seeds.tolist(), tks.tolist(),
                                                             tps.tolist()))]
        batch = Batch(self, topk, confidence_threshold, draft, requests=B,
                      verify_cap=resolve_verify_drafts(self.config, verify_drafts), markov_topm=markov_topm)
        stats = batch.loop(requests)
        out = [r.out for r in requests]
        texts = None
        if self.tokenizer is not None:
            texts = [self.tokenizer.decode(t, skip_special_tokens=False) for t in out]
            if stop:
                texts = [StopStrings(stop).cut(t) for t in texts]
        return GenerationResult(tokens=out, stats=stats, texts=texts)

    def stop_check(self, stop):
        """The ``Request`` stop check for stop strings ``stop`` (needs the tokenizer)."""
        stops = StopStrings(stop)
        if self.tokenizer is None:
            raise DSparkTrtError("stop strings need the target's tokenizer, and this model has none; stop on token "
                                 "ids instead (eos_token_id / end_id)")
        tokenizer = self.tokenizer
        return lambda out, start: stops.tokens_through(tokenizer, out, start)


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
