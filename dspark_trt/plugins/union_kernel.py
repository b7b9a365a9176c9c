"""The fused top-k Markov walk over the candidate union: the ``DSparkTopKMarkovUnion`` op in one Triton launch.

Math (the oracle is ``reference.markov.walk_candidates(..., union_table=, base_logits=)`` via
``contract.reference_union_op``; the plain walk is ``kernel.py``)::

    per request b, with top-k candidates (vals, ids) [N, k], base logits U [N, V_d], table [V, M], d_0 = anchor:
    for j in 0..N-1:
        e_j     = W1[d_j]                                              # [r]   predecessor as a target id
        u_j     = table[d_j]                                           # [M]   union ids (draft ids)
        dup[m]  = u_j[m] ∈ ids[j, :]                                   #       already a top-k candidate
        S_j     = ids[j, :] ++ u_j                                     # [k+M] fixed shape
        v_j     = vals[j, :] ++ where(dup, −inf, U[j, u_j])             # [k+M] base values, duplicates masked
        z_j[c]  = v_j[c] + s · Σ_r W2[S_j[c], r] · e_j[r]               # [k+M] fp32, −inf at masked duplicates
        c_j     = σ(conf_base[j] + conf_w · e_j)
        t_j     = argmax_c z_j[c]                                       greedy (T < 1e-5)
                = argmax_c z_j[c] / T + G(seed, pos + j, S_j[c])        Gumbel-max (−inf stays −inf: never drawn)
        d_{j+1} = S_j[t_j] + d2t[S_j[t_j]]

The noise is the same integer hash keyed by (seed, position + j, draft id) as the reference and the plain
kernel, so a T = 1 draw is the reference's exactly. Ties go to the first candidate in S_j order (the top-k
tiles, then the union tiles), like ``torch.argmax``. Outputs: ``cand_logits`` [B, N, k + M] = z_j (before
temperature) and ``union_ids`` [B, N, M] = u_j.

Both ops run one shared body (``kernel._walk``) with a ``tl.constexpr`` union width M: the plain kernel
passes M = 0 and every union branch compiles away (its PTX instructions are unchanged), this kernel passes
M > 0. Per step the union adds: one table row (M int32), M gathered base logits, M more W2 rows
(M·r·|W| bytes, the same gather as the top-k ones: M/k more weight traffic, 6 % at k = 512, M = 32), and the
duplicate test — an M × k comparison against the slot's top-k ids, in [BLOCK_M, BLOCK_D] tiles of the ids
just read for the top-k part (L1/L2 hits).

Launch: grid = (B,), ``num_warps`` × 32 threads. Arguments in TensorRT's AOT order: the 13 input pointers
(``contract.UNION_INPUTS`` order), the int32 extras ``vocab`` (rows of W1 and of the table) and
``draft_vocab`` (rows of W2, the last dim of ``base_logits``), then the 4 output pointers. Table and
candidate ids are clamped into range where they address memory, so a bad table cannot fault the engine.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..errors import DSparkTrtError
from .contract import UNION_OP_NAME, UNION_OUTPUTS
from .kernel import (MAX_TOPK, SUPPORTED_DTYPES, TILE_ELEMENTS, _check, _launch_device, _walk,
                     kernel_unsupported_reason, tile_config)

__all__ = ["UNION_KERNEL_NAME", "MAX_TOPM", "UnionTileConfig", "union_tile_config", "union_unsupported_reason",
           "union_markov_walk"]

UNION_KERNEL_NAME = "dspark_topk_markov_walk_union"
MAX_TOPM = MAX_TOPK  # a bound on the union width (the duplicate test costs M·k compares per step)
#: elements of one duplicate-test tile [BLOCK_M, BLOCK_D] (int compares, in registers)
DUP_TILE_ELEMENTS = 4096
MAX_BLOCK_M = 64  # union candidates per tile at most (a wider M walks several tiles)
_DTYPES = {"int32": torch.int32, "float32": torch.float32}


@triton.jit
def dspark_topk_markov_walk_union(
    # ---- inputs (contract order: UNION_INPUTS) ----
    cand_values,  # [B, N, k] T: base logits at the top-k candidates
    cand_ids,  # [B, N, k] int32: draft-vocab ids
    anchor,  # [B] int32: target id of the anchor
    markov_w1,  # [V, r] W
    markov_w2,  # [V_d, r] W
    d2t,  # [V_d] int32 offsets
    temperature,  # [B] fp32
    seed,  # [B] int32 >= 0
    position,  # [B] int32: position of d_1
    conf_base,  # [B, N] fp32
    conf_w,  # [r] fp32
    union_table,  # [V, M] int32 draft ids per predecessor target id
    base_logits,  # [B, N, V_d] T: all base logits (× s)
    # ---- int32 extra arguments ----
    vocab,  # V: rows of W1 and of the table
    draft_vocab,  # V_d: rows of W2, last dim of base_logits
    # ---- outputs ----
    draft_tokens,  # [B, N] int32 target ids
    cand_logits,  # [B, N, k + M] fp32
    confidence,  # [B, N] fp32
    union_ids,  # [B, N, M] int32
    # ---- constants ----
    N: tl.constexpr,
    K: tl.constexpr,
    M: tl.constexpr,
    R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
    LOGIT_SCALE: tl.constexpr,
):
    _walk(cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed, position, conf_base, conf_w,
          union_table, base_logits, vocab, draft_vocab, draft_tokens, cand_logits, confidence, union_ids,
          N, K, M, R, BLOCK_K, BLOCK_M, BLOCK_D, BLOCK_R, LOGIT_SCALE)


class UnionTileConfig(NamedTuple):
    block_k: int  # top-k candidates per tile (as the plain kernel)
    block_r: int  # rank elements per tile
    num_warps: int
    block_m: int  # union candidates per tile
    block_d: int  # top-k ids per duplicate-test tile


def union_tile_config(k: int, r: int, m: int) -> UnionTileConfig:
    """The plain kernel's tiles for (k, r), a union tile of M (at most MAX_BLOCK_M and TILE_ELEMENTS / BLOCK_R
    candidates at a time: its W2 tile is no larger than a top-k one) and a duplicate-test tile of at most
    DUP_TILE_ELEMENTS compares."""
    t = tile_config(k, r)
    block_m = max(16, min(triton.next_power_of_2(m), TILE_ELEMENTS // t.block_r, MAX_BLOCK_M))
    block_d = max(16, min(triton.next_power_of_2(k), DUP_TILE_ELEMENTS // block_m))
    return UnionTileConfig(t.block_k, t.block_r, t.num_warps, block_m, block_d)


def union_unsupported_reason(*, k: int, r: int, n: int, m: int, logits_dtype: torch.dtype,
                             weights_dtype: torch.dtype, device: torch.device | None = None) -> str | None:
    """Why the fused union kernel cannot run this case (one line), or None when it can."""
    if not 1 <= m <= MAX_TOPM:
        return f"union width markov_topm {m} is outside [1, {MAX_TOPM}]"
    return kernel_unsupported_reason(k=k, r=r, n=n, logits_dtype=logits_dtype, weights_dtype=weights_dtype,
                                     device=device)


def union_markov_walk(
    cand_values: torch.Tensor,  # [B, N, k] fp32 | fp16 | bf16
    cand_ids: torch.Tensor,  # [B, N, k] int32
    anchor: torch.Tensor,  # [B] int32
    markov_w1: torch.Tensor,  # [V, r] fp32 | fp16 | bf16
    markov_w2: torch.Tensor,  # [V_d, r], same dtype
    d2t: torch.Tensor,  # [V_d] int32
    temperature: torch.Tensor,  # [B] fp32
    seed: torch.Tensor,  # [B] int32
    position: torch.Tensor,  # [B] int32
    conf_base: torch.Tensor,  # [B, N] fp32
    conf_w: torch.Tensor,  # [r] fp32
    union_table: torch.Tensor,  # [V, M] int32
    base_logits: torch.Tensor,  # [B, N, V_d] fp32 | fp16 | bf16 (the contract's T; here any of the three)
    *,
    logit_scale: float,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the union kernel on the contract's 13 inputs: (draft_tokens int32 [B, N], cand_logits fp32
    [B, N, k + M], confidence fp32 [B, N], union_ids int32 [B, N, M]) — ``contract.reference_union_op``'s outputs.

    ``out``: preallocated outputs to write into (every element is written). CUDA tensors run the compiled
    kernel; CPU tensors run in Triton's interpreter (``TRITON_INTERPRET=1`` before triton was imported).
    ``base_logits`` may have another float dtype than ``cand_values`` (the JIT kernel specialises on both; the
    TensorRT plugin's signature gives both the logits type T): the runtime passes the model's logits as they
    are, without an fp32 copy of [B, N, V_d].
    """
    if (cand_values.dim() != 3 or markov_w1.dim() != 2 or markov_w2.dim() != 2 or union_table.dim() != 2
            or base_logits.dim() != 3):
        raise DSparkTrtError("DSparkTopKMarkovUnion needs cand_values [B, N, k], markov_w1 [V, r], markov_w2 [V_d, r], "
                             "union_table [V, M] and base_logits [B, N, V_d]; got "
                             f"{tuple(cand_values.shape)}, {tuple(markov_w1.shape)}, {tuple(markov_w2.shape)}, "
                             f"{tuple(union_table.shape)}, {tuple(base_logits.shape)}")
    B, N, k = cand_values.shape
    V, r = markov_w1.shape
    Vd = markov_w2.shape[0]
    M = union_table.shape[1]
    floats = SUPPORTED_DTYPES
    for name, t, shape, dtypes in (
            ("cand_values", cand_values, (B, N, k), floats), ("cand_ids", cand_ids, (B, N, k), (torch.int32,)),
            ("anchor", anchor, (B,), (torch.int32,)), ("markov_w2", markov_w2, (Vd, r), floats),
            ("d2t", d2t, (Vd,), (torch.int32,)), ("temperature", temperature, (B,), (torch.float32,)),
            ("seed", seed, (B,), (torch.int32,)), ("position", position, (B,), (torch.int32,)),
            ("conf_base", conf_base, (B, N), (torch.float32,)), ("conf_w", conf_w, (r,), (torch.float32,)),
            ("union_table", union_table, (V, M), (torch.int32,)),
            ("base_logits", base_logits, (B, N, Vd), floats)):
        _check(name, t, shape, dtypes, UNION_OP_NAME)
    device, interpret = _launch_device("the fused union kernel", cand_values, markov_w1, markov_w2)
    why = union_unsupported_reason(k=k, r=r, n=N, m=M, logits_dtype=cand_values.dtype,
                                   weights_dtype=markov_w1.dtype, device=None if interpret else device)
    if why is not None:
        raise DSparkTrtError(f"the fused union kernel cannot run this case: {why}")
    if not math.isfinite(logit_scale):
        raise DSparkTrtError(f"logit_scale {logit_scale} must be finite")

    shapes = {"[B, N]": (B, N), "[B, N, k + M]": (B, N, k + M), "[B, N, M]": (B, N, M)}
    if out is None:
        out = tuple(torch.empty(shapes[c.shape], dtype=_DTYPES[c.dtype], device=device) for c in UNION_OUTPUTS)
    else:
        for c, t in zip(UNION_OUTPUTS, out, strict=True):
            _check(c.name, t, shapes[c.shape], (_DTYPES[c.dtype],), UNION_OP_NAME)
            if not t.is_contiguous() or t.device != device:
                raise DSparkTrtError(f"output {c.name} must be a contiguous tensor on {device}")
    if B == 0:
        return tuple(out)
    tiles = union_tile_config(k, r, M)
    args = [t.contiguous() for t in (cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed,
                                     position, conf_base, conf_w, union_table, base_logits)]
    constexprs = dict(N=N, K=k, M=M, R=r, BLOCK_K=tiles.block_k, BLOCK_M=tiles.block_m, BLOCK_D=tiles.block_d,
                      BLOCK_R=tiles.block_r, LOGIT_SCALE=float(logit_scale))
    fn = dspark_topk_markov_walk_union
    if interpret:
        fn[(B,)](*args, V, Vd, *out, **constexprs)
    else:
        with torch.cuda.device(device):
            fn[(B,)](*args, V, Vd, *out, **constexprs, num_warps=tiles.num_warps, enable_fp_fusion=False)
    return tuple(out)
