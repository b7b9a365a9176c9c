"""What the served model runs: a ``SpeculativeDecoder`` and its ``RequestScheduler``, built from the repository's
parameters (the same function serves the Triton model, the tests and ``dspark bench serve``'s baseline).

Two sources:

* an export directory (``export_dir``): ``SpeculativeDecoder.from_export`` with runtime ``tensorrt`` (the
  engines; where TensorRT is importable and the export has them) or ``onnxruntime`` (the ONNX graphs);
* a checkpoint pair (``drafter_dir`` + ``target_dir``): ``SpeculativeDecoder.from_pretrained`` with the
  ``torch`` (default) or ``onnxruntime`` drafter backend and the Hugging Face target.
"""

from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from ..errors import DSparkTrtError

__all__ = ["ModelSettings", "choose_runtime", "load_decoder", "build_scheduler", "RUNTIMES"]

RUNTIMES = ("tensorrt", "onnxruntime", "torch")
PARSE = {"confidence_threshold": float,  # numeric parameters other than int (config.pbtxt holds strings)
         "verify_drafts": lambda raw: "auto" if raw.lower() == "auto" else int(raw)}


@dataclass
class ModelSettings:
    """The served model's parameters (config.pbtxt ``parameters``; all strings there)."""

    export_dir: str = ""
    drafter_dir: str = ""
    target_dir: str = ""
    runtime: str = ""  # tensorrt | onnxruntime | torch
    device: str = "cpu"
    topk: int | None = None  # None: the drafter's default; 0: dense
    confidence_threshold: float | None = None
    verify_drafts: int | str | None = None  # at most this many drafts verified per round; None: all N; "auto"
    max_batch_size: int = 64  # requests decoded together (in-flight batching)
    max_context: int | None = None  # prompt + max_tokens limit; None: the target's
    max_queue: int | None = None  # requests allowed to wait for a batch row; the next is refused ("server busy")
    threads: int = 0  # torch / onnxruntime intra-op threads; 0 = library default

    def to_parameters(self) -> dict[str, str]:
        return {k: str(v) for k, v in asdict(self).items() if v is not None and v != ""}

    @classmethod
    def from_parameters(cls, params: dict[str, str]) -> "ModelSettings":
        out = {}
        for f in fields(cls):
            if f.name not in params:
                continue
            raw = str(params[f.name]).strip()
            if f.name in ("export_dir", "drafter_dir", "target_dir", "runtime", "device"):
                out[f.name] = raw
            elif raw == "":
                out[f.name] = None if f.default is None else f.default
            else:
                try:
                    out[f.name] = PARSE.get(f.name, int)(raw)
                except ValueError:
                    raise DSparkTrtError(f"model parameter {f.name}={raw!r} is not a number; fix config.pbtxt") from None
        return cls(**out)

    def resolved(self, base: str | Path) -> "ModelSettings":
        """These settings with relative model paths taken relative to ``base`` (the model's version directory,
        where ``dspark triton-repo --copy`` puts the export or the checkpoint pair)."""
        from dataclasses import replace

        at = lambda p: str(Path(base) / p) if p and not Path(p).is_absolute() else p  # noqa: E731
        return replace(self, export_dir=at(self.export_dir), drafter_dir=at(self.drafter_dir),
                       target_dir=at(self.target_dir))

    def check(self) -> "ModelSettings":
        if bool(self.export_dir) == bool(self.drafter_dir or self.target_dir):
            raise DSparkTrtError("give either export_dir or drafter_dir + target_dir (a checkpoint pair)")
        if not self.export_dir and not (self.drafter_dir and self.target_dir):
            raise DSparkTrtError("a checkpoint pair needs both drafter_dir and target_dir")
        if self.runtime not in RUNTIMES:
            raise DSparkTrtError(f"unknown runtime {self.runtime!r}: choose one of {', '.join(RUNTIMES)}")
        if self.export_dir and self.runtime == "torch":
            raise DSparkTrtError("runtime torch runs a checkpoint pair (--drafter/--target), not an export directory; "
                                 "use onnxruntime or tensorrt for an export")
        if not self.export_dir and self.runtime == "tensorrt":
            raise DSparkTrtError("runtime tensorrt runs an export directory's engines; export first (dspark-export)")
        if self.max_batch_size < 1:
            raise DSparkTrtError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_queue is not None and self.max_queue < 0:
            raise DSparkTrtError(f"max_queue must be >= 0 (requests allowed to wait), got {self.max_queue}; leave "
                                 f"it unset for no bound")
        for path in (self.export_dir, self.drafter_dir, self.target_dir):
            if path and not Path(path).is_dir():
                raise DSparkTrtError(f"model directory {path} does not exist; pass an existing directory")
        return self


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
