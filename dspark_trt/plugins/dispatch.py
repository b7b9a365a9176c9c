"""Which Markov walk the PyTorch runtime runs: a native kernel for the device when it supports the case —
the fused Triton kernel on CUDA (``kernel.py``), the Numba kernels on the CPU (``cpu_walk.py``) — else the
reference. A ``MarkovImpl`` bundles the candidate selection and the walk (the signatures of
``reference.markov.select_candidates`` and ``walk_candidates``); called, it runs a whole round with the
signature and result of ``reference.markov.markov_walk``.

    impl = select_markov_impl(device, topk=512, rank=256, num_draft_tokens=7,
                              logits_dtype=torch.bfloat16, weights_dtype=torch.bfloat16)
    result = impl(base_logits, anchor, w1, w2, topk=512, logit_scale=s, temperature=T, seed=seed, positions=pos)

The choice and, for a fallback, its reason are logged once per distinct case.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from typing import Callable, NamedTuple

import torch

from ..reference.markov import MarkovWalkResult, markov_walk, select_candidates, walk_candidates
from ..reference.sampling import HASH_PRIME

__all__ = ["CPU_KERNEL_MIN_HEAD", "NATIVE_HEADS", "MarkovImpl", "REFERENCE", "select_markov_impl", "select_markov_walk",
           "fused_markov_walk", "fused_walk_candidates", "fallback_reason"]

log = logging.getLogger("dspark.plugins")


class MarkovImpl(NamedTuple):
    """One way to run the top-k Markov round: ``select`` then ``walk``."""

    name: str
    select: Callable[..., tuple[torch.Tensor, torch.Tensor | None]]  # reference.markov.select_candidates
    walk: Callable[..., MarkovWalkResult]  # reference.markov.walk_candidates

    def __call__(self, base_logits, anchor, w1, w2, *, topk: int | None = None, **walk_options) -> MarkovWalkResult:
        cand_vals, cand_ids = self.select(base_logits, topk)
        return self.walk(cand_vals, cand_ids, anchor, w1, w2, **walk_options)


REFERENCE = MarkovImpl("reference PyTorch walk", select_candidates, walk_candidates)


#: Below this many W2 elements (V_d · r) the CPU round is cache-resident and the PyTorch top-k walk costs a
#: few ms, while the Numba kernels cost ~1 s to load per process: the demo pair's --topk 16 ran at 1/3 of the
#: dense speed for that alone (docs/design/runtime.md, "Which Markov walk on the CPU").
CPU_KERNEL_MIN_HEAD = 1 << 20
#: the Markov heads (config.SUPPORTED_MARKOV_HEADS) each device's native kernels walk; the others get the reference
NATIVE_HEADS = {"cpu": ("vanilla", "gated", "rnn"), "cuda": ("vanilla", "gated", "rnn")}


def fallback_reason(device: torch.device | str, *, topk: int | None, rank: int, num_draft_tokens: int,
                    logits_dtype: torch.dtype, weights_dtype: torch.dtype, markov_topm: int = 0,
                    draft_vocab_size: int | None = None, markov_head_type: str = "vanilla") -> str | None:
    """Why the reference walk must run instead of the device's native kernel (one line), or None when it can.
    ``draft_vocab_size`` (when given) lets the CPU pick the reference walk for a small head."""
    device = torch.device(device)
    if topk is None:
        return "dense Markov head (no top-k): one GEMM per step is already the fast path"
    if markov_head_type not in NATIVE_HEADS.get(device.type, ("vanilla",)):
        return f"no native {device.type} kernel for the {markov_head_type} Markov head yet"
    if device.type == "cpu":
        if draft_vocab_size is not None and draft_vocab_size * rank < CPU_KERNEL_MIN_HEAD:
            return (f"small Markov head (V_d·r = {draft_vocab_size * rank} < {CPU_KERNEL_MIN_HEAD}): the PyTorch "
                    f"top-k walk is as fast and needs no kernel loading")
        if importlib.util.find_spec("numba") is None:
            from ..optional import pip_install

            return f"Numba is not installed ({pip_install('cpu')})"
        from .cpu_walk import cpu_unsupported_reason

        return cpu_unsupported_reason(topk=topk, weights_dtype=weights_dtype)
    if device.type != "cuda":
        return f"no native Markov kernel for {device.type} devices"
    if importlib.util.find_spec("triton") is None:
        from ..optional import pip_install

        return f"OpenAI Triton is not installed ({pip_install('kernels')})"
    if markov_head_type != "vanilla":
        from .head_kernels import head_unsupported_reason

        return head_unsupported_reason(markov_head_type, k=topk, r=rank, n=num_draft_tokens, markov_topm=markov_topm,
                                       logits_dtype=logits_dtype, weights_dtype=weights_dtype, device=device)
    if markov_topm:
        from .union_kernel import union_unsupported_reason

        return union_unsupported_reason(k=topk, r=rank, n=num_draft_tokens, m=markov_topm, logits_dtype=logits_dtype,
                                        weights_dtype=weights_dtype, device=device)
    from .kernel import kernel_unsupported_reason

    return kernel_unsupported_reason(k=topk, r=rank, n=num_draft_tokens, logits_dtype=logits_dtype,
                                     weights_dtype=weights_dtype, device=device)


@functools.lru_cache(maxsize=64)
def _log_choice(choice: str, reason: str | None) -> None:
    if reason is None:
        log.info("Markov walk: %s", choice)
    else:
        log.info("Markov walk: %s (native kernel not used: %s)", choice, reason)


def _native_impl(device_type: str) -> MarkovImpl:
    if device_type == "cpu":
        from .cpu_walk import cpu_select_candidates, cpu_walk_candidates

        return MarkovImpl("native CPU kernels (Numba)", cpu_select_candidates, cpu_walk_candidates)
    return MarkovImpl("fused Triton kernel", select_candidates, fused_walk_candidates)


def select_markov_impl(device: torch.device | str, *, topk: int | None, rank: int, num_draft_tokens: int,
                       logits_dtype: torch.dtype = torch.float32, weights_dtype: torch.dtype = torch.float32,
                       use_kernel: bool = True, markov_topm: int = 0, draft_vocab_size: int | None = None,
                       markov_head_type: str = "vanilla") -> MarkovImpl:
    """The selection and walk for this device and case: the device's native kernel, or ``REFERENCE``."""
    device = torch.device(device)
    reason = "disabled by the caller" if not use_kernel else fallback_reason(
        device, topk=topk, rank=rank, num_draft_tokens=num_draft_tokens, logits_dtype=logits_dtype,
        weights_dtype=weights_dtype, markov_topm=markov_topm, draft_vocab_size=draft_vocab_size,
        markov_head_type=markov_head_type)
    if reason is not None:
        _log_choice(REFERENCE.name, reason)
        return REFERENCE
    impl = _native_impl(device.type)
    _log_choice(f"{impl.name} (k={topk}, r={rank}, N={num_draft_tokens})", None)
    return impl


