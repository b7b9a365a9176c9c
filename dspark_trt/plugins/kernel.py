"""The fused top-k Markov walk: one OpenAI Triton program per request walks all N draft steps.

Math (docs/dspark.md §8.1; the oracle is ``reference.markov.walk_candidates`` via ``contract.reference_op``)::

    per request b, with candidates (vals, ids) [N, k] from TopK_k of the base logits, d_0 = anchor:
    for j in 0..N-1:
        e_j    = W1[d_j]                                          # [r]    predecessor as a target id
        z_j[c] = vals[j, c] + s · Σ_r W2[ids[j, c], r] · e_j[r]     # [k]    fp32 accumulation
        c_j    = σ(conf_base[j] + conf_w · e_j)                     #        confidence
        t_j    = argmax_c z_j[c]                                    greedy (T < 1e-5)
               = argmax_c z_j[c] / T + G(seed, pos + j, ids[j, c])  Gumbel-max, draft noise stream
        d_{j+1} = ids[j, t_j] + d2t[ids[j, t_j]]                    # draft id → target id

``G`` is the integer noise hash of ``reference/sampling.py`` (int64 multiply/add/mod, never overflowing),
keyed by the candidate's *draft id*, so the candidate order is irrelevant; the (seed, position) prefix is
hoisted out of the per-candidate loop. Ties go to the first candidate in input order, like ``torch.argmax``.

What the verifier receives: ``cand_logits`` = z before temperature at ``cand_ids``; with the temperature
they define q̃_j = softmax(z_j / T) over the k candidates (−inf elsewhere) — the dense corrected
distribution restricted to the base top-k and renormalised (one-hot at the token when greedy).

Cost model per round: B·N·k·r MACs and B·N·k·r·|W| bytes of gathered W2 rows (the floor; W1 rows and the
[B, N, k] values/logits are small beside it), versus N·V_d·r·|W| bytes for a dense round whatever B is.
Qwen3-8B (V_d = 151936, r = 256, N = 7, bf16), k = 512: 1.8 MB per request against 545 MB dense.

The body is ``_walk``, shared with the candidate union's kernel (``union_kernel.py``) through a
``tl.constexpr`` union width M: this kernel passes M = 0, so none of the union code is generated.

Launch: grid = (B,), ``num_warps`` × 32 threads, no shared memory beyond what Triton's reductions take.
The argument order is TensorRT's AOT calling convention: the 11 input pointers (contract order), the int32
extra arguments (``vocab`` = rows of W1, ``draft_vocab`` = rows of W2; ids are clamped into range so a bad
anchor cannot fault the engine), then the 3 output pointers. Everything else is a constexpr.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..errors import DSparkTrtError
from .contract import OUTPUTS
from ..reference.sampling import DRAFT_SALT, GREEDY_TEMPERATURE, HASH_PRIME, HASH_ROUNDS

__all__ = [
    "KERNEL_NAME",
    "MAX_RANK",
    "MAX_TOPK",
    "SUPPORTED_DTYPES",
    "TileConfig",
    "tile_config",
    "kernel_unsupported_reason",
    "kernel_supported",
    "interpreting",
    "topk_markov_walk",
]

KERNEL_NAME = "dspark_topk_markov_walk"
MAX_RANK = 1024
MAX_TOPK = 3840  # TensorRT's TopK limit: the candidates come from a native TopK in the engine
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_DTYPES = {"int32": torch.int32, "float32": torch.float32}

# the noise hash constants, shared with the reference (module-level constexprs for the JIT)
_P = tl.constexpr(HASH_PRIME)
_A1 = tl.constexpr(HASH_ROUNDS[0][0])
_C1 = tl.constexpr(HASH_ROUNDS[0][1])
_A2 = tl.constexpr(HASH_ROUNDS[1][0])
_C2 = tl.constexpr(HASH_ROUNDS[1][1])
_SALT = tl.constexpr(DRAFT_SALT)
_GREEDY_T = tl.constexpr(GREEDY_TEMPERATURE)
_U_SCALE = tl.constexpr(2.0**-23)


@triton.jit
def _mix(x):
    """Two rounds of the reference noise hash on int64 values in [0, P) (``reference/sampling.py``)."""
    x = (x * x + _C1) % _P
    x = (x * _A1) % _P
    x = (x * x + _C2) % _P
    return (x * _A2) % _P


@triton.jit
def _gumbel_scores(z, ids, temp, prefix):
    """z / T + G(seed, position, id) for a tile: ``prefix`` is the hashed (seed, position) key."""
    y = _mix((prefix + ids % _P) % _P)
    u = ((y // 256).to(tl.float32) + 0.5) * _U_SCALE  # (0, 1), exact in fp32
    return tl.math.div_rn(z, temp) - tl.log(-tl.log(u))


@triton.jit
def _markov_bias(ids, mask, w1_row, markov_w2, draft_vocab, R: tl.constexpr, BLOCK_R: tl.constexpr):
    """Σ_r W2[ids, r] · W1[prev, r] for a tile of ids (clamped into [0, V_d)), accumulated in fp32."""
    offs_r = tl.arange(0, BLOCK_R)
    w2_rows = markov_w2 + tl.minimum(tl.maximum(ids, 0), draft_vocab - 1)[:, None] * R
    acc = tl.zeros(ids.shape, dtype=tl.float32)
    for r0 in range(0, R, BLOCK_R):
        rr = r0 + offs_r
        rmask = rr < R
        e = tl.load(w1_row + rr, mask=rmask, other=0.0).to(tl.float32)  # [BLOCK_R]
        w = tl.load(w2_rows + rr[None, :], mask=mask[:, None] & rmask[None, :], other=0.0)
        acc += tl.sum(w.to(tl.float32) * e[None, :], axis=1)  # [tile] fp32
    return acc


@triton.jit
def _walk(
    cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed, position, conf_base, conf_w,
    union_table, base_logits,  # only read when M > 0
    vocab, draft_vocab,
    draft_tokens, cand_logits, confidence,
    union_ids,  # only written when M > 0
    N: tl.constexpr,
    K: tl.constexpr,
    M: tl.constexpr,  # union width; 0 = the plain walk (every union branch compiles away)
    R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
    LOGIT_SCALE: tl.constexpr,
):
    """One request's walk (both kernels; module docstrings of ``kernel`` and ``union_kernel``)."""
    b = tl.program_id(0).to(tl.int64)
    temp = tl.load(temperature + b)  # fp32 scalar
    greedy = temp < tl.full([], _GREEDY_T, tl.float32)  # compared in fp32, as torch does
    # noise: mix((seed mod P + salt) mod P), once per request; the position is folded in per step
    seed_h = _mix((tl.load(seed + b).to(tl.int64) % _P + _SALT) % _P)
    pos0 = tl.load(position + b).to(tl.int64)
    prev = tl.load(anchor + b).to(tl.int64)

    offs_k = tl.arange(0, BLOCK_K)
    offs_r = tl.arange(0, BLOCK_R)
    for j in range(N):
        prev = tl.minimum(tl.maximum(prev, 0), vocab - 1)
        w1_row = markov_w1 + prev * R
        # confidence: σ(conf_base + conf_w · e)
        c_acc = tl.zeros([BLOCK_R], dtype=tl.float32)
        for r0 in range(0, R, BLOCK_R):
            rr = r0 + offs_r
            e = tl.load(w1_row + rr, mask=rr < R, other=0.0).to(tl.float32)
            c_acc += e * tl.load(conf_w + rr, mask=rr < R, other=0.0)
        c_in = tl.load(conf_base + b * N + j) + tl.sum(c_acc, axis=0)
        tl.store(confidence + b * N + j, 1.0 / (1.0 + tl.exp(-c_in)))
        # noise prefix for (seed, position + j)
        prefix = _mix((seed_h + (pos0 + j) % _P) % _P)

        row = (b * N + j) * K  # cand_values / cand_ids row
        out_row = (b * N + j) * (K + M)  # cand_logits row: the k top-k candidates, then the M union ones
        best_score = tl.full([], -float("inf"), tl.float32)
        best_pos = tl.zeros([], tl.int32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + offs_k
            kmask = kk < K
            ids = tl.load(cand_ids + row + kk, mask=kmask, other=0).to(tl.int64)  # [BLOCK_K]
            acc = _markov_bias(ids, kmask, w1_row, markov_w2, draft_vocab, R, BLOCK_R)
            vals = tl.load(cand_values + row + kk, mask=kmask, other=0.0).to(tl.float32)
            z = vals + LOGIT_SCALE * acc  # [BLOCK_K] corrected logits, pre-temperature
            tl.store(cand_logits + out_row + kk, z, mask=kmask)
            if greedy:
                score = z
            else:
                score = _gumbel_scores(z, ids, temp, prefix)
            score = tl.where(kmask, score, -float("inf"))
            tile_best = tl.max(score, axis=0)
            tile_pos = tl.argmax(score, axis=0)  # first maximum, like torch.argmax
            better = tile_best > best_score
            best_pos = tl.where(better, k0 + tile_pos, best_pos)
            best_score = tl.where(better, tile_best, best_score)
        if M > 0:
            # the candidate union: table[d_j], valued from the base logits, −inf where already a top-k id
            offs_m = tl.arange(0, BLOCK_M)
            offs_d = tl.arange(0, BLOCK_D)
            table_row = union_table + prev * M
            base_row = base_logits + (b * N + j) * draft_vocab
            for m0 in range(0, M, BLOCK_M):
                mm = m0 + offs_m
                mmask = mm < M
                uids32 = tl.load(table_row + mm, mask=mmask, other=0)  # [BLOCK_M] int32 draft ids
                tl.store(union_ids + (b * N + j) * M + mm, uids32, mask=mmask)
                dup = tl.zeros([BLOCK_M], dtype=tl.int32)
                for d0 in range(0, K, BLOCK_D):  # is uids[m] one of the slot's K top-k ids? (int32 compares)
                    dd = d0 + offs_d
                    cids = tl.load(cand_ids + row + dd, mask=dd < K, other=-1)  # [BLOCK_D] int32
                    hit = (uids32[:, None] == cids[None, :]) & (dd < K)[None, :]  # [BLOCK_M, BLOCK_D]
                    dup = tl.maximum(dup, tl.max(hit.to(tl.int32), axis=1))
                uids = uids32.to(tl.int64)
                safe = tl.minimum(tl.maximum(uids, 0), draft_vocab - 1)
                vals = tl.load(base_row + safe, mask=mmask, other=0.0).to(tl.float32)
                vals = tl.where(dup > 0, -float("inf"), vals)  # masked duplicate: never drawn
                acc = _markov_bias(uids, mmask, w1_row, markov_w2, draft_vocab, R, BLOCK_R)
                z = vals + LOGIT_SCALE * acc  # [BLOCK_M], −inf at masked duplicates
                tl.store(cand_logits + out_row + K + mm, z, mask=mmask)
                if greedy:
                    score = z
                else:
                    score = _gumbel_scores(z, uids, temp, prefix)
                score = tl.where(mmask, score, -float("inf"))
                tile_best = tl.max(score, axis=0)
                tile_pos = tl.argmax(score, axis=0)
                better = tile_best > best_score  # strict: a top-k candidate wins a tie, like torch.argmax
                best_pos = tl.where(better, K + m0 + tile_pos, best_pos)
                best_score = tl.where(better, tile_best, best_score)
            from_table = best_pos >= K
            tok_top = tl.load(cand_ids + row + tl.minimum(best_pos, K - 1)).to(tl.int64)
            tok_tab = tl.load(table_row + tl.maximum(best_pos - K, 0)).to(tl.int64)
            tok = tl.where(from_table, tok_tab, tok_top)
        else:
            tok = tl.load(cand_ids + row + best_pos).to(tl.int64)
        tok = tl.minimum(tl.maximum(tok, 0), draft_vocab - 1)
        target = tok + tl.load(d2t + tok).to(tl.int64)
        tl.store(draft_tokens + b * N + j, target.to(tl.int32))
        prev = target


@triton.jit
def dspark_topk_markov_walk(
    # ---- inputs (contract order) ----
    cand_values,  # [B, N, k] T: base logits at the candidates
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
    # ---- int32 extra arguments ----
    vocab,  # V: rows of W1
    draft_vocab,  # V_d: rows of W2
    # ---- outputs ----
    draft_tokens,  # [B, N] int32 target ids
    cand_logits,  # [B, N, k] fp32
    confidence,  # [B, N] fp32
    # ---- constants ----
    N: tl.constexpr,
    K: tl.constexpr,
    R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr,
    LOGIT_SCALE: tl.constexpr,
):
    # M = 0: the union pointers are never touched (placeholders), the union code is not generated
    _walk(cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed, position, conf_base, conf_w,
          cand_ids, cand_values, vocab, draft_vocab, draft_tokens, cand_logits, confidence, draft_tokens,
          N, K, 0, R, BLOCK_K, 1, 1, BLOCK_R, LOGIT_SCALE)


# ------------------------------------------------------------------------------------------------ launch


class TileConfig(NamedTuple):
    block_k: int  # candidates per tile
    block_r: int  # rank elements per tile (the rank is walked in chunks of this)
    num_warps: int


#: elements of one W2 tile [BLOCK_K, BLOCK_R] held in registers (fp32 after the upcast)
TILE_ELEMENTS = 8192


def tile_config(k: int, r: int) -> TileConfig:
    """Tiles for (k, r): the whole rank in one tile up to 256, then 256-wide chunks; BLOCK_K fills the tile."""
    block_r = min(triton.next_power_of_2(r), 256)
    block_k = max(16, min(triton.next_power_of_2(k), TILE_ELEMENTS // block_r))
    num_warps = 4 if block_k * block_r <= 4096 else 8
    return TileConfig(block_k, block_r, num_warps)


def kernel_unsupported_reason(*, k: int, r: int, n: int, logits_dtype: torch.dtype,
                              weights_dtype: torch.dtype, device: torch.device | None = None) -> str | None:
    """Why the fused kernel cannot run this case (one line), or None when it can."""
    if device is not None and torch.device(device).type != "cuda":
        return f"device {device} is not CUDA"
    if not 1 <= k <= MAX_TOPK:
        return f"top-k {k} is outside [1, {MAX_TOPK}] (TensorRT's TopK limit)"
    if not 1 <= r <= MAX_RANK:
        return f"Markov rank {r} is outside [1, {MAX_RANK}]"
    if n < 1:
        return f"num_draft_tokens {n} must be >= 1"
    for what, dt in (("logits", logits_dtype), ("weights", weights_dtype)):
        if dt not in SUPPORTED_DTYPES:
            return f"{what} dtype {dt} is not one of fp32/fp16/bf16"
    return None


def kernel_supported(**kwargs) -> bool:
    """True when the fused kernel handles the case (see ``kernel_unsupported_reason`` for the why)."""
    return kernel_unsupported_reason(**kwargs) is None


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1`` before triton was imported)."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(dspark_topk_markov_walk, InterpretedFunction)


def _launch_device(kernel: str, cand_values: torch.Tensor, markov_w1: torch.Tensor,
                   markov_w2: torch.Tensor) -> tuple[torch.device, bool]:
    """(device, interpreting) of a launch: W1 and W2 share a dtype, CUDA tensors compiled or CPU tensors under
    Triton's interpreter (one-line errors naming ``kernel`` otherwise)."""
    if markov_w1.dtype != markov_w2.dtype:
        raise DSparkTrtError(f"markov_w1 ({markov_w1.dtype}) and markov_w2 ({markov_w2.dtype}) must share a dtype")
    device = cand_values.device
    interpret = interpreting()
    if interpret != (device.type == "cpu"):
        raise DSparkTrtError(
            f"{kernel} got {device.type} tensors while Triton's interpreter is "
            f"{'on' if interpret else 'off'}: use CUDA tensors, or CPU tensors with TRITON_INTERPRET=1 set before "
            "triton is imported")
    return device, interpret


def _check(name: str, t: torch.Tensor, shape: tuple, dtypes: tuple, op: str = "DSparkTopKMarkov") -> None:
    where = "UNION_INPUTS" if op.endswith("Union") else "INPUTS"
    if tuple(t.shape) != shape:
        raise DSparkTrtError(f"{op} tensor {name} has shape {tuple(t.shape)}, the op contract needs "
                             f"{shape}; see dspark_trt.plugins.contract.{where}")
    if t.dtype not in dtypes:
        raise DSparkTrtError(f"{op} tensor {name} has dtype {t.dtype}, the op contract needs one of "
                             f"{', '.join(str(d) for d in dtypes)}")


def topk_markov_walk(
    cand_values: torch.Tensor,  # [B, N, k] fp32 | fp16 | bf16
    cand_ids: torch.Tensor,  # [B, N, k] int32
    anchor: torch.Tensor,  # [B] int32
    markov_w1: torch.Tensor,  # [V, r] fp32 | fp16 | bf16
    markov_w2: torch.Tensor,  # [V_d, r], same dtype set
    d2t: torch.Tensor,  # [V_d] int32
    temperature: torch.Tensor,  # [B] fp32
    seed: torch.Tensor,  # [B] int32
    position: torch.Tensor,  # [B] int32
    conf_base: torch.Tensor,  # [B, N] fp32
    conf_w: torch.Tensor,  # [r] fp32
    *,
    logit_scale: float,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the kernel on the contract's inputs: (draft_tokens int32 [B, N], cand_logits fp32 [B, N, k],
    confidence fp32 [B, N]) — the same outputs as ``contract.reference_op``.

    ``out``: preallocated (draft_tokens, cand_logits, confidence) to write into (static buffers, CUDA graphs);
    every element is written. CUDA tensors run the compiled kernel; CPU tensors run in Triton's interpreter (tests), which must have been
    switched on with ``TRITON_INTERPRET=1`` before triton was imported (``triton.jit`` reads it then).
    """
    if cand_values.dim() != 3 or markov_w1.dim() != 2 or markov_w2.dim() != 2:
        raise DSparkTrtError("DSparkTopKMarkov needs cand_values [B, N, k], markov_w1 [V, r] and markov_w2 [V_d, r]; "
                             f"got {tuple(cand_values.shape)}, {tuple(markov_w1.shape)}, {tuple(markov_w2.shape)}")
    B, N, k = cand_values.shape
    V, r = markov_w1.shape
    Vd = markov_w2.shape[0]
    floats = SUPPORTED_DTYPES
    _check("cand_values", cand_values, (B, N, k), floats)
    _check("cand_ids", cand_ids, (B, N, k), (torch.int32,))
    _check("anchor", anchor, (B,), (torch.int32,))
    _check("markov_w2", markov_w2, (Vd, r), floats)
    _check("d2t", d2t, (Vd,), (torch.int32,))
    _check("temperature", temperature, (B,), (torch.float32,))
    _check("seed", seed, (B,), (torch.int32,))
    _check("position", position, (B,), (torch.int32,))
    _check("conf_base", conf_base, (B, N), (torch.float32,))
    _check("conf_w", conf_w, (r,), (torch.float32,))
    device, interpret = _launch_device("the fused top-k Markov kernel", cand_values, markov_w1, markov_w2)
    why = kernel_unsupported_reason(k=k, r=r, n=N, logits_dtype=cand_values.dtype, weights_dtype=markov_w1.dtype,
                                    device=None if interpret else device)
    if why is not None:
        raise DSparkTrtError(f"the fused top-k Markov kernel cannot run this case: {why}")
    if not math.isfinite(logit_scale):
        raise DSparkTrtError(f"logit_scale {logit_scale} must be finite")

    if out is None:
        draft_tokens = torch.empty((B, N), dtype=torch.int32, device=device)
        cand_logits = torch.empty((B, N, k), dtype=torch.float32, device=device)
        confidence = torch.empty((B, N), dtype=torch.float32, device=device)
    else:
        draft_tokens, cand_logits, confidence = out
        for c, t in zip(OUTPUTS, out):
            _check(c.name, t, {"[B, N]": (B, N), "[B, N, k]": (B, N, k)}[c.shape], (_DTYPES[c.dtype],))
            if not t.is_contiguous() or t.device != device:
                raise DSparkTrtError(f"output {c.name} must be a contiguous tensor on {device}")
    if B == 0:
        return draft_tokens, cand_logits, confidence
    tiles = tile_config(k, r)
    args = [t.contiguous() for t in (cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed,
                                     position, conf_base, conf_w)]
    constexprs = dict(N=N, K=k, R=r, BLOCK_K=tiles.block_k, BLOCK_R=tiles.block_r, LOGIT_SCALE=float(logit_scale))
    fn = dspark_topk_markov_walk
    if interpret:
        fn[(B,)](*args, V, Vd, draft_tokens, cand_logits, confidence, **constexprs)
    else:
        with torch.cuda.device(device):
            fn[(B,)](*args, V, Vd, draft_tokens, cand_logits, confidence, **constexprs,
                     num_warps=tiles.num_warps, enable_fp_fusion=False)
    return draft_tokens, cand_logits, confidence
