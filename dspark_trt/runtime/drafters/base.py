"""The drafter interface: what the runtime needs from any executor of the DSpark drafter (the one base of the
drafter family; targets are their siblings in ``runtime/targets/``).

A backend owns the drafter's weights on one device and runs two things, both checked against the
reference ``DSparkDrafter`` (whose methods have the same names and meaning):

* ``context_kv(taps, positions)`` — fuse newly accepted tokens' target taps into per-layer K/V
  (the runtime appends them to its cache);
* ``draft(anchor, ctx_k, ctx_v, ctx_len, topk=, temperature=, seed=)`` — one round: N draft tokens,
  the sparse draft distribution (candidate ids + corrected logits) and the confidence.

Backends are context managers (acquire sessions/buffers/graphs in ``activate``, free them in
``deactivate``), registered by name in ``BACKENDS``.

What ``SpeculativeDecoder`` additionally uses (all optional):

* ``from_pretrained(drafter_dir, *, target_dir=, device=, dtype=, **options)`` — a classmethod, used by
  ``SpeculativeDecoder.from_pretrained(..., backend=NAME)`` and ``dspark generate --backend NAME``;
* ``d2t`` — the drafter's ``[V_d]`` int64 draft→target offsets; **required when V_d < V** (the verifier needs
  the candidates as target ids); ``None`` for a full vocabulary;
* ``set_active_requests(request_ids)`` — called whenever the batch changes (finished requests leave it), for
  backends that keep per-request state;
* ``state_rows(batch)`` — the rows the runtime's ``DrafterState`` keeps for ``batch`` requests: ``batch``, or
  a padded backend's batch bucket, whose ``draft`` then receives ``ctx_k``/``ctx_v`` with those spare rows
  (``[L, rows, T, H_kv, D]``, rows ≥ B: requests first) and binds the cache by address instead of copying it;
* ``supports_markov_topm`` / ``fixed_markov_topm`` — the candidate union: ``draft(..., markov_topm=M)`` walks it
  when supported; a backend running one export has that export's M fixed (``fixed_markov_topm``; any other M
  is refused by ``check_export_variant``), ``None`` where any M runs.
"""

from __future__ import annotations

import abc
import importlib

import torch

from ...config import DSparkConfig
from ...errors import DSparkTrtError
from ...reference.markov import MarkovWalkResult

__all__ = ["DrafterBackend", "BACKENDS", "backend_class", "check_export_variant"]

#: backend name → "module:Class" (imported on demand so optional packages stay optional)
BACKENDS: dict[str, str] = {
    "torch": "dspark_trt.runtime.drafters.torch:TorchDrafterBackend",
    "onnxruntime": "dspark_trt.runtime.drafters.onnxruntime:OnnxRuntimeDrafterBackend",
    "tensorrt": "dspark_trt.runtime.drafters.tensorrt:TensorRTDrafterBackend",
}


def backend_class(name: str) -> type["DrafterBackend"]:
    if name not in BACKENDS:
        raise DSparkTrtError(f"unknown drafter backend {name!r}: choose one of {', '.join(sorted(BACKENDS))}")
    module, _, cls = BACKENDS[name].partition(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except ModuleNotFoundError as e:
        from ...optional import from_import_error

        hint = from_import_error(e, purpose=f"the {name} drafter backend")
        if hint is None:
            raise
        raise hint from None


def check_export_variant(what: str, *, have_topk: int | None, have_markov_topm: int, topk: int | None,
                         markov_topm: int) -> None:
    """Refuse a round that asks an export for another top-k or union width than it was exported with.

    ``what`` starts the message (``"this ONNX export"``, ``"these engines"``); one line naming the flag to run
    with and the ``dspark-export`` flag to export with.
    """
    if topk != have_topk:
        have = have_topk or "off"
        raise DSparkTrtError(f"{what} draft{'s' if what.startswith('this') else ''} with top-k {have} but top-k "
                             f"{topk or 'off'} was requested; run with --topk {have} or export again with --topk "
                             f"{topk or 'off'}")
    if int(markov_topm) != int(have_markov_topm):
        walk = (f"walk{'s' if what.startswith('this') else ''} the candidate union with M={have_markov_topm}"
                if have_markov_topm else f"ha{'s' if what.startswith('this') else 've'} no candidate union")
        raise DSparkTrtError(f"{what} {walk} but --markov-topm {markov_topm} was requested; run with --markov-topm "
                             f"{have_markov_topm}, or export again with dspark-export --markov-topm {markov_topm}")


class DrafterBackend(abc.ABC):
    name: str = "abstract"
    config: DSparkConfig
    device: torch.device
    d2t: torch.Tensor | None = None  # [V_d] int64 draft→target offsets; required when V_d < V
    supports_markov_topm: bool = False  # True: draft(..., markov_topm=M) walks the candidate union
    fixed_markov_topm: int | None = None  # an export's union width M (only that M runs); None: any M

    def activate(self) -> None:
        """Acquire sessions, buffers, graphs. Called by ``__enter__``."""

    def deactivate(self) -> None:
        """Free what ``activate`` acquired. Called by ``__exit__``."""

    def state_rows(self, batch: int) -> int:
        """Rows the runtime's ``DrafterState`` keeps for ``batch`` requests (module docstring): ``batch`` here."""
        return batch

    def __enter__(self) -> "DrafterBackend":
        self.activate()
        return self

    def __exit__(self, *exc) -> None:
        self.deactivate()

    @abc.abstractmethod
    def context_kv(
        self,
        taps: torch.Tensor,  # [B, T, m·d] target taps, DeepSeek layer order
        positions: torch.Tensor,  # [B, T] int64
    ) -> tuple[torch.Tensor, torch.Tensor]:  # K, V: [L, B, T, H_kv, D]
        ...

    @abc.abstractmethod
    def draft(
        self,
        anchor: torch.Tensor,  # [B] int64 target ids
        ctx_k: torch.Tensor,  # [L, rows, T, H_kv, D]: rows = B, or state_rows(B) ≥ B (requests first)
        ctx_v: torch.Tensor,  # [L, rows, T, H_kv, D]
        ctx_len: torch.Tensor,  # [B] int64 valid context per request (= anchor position)
        *,
        topk: int | None,
        temperature: torch.Tensor | None,  # [B] fp32
        seed: torch.Tensor | None,  # [B] int64
        ctx_start: torch.Tensor | None = None,  # [B] int64 position of context row 0 (a sliding DrafterState)
    ) -> MarkovWalkResult:
        ...