def select_markov_walk(device: torch.device | str, **case) -> Callable[..., MarkovWalkResult]:
    """A whole round (``reference.markov.markov_walk``'s signature): ``fused_markov_walk`` on CUDA,
    ``cpu_walk.cpu_markov_walk`` on the CPU, or ``markov_walk`` (``select_markov_impl``'s arguments)."""
    impl = select_markov_impl(device, **case)
    if impl is REFERENCE:
        return markov_walk
    if impl.walk is fused_walk_candidates:
        return fused_markov_walk
    from .cpu_walk import cpu_markov_walk

    return cpu_markov_walk


def _int32_key(x: torch.Tensor | None, like: torch.Tensor, B: int) -> torch.Tensor:
    """A non-negative noise key as int32 *without changing the noise*: the hash only sees it modulo 2^31 - 1."""
    if x is None:
        return torch.zeros(B, dtype=torch.int32, device=like.device)
    return (x.to(device=like.device, dtype=torch.int64) % HASH_PRIME).to(torch.int32)


def _kernel_float(x: torch.Tensor) -> torch.Tensor:
    """``x`` as is when the fused kernels read its dtype (fp32 / fp16 / bf16), else as fp32."""
    return x if x.dtype in (torch.float32, torch.float16, torch.bfloat16) else x.to(torch.float32)


def fused_markov_walk(
    base_logits: torch.Tensor,  # [B, N, V_d] already × logit_scale
    anchor: torch.Tensor,  # [B] int target ids
    w1: torch.Tensor,  # [V, r]
    w2: torch.Tensor,  # [V_d, r]
    *,
    topk: int | None = None,
    **walk_options,
) -> MarkovWalkResult:
    """``reference.markov.markov_walk`` with the walk in one fused kernel launch (CUDA; top-k only)."""
    from ..errors import DSparkTrtError

    if topk is None:
        raise DSparkTrtError("the fused Markov kernel walks top-k candidates; use reference markov_walk for dense")
    cand_vals, cand_ids = select_candidates(base_logits, topk)  # [B, N, k] fp32, int64 (the reference's choice)
    if walk_options.get("union_table") is not None:
        walk_options.setdefault("base_logits", base_logits)
    return fused_walk_candidates(cand_vals, cand_ids, anchor, w1, w2, **walk_options)


