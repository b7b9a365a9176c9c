"""What the served model runs: a ``SpeculativeDecoder`` and its ``RequestScheduler``, built from the repository's
parameters (``settings.ModelSettings``; the same function serves the Triton model, the tests and ``dspark bench
serve``'s baseline).

Two sources:

* an export directory (``export_dir``): ``SpeculativeDecoder.from_export`` with runtime ``tensorrt`` (the
  engines; where TensorRT is importable and the export has them) or ``onnxruntime`` (the ONNX graphs);
* a checkpoint pair (``drafter_dir`` + ``target_dir``): ``SpeculativeDecoder.from_pretrained`` with the
  ``torch`` (default) or ``onnxruntime`` drafter backend and the Hugging Face target.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..errors import DSparkTrtError
from .settings import RUNTIMES, ModelSettings

__all__ = ["choose_runtime", "load_decoder", "build_scheduler", "have_tensorrt", "context_limit"]


def have_tensorrt() -> bool:
    if importlib.util.find_spec("tensorrt") is None:
        return False
    try:
        import tensorrt  # noqa: F401  (the PyPI stub fails on import)
    except Exception:
        return False
    return True


def choose_runtime(*, export_dir: str | None, forced: str | None = None) -> str:
    """``forced`` when given; for an export, tensorrt where TensorRT is importable and engines exist, else
    onnxruntime; for a checkpoint pair, torch."""
    if forced:
        if forced not in RUNTIMES:
            raise DSparkTrtError(f"unknown runtime {forced!r}: choose one of {', '.join(RUNTIMES)}")
        return forced
    if not export_dir:
        return "torch"
    from ..artifact.export_dir import ExportDir

    export = ExportDir(export_dir)
    engines = export.engines or (export.manifest.get("target") or {}).get("engines")
    return "tensorrt" if engines and have_tensorrt() else "onnxruntime"


def load_decoder(settings: ModelSettings):
    """The ``SpeculativeDecoder`` the settings describe."""
    from ..runtime import SpeculativeDecoder

    settings.check()
    if settings.threads:
        import torch

        torch.set_num_threads(settings.threads)
    if settings.export_dir:
        if not hasattr(SpeculativeDecoder, "from_export"):
            raise DSparkTrtError("this dspark-trt has no SpeculativeDecoder.from_export; serve a checkpoint pair "
                                 "(dspark triton-repo --drafter D --target T) or upgrade dspark-trt")
        options = {"threads": settings.threads} if settings.threads and settings.runtime == "onnxruntime" else {}
        return SpeculativeDecoder.from_export(settings.export_dir, backend=settings.runtime, device=settings.device,
                                              **options)
    from ..export import on_demand

    on_demand.install()  # runtime onnxruntime with a checkpoint pair: the drafter is exported on demand
    return SpeculativeDecoder.from_pretrained(settings.drafter_dir, settings.target_dir, backend=settings.runtime,
                                              device=settings.device, dtype="fp32" if settings.device == "cpu" else None)


def build_scheduler(settings: ModelSettings, decoder=None):
    """A ``RequestScheduler`` over ``decoder`` (loaded from the settings when not given)."""
    from ..runtime import RequestScheduler

    decoder = decoder if decoder is not None else load_decoder(settings)
    return RequestScheduler(decoder, topk=settings.topk, confidence_threshold=settings.confidence_threshold,
                            verify_drafts=settings.verify_drafts, max_batch_size=settings.max_batch_size,
                            max_context=context_limit(settings, decoder), max_queue=settings.max_queue)


def context_limit(settings: ModelSettings, decoder) -> int | None:
    """The longest prompt + max_tokens served: the setting, else the decoder's ``max_context`` (the KV bound of
    its graphs or engines) or its target model's ``max_position_embeddings`` (a bound keeps one huge prompt from
    exhausting memory)."""
    if settings.max_context:
        return settings.max_context
    limit = getattr(decoder, "max_context", None)
    if limit is None:
        model = getattr(decoder.target, "model", None)
        limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return int(limit) if limit else None