def fused_walk_candidates(
    cand_vals: torch.Tensor,  # [B, N, k] base logits at the candidates
    cand_ids: torch.Tensor | None,  # [B, N, k] int draft-vocab ids
    anchor: torch.Tensor,  # [B] int target ids
    w1: torch.Tensor,  # [V, r]
    w2: torch.Tensor,  # [V_d, r]
    *,
    logit_scale: float = 1.0,
    d2t: torch.Tensor | None = None,
    temperature: torch.Tensor | None = None,
    seed: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    conf_base: torch.Tensor | None = None,
    conf_w_markov: torch.Tensor | None = None,
    union_table: torch.Tensor | None = None,  # [V, M] int draft ids: the candidate union (reference.markov)
    base_logits: torch.Tensor | None = None,  # [B, N, V_d] base logits (× s), read at the union's ids
    head=None,  # reference.markov_heads.HeadFeatures of a gated or RNN head (None = vanilla)
) -> MarkovWalkResult:
    """``reference.markov.walk_candidates`` in one fused kernel launch: the DSparkTopKMarkov op, with
    ``union_table`` (M > 0) the DSparkTopKMarkovUnion op (``union_kernel.py``; candidates [B, N, k + M]), with
    ``head`` the DSparkTopKMarkovGated / RNN op (``head_kernels.py``)."""
    from ..errors import DSparkTrtError

    if cand_ids is None:
        raise DSparkTrtError("the fused Markov kernel walks top-k candidates; use reference walk_candidates for dense")
    if temperature is not None and (seed is None or positions is None):
        raise DSparkTrtError("a temperature tensor needs seed and positions tensors (the Gumbel noise key)")
    union = union_table is not None and union_table.shape[-1] > 0
    if union and head is not None:
        raise DSparkTrtError(f"the candidate union (--markov-topm M > 0) is defined for the vanilla Markov head "
                             f"only: a {head.kind} head's bias depends on the context; use --markov-topm 0")
    if union and base_logits is None:
        raise DSparkTrtError("the candidate union needs the base logits [B, N, V_d] to value the table's ids")
    B, N, k = cand_vals.shape
    dev = cand_vals.device
    r = w1.shape[1]
    inputs = (
        cand_vals,
        cand_ids.to(torch.int32),
        anchor.to(device=dev, dtype=torch.int32),
        w1,
        w2,
        torch.zeros(w2.shape[0], dtype=torch.int32, device=dev) if d2t is None else d2t.to(dev, torch.int32),
        torch.zeros(B, device=dev) if temperature is None else temperature.to(dev, torch.float32),
        _int32_key(seed, cand_vals, B),
        _int32_key(positions, cand_vals, B),
        torch.zeros(B, N, device=dev) if conf_base is None else conf_base.to(dev, torch.float32).contiguous(),
        torch.zeros(r, device=dev) if conf_w_markov is None else conf_w_markov.to(dev, torch.float32),
    )
    if head is not None:
        from .head_kernels import head_markov_walk

        extra = [head.hidden_part.to(dev, torch.float32).contiguous(), _kernel_float(head.weight.to(dev))]
        if head.kind == "rnn":
            extra.append(head.start().to(dev, torch.float32).contiguous())
        M = 0
        tokens, cand_logits, confidence = head_markov_walk(head.kind, *inputs, *extra, logit_scale=float(logit_scale))
        all_ids = cand_ids.to(torch.int64)
    elif union:
        from .union_kernel import union_markov_walk

        M = union_table.shape[-1]
        tokens, cand_logits, confidence, union_ids = union_markov_walk(
            *inputs, union_table.to(dev, torch.int32), _kernel_float(base_logits.to(dev)),  # no fp32 copy
            logit_scale=float(logit_scale))
        all_ids = torch.cat((cand_ids.to(torch.int64), union_ids.to(torch.int64)), dim=-1)  # [B, N, k + M]
    else:
        from .kernel import topk_markov_walk

        M = 0
        tokens, cand_logits, confidence = topk_markov_walk(*inputs, logit_scale=float(logit_scale))
        all_ids = cand_ids.to(torch.int64)
    return MarkovWalkResult(tokens=tokens.to(torch.int64), cand_ids=all_ids, cand_logits=cand_logits,
                            confidence=confidence if conf_base is not None else None, union_width=M)
