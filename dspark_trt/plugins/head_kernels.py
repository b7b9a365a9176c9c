"""The fused top-k Markov walk for the gated and RNN heads: ``DSparkTopKMarkovGated`` / ``DSparkTopKMarkovRNN`` in
one Triton launch each, one program per request.

Math (``reference/markov_heads.py``; the oracles are ``contract.REFERENCE_OPS["gated" | "rnn"]``)::

    per request b, with candidates (vals, ids) [N, k], d_0 = anchor, and (rnn) s_0 = rnn_state0[b]:
    for j in 0..N-1:
        e_j     = W1[d_j]                                               # [r]   predecessor as a target id
        c_j     = σ(conf_base[j] + conf_w · e_j)                         #       confidence (reads e, not u)
        gated:  u_j = σ(gate_hidden[j] + G_e · e_j) ⊙ e_j                # G_e = gate_w [r, r]
        rnn:    (γ, c, o) = split₃(joint_hidden[j] + J · [s_j ; e_j])   # J = joint_w [3r, 2r]
                u_j = tanh(o);   s_{j+1} = σ(γ) ⊙ s_j + (1 − σ(γ)) ⊙ tanh(c)
        z_j[c]  = vals[j, c] + s · Σ_r W2[ids[j, c], r] · u_j[r]         # [k]  only the k candidate rows of W2
        t_j, d_{j+1}: greedy argmax / Gumbel-max and d2t, exactly as the vanilla kernel (``kernel.py``)

``gate_hidden`` / ``joint_hidden`` (``G_h·h_j + b`` / ``J_h·h_j + b``, the backbone-state share of the head's
projection) do not depend on the walk: the graph computes them for all N slots at once before the node (one
GEMM). The walk adds the r-sized products, in fp32 registers of the one program:

- ``e_j``, ``u_j`` and (rnn) ``s_j`` are whole-rank register vectors [BLOCK_R] (BLOCK_R = next power of two ≥ r;
  the vanilla kernel instead streams e in 256-wide chunks, it never needs the whole vector).
- The mat-vec walks the *input* dimension in chunks of BLOCK_M: a [BLOCK_R, BLOCK_M] tile of the weight (rows =
  every output, columns = one input chunk) times that chunk of the input, summed along the chunk, accumulates
  all r outputs at once (three accumulators for the RNN's γ, c, o) — so the output never needs scattering.
  The ``e`` chunks are loaded again from ``W1[d_j]`` (an L1 hit); the RNN's ``s`` chunks are taken from the
  register vector by a masked reduction (a one-hot [BLOCK_R, BLOCK_M] select: r² adds per step, beside the
  mat-vec's 6r² MACs). No global scratch: the AOT launch has no workspace.
- The bias tile is [BLOCK_K, BLOCK_R] (the whole rank: u is in registers), BLOCK_K = TILE_ELEMENTS / BLOCK_R.

Per step, beyond the vanilla walk: gated r² MACs and r²·|W| bytes of ``gate_w``; rnn 6r² MACs and 6r²·|W| bytes
of ``joint_w`` — the same matrix for every request and step, so it stays in L2 (r = 256, bf16: 128 KiB gated,
768 KiB rnn). ``sigmoid`` = 1 / (1 + exp(−x)), ``tanh`` = 1 − 2 / (exp(2x) + 1) (fp32, saturating to ±1).

Launch: grid = (B,), ``num_warps`` × 32 threads; arguments in TensorRT's AOT order: the 13 (gated) / 14 (rnn)
input pointers in ``contract.GATED_INPUTS`` / ``RNN_INPUTS`` order, the int32 extras ``vocab`` and
``draft_vocab``, the 3 output pointers (the vanilla op's), then the constexprs. Both kernels share one body,
``_head_walk``, through the constexpr ``HEAD`` (1 gated, 2 rnn).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..errors import DSparkTrtError
from .contract import GATED_INPUTS, GATED_OP_NAME, OUTPUTS, RNN_INPUTS, RNN_OP_NAME
from .kernel import MAX_TOPK, SUPPORTED_DTYPES, TILE_ELEMENTS, _check, _gumbel_scores, _launch_device, _mix
from .kernel import _GREEDY_T, _P, _SALT  # noqa: F401  (module-level constexprs the JIT resolves by name)

__all__ = ["HEAD_KERNEL_NAMES", "HEAD_KINDS", "MAX_HEAD_RANK", "HeadTileConfig", "head_tile_config",
           "head_unsupported_reason", "head_markov_walk", "head_kernel"]

HEAD_KINDS = ("gated", "rnn")
HEAD_KERNEL_NAMES = {"gated": "dspark_topk_markov_walk_gated", "rnn": "dspark_topk_markov_walk_rnn"}
HEAD_OP_NAMES = {"gated": GATED_OP_NAME, "rnn": RNN_OP_NAME}
HEAD_INPUTS = {"gated": GATED_INPUTS, "rnn": RNN_INPUTS}
#: the whole rank sits in registers (e, u, s and the RNN's three accumulators: 6·r/(32·warps) registers each)
MAX_HEAD_RANK = 1024
#: elements of one weight tile of the mat-vec [BLOCK_R, BLOCK_M] (the RNN holds three at once)
MATVEC_TILE_ELEMENTS = 4096
_DTYPES = {"int32": torch.int32, "float32": torch.float32}


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _tanh(x):
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)  # exp overflow → 1, underflow → −1


@triton.jit
def _head_walk(
    cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed, position, conf_base, conf_w,
    head_hidden,  # gated [B, N, r] | rnn [B, N, 3r] fp32
    head_w,  # gated [r, r] | rnn [3r, 2r] W
    state0,  # rnn [B, r] fp32 (not read when HEAD = 1)
    vocab, draft_vocab,
    draft_tokens, cand_logits, confidence,
    N: tl.constexpr,
    K: tl.constexpr,
    R: tl.constexpr,
    HEAD: tl.constexpr,  # 1 gated, 2 rnn
    BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_M: tl.constexpr,
    LOGIT_SCALE: tl.constexpr,
):
    """One request's walk (module docstring)."""
    b = tl.program_id(0).to(tl.int64)
    temp = tl.load(temperature + b)
    greedy = temp < tl.full([], _GREEDY_T, tl.float32)
    seed_h = _mix((tl.load(seed + b).to(tl.int64) % _P + _SALT) % _P)
    pos0 = tl.load(position + b).to(tl.int64)
    prev = tl.load(anchor + b).to(tl.int64)

    offs_k = tl.arange(0, BLOCK_K)
    offs_r = tl.arange(0, BLOCK_R)
    offs_m = tl.arange(0, BLOCK_M)
    rmask = offs_r < R
    cw = tl.load(conf_w + offs_r, mask=rmask, other=0.0)
    if HEAD == 2:
        s = tl.load(state0 + b * R + offs_r, mask=rmask, other=0.0)  # [BLOCK_R] fp32 recurrent state
    for j in range(N):
        prev = tl.minimum(tl.maximum(prev, 0), vocab - 1)
        w1_row = markov_w1 + prev * R
        e = tl.load(w1_row + offs_r, mask=rmask, other=0.0).to(tl.float32)  # [BLOCK_R]
        c_in = tl.load(conf_base + b * N + j) + tl.sum(e * cw, axis=0)
        tl.store(confidence + b * N + j, 1.0 / (1.0 + tl.exp(-c_in)))

        if HEAD == 1:
            # gated: a = gate_hidden[j] + G_e · e, the input (e) walked in BLOCK_M chunks
            acc = tl.load(head_hidden + (b * N + j) * R + offs_r, mask=rmask, other=0.0)
            for m0 in range(0, R, BLOCK_M):
                mm = m0 + offs_m
                mmask = mm < R
                x = tl.load(w1_row + mm, mask=mmask, other=0.0).to(tl.float32)  # [BLOCK_M] chunk of e
                w = tl.load(head_w + offs_r[:, None] * R + mm[None, :], mask=rmask[:, None] & mmask[None, :],
                            other=0.0)
                acc += tl.sum(w.to(tl.float32) * x[None, :], axis=1)
            u = _sigmoid(acc) * e
        else:
            # rnn: (γ, c, o) = joint_hidden[j] + J · [s ; e]; rows p·R + i of J, columns [0, R) read s, [R, 2R) e
            hid = head_hidden + (b * N + j) * (3 * R)
            acc_g = tl.load(hid + offs_r, mask=rmask, other=0.0)
            acc_c = tl.load(hid + R + offs_r, mask=rmask, other=0.0)
            acc_o = tl.load(hid + 2 * R + offs_r, mask=rmask, other=0.0)
            rows = offs_r[:, None] * (2 * R)
            for m0 in range(0, R, BLOCK_M):  # the state columns: chunks of the register vector s
                mm = m0 + offs_m
                mmask = mm < R
                pick = offs_r[:, None] == mm[None, :]  # [BLOCK_R, BLOCK_M] one-hot
                x = tl.sum(tl.where(pick, s[:, None], 0.0), axis=0)  # [BLOCK_M] = s[mm]
                wmask = rmask[:, None] & mmask[None, :]
                wg = tl.load(head_w + rows + mm[None, :], mask=wmask, other=0.0).to(tl.float32)
                wc = tl.load(head_w + R * (2 * R) + rows + mm[None, :], mask=wmask, other=0.0).to(tl.float32)
                wo = tl.load(head_w + 2 * R * (2 * R) + rows + mm[None, :], mask=wmask, other=0.0).to(tl.float32)
                acc_g += tl.sum(wg * x[None, :], axis=1)
                acc_c += tl.sum(wc * x[None, :], axis=1)
                acc_o += tl.sum(wo * x[None, :], axis=1)
            for m0 in range(0, R, BLOCK_M):  # the embedding columns: chunks of W1[d_j]
                mm = m0 + offs_m
                mmask = mm < R
                x = tl.load(w1_row + mm, mask=mmask, other=0.0).to(tl.float32)
                wmask = rmask[:, None] & mmask[None, :]
                cols = R + mm[None, :]
                wg = tl.load(head_w + rows + cols, mask=wmask, other=0.0).to(tl.float32)
                wc = tl.load(head_w + R * (2 * R) + rows + cols, mask=wmask, other=0.0).to(tl.float32)
                wo = tl.load(head_w + 2 * R * (2 * R) + rows + cols, mask=wmask, other=0.0).to(tl.float32)
                acc_g += tl.sum(wg * x[None, :], axis=1)
                acc_c += tl.sum(wc * x[None, :], axis=1)
                acc_o += tl.sum(wo * x[None, :], axis=1)
            gate = _sigmoid(acc_g)
            u = _tanh(acc_o)
            s = gate * s + (1.0 - gate) * _tanh(acc_c)
            s = tl.where(rmask, s, 0.0)
        u = tl.where(rmask, u, 0.0)

        prefix = _mix((seed_h + (pos0 + j) % _P) % _P)
        row = (b * N + j) * K
        best_score = tl.full([], -float("inf"), tl.float32)
        best_pos = tl.zeros([], tl.int32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + offs_k
            kmask = kk < K
            ids = tl.load(cand_ids + row + kk, mask=kmask, other=0).to(tl.int64)
            w2_rows = markov_w2 + tl.minimum(tl.maximum(ids, 0), draft_vocab - 1)[:, None] * R
            w2 = tl.load(w2_rows + offs_r[None, :], mask=kmask[:, None] & rmask[None, :], other=0.0)
            bias = tl.sum(w2.to(tl.float32) * u[None, :], axis=1)  # [BLOCK_K] fp32
            vals = tl.load(cand_values + row + kk, mask=kmask, other=0.0).to(tl.float32)
            z = vals + LOGIT_SCALE * bias
            tl.store(cand_logits + row + kk, z, mask=kmask)
            if greedy:
                score = z
            else:
                score = _gumbel_scores(z, ids, temp, prefix)
            score = tl.where(kmask, score, -float("inf"))
            tile_best = tl.max(score, axis=0)
            tile_pos = tl.argmax(score, axis=0)
            better = tile_best > best_score
            best_pos = tl.where(better, k0 + tile_pos, best_pos)
            best_score = tl.where(better, tile_best, best_score)
        tok = tl.load(cand_ids + row + best_pos).to(tl.int64)
        tok = tl.minimum(tl.maximum(tok, 0), draft_vocab - 1)
        target = tok + tl.load(d2t + tok).to(tl.int64)
        tl.store(draft_tokens + b * N + j, target.to(tl.int32))
        prev = target


@triton.jit
def dspark_topk_markov_walk_gated(
    # ---- inputs (contract order: GATED_INPUTS) ----
    cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed, position, conf_base, conf_w,
    gate_hidden,  # [B, N, r] fp32
    gate_w,  # [r, r] W
    # ---- int32 extra arguments ----
    vocab, draft_vocab,
    # ---- outputs ----
    draft_tokens, cand_logits, confidence,
    # ---- constants ----
    N: tl.constexpr,
    K: tl.constexpr,
    R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_M: tl.constexpr,
    LOGIT_SCALE: tl.constexpr,
):
    # HEAD = 1: the state pointer is a placeholder, never read
    _head_walk(cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed, position, conf_base,
               conf_w, gate_hidden, gate_w, conf_base, vocab, draft_vocab, draft_tokens, cand_logits, confidence,
               N, K, R, 1, BLOCK_K, BLOCK_R, BLOCK_M, LOGIT_SCALE)


@triton.jit
def dspark_topk_markov_walk_rnn(
    # ---- inputs (contract order: RNN_INPUTS) ----
    cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed, position, conf_base, conf_w,
    joint_hidden,  # [B, N, 3r] fp32
    joint_w,  # [3r, 2r] W
    rnn_state0,  # [B, r] fp32
    # ---- int32 extra arguments ----
    vocab, draft_vocab,
    # ---- outputs ----
    draft_tokens, cand_logits, confidence,
    # ---- constants ----
    N: tl.constexpr,
    K: tl.constexpr,
    R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_M: tl.constexpr,
    LOGIT_SCALE: tl.constexpr,
):
    _head_walk(cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed, position, conf_base,
               conf_w, joint_hidden, joint_w, rnn_state0, vocab, draft_vocab, draft_tokens, cand_logits, confidence,
               N, K, R, 2, BLOCK_K, BLOCK_R, BLOCK_M, LOGIT_SCALE)


def head_kernel(head: str):
    """The JIT kernel of a head (``gated`` | ``rnn``)."""
    return {"gated": dspark_topk_markov_walk_gated, "rnn": dspark_topk_markov_walk_rnn}[head]


# ------------------------------------------------------------------------------------------------ launch


class HeadTileConfig(NamedTuple):
    block_k: int  # candidates per bias tile [BLOCK_K, BLOCK_R]
    block_r: int  # the whole rank, padded to a power of two
    block_m: int  # input columns per mat-vec tile [BLOCK_R, BLOCK_M]
    num_warps: int


def head_tile_config(k: int, r: int) -> HeadTileConfig:
    """Tiles for (k, r): the rank whole; bias tiles of ≤ TILE_ELEMENTS, mat-vec tiles of ≤ MATVEC_TILE_ELEMENTS."""
    block_r = max(16, triton.next_power_of_2(r))
    block_k = max(8, min(triton.next_power_of_2(k), TILE_ELEMENTS // block_r))
    block_m = max(4, min(block_r, MATVEC_TILE_ELEMENTS // block_r))
    num_warps = 4 if block_r <= 256 and block_k * block_r <= 4096 else 8
    return HeadTileConfig(block_k, block_r, block_m, num_warps)


def head_unsupported_reason(head: str, *, k: int, r: int, n: int, logits_dtype: torch.dtype,
                            weights_dtype: torch.dtype, device: torch.device | None = None,
                            markov_topm: int = 0) -> str | None:
    """Why the fused gated / RNN kernel cannot run this case (one line), or None when it can."""
    if head not in HEAD_KINDS:
        return f"no fused kernel for the {head!r} Markov head (gated, rnn)"
    if markov_topm:
        return f"the candidate union (markov_topm {markov_topm}) is defined for the vanilla Markov head only"
    if device is not None and torch.device(device).type != "cuda":
        return f"device {device} is not CUDA"
    if not 1 <= k <= MAX_TOPK:
        return f"top-k {k} is outside [1, {MAX_TOPK}] (TensorRT's TopK limit)"
    if not 1 <= r <= MAX_HEAD_RANK:
        return f"Markov rank {r} is outside [1, {MAX_HEAD_RANK}] (the {head} kernel holds the whole rank in registers)"
    if n < 1:
        return f"num_draft_tokens {n} must be >= 1"
    for what, dt in (("logits", logits_dtype), ("weights", weights_dtype)):
        if dt not in SUPPORTED_DTYPES:
            return f"{what} dtype {dt} is not one of fp32/fp16/bf16"
    return None


def head_markov_walk(
    head: str,
    *inputs: torch.Tensor,  # contract.GATED_INPUTS (13) | RNN_INPUTS (14), in order
    logit_scale: float,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the gated / RNN kernel on the op's inputs: (draft_tokens int32 [B, N], cand_logits fp32 [B, N, k],
    confidence fp32 [B, N]) — ``contract.REFERENCE_OPS[head]``'s outputs.

    ``out``: preallocated outputs to write into (every element is written). CUDA tensors run the compiled kernel;
    CPU tensors run in Triton's interpreter (``TRITON_INTERPRET=1`` before triton was imported).
    ``gate_w`` / ``joint_w`` may have another float dtype than W1 and W2 (the JIT kernel specialises on each; the
    TensorRT plugin's signature gives it the weights type W): the runtime passes the head's fp32 split weight
    as it is, so the walk multiplies exactly what the reference does.
    """
    if head not in HEAD_KINDS:
        raise DSparkTrtError(f"head_markov_walk: head {head!r} is not one of {', '.join(HEAD_KINDS)}")
    op, contract = HEAD_OP_NAMES[head], HEAD_INPUTS[head]
    if len(inputs) != len(contract):
        raise DSparkTrtError(f"{op} takes {len(contract)} inputs ({', '.join(c.name for c in contract)}), "
                             f"got {len(inputs)}")
    named = dict(zip((c.name for c in contract), inputs))
    cand_values, markov_w1, markov_w2 = named["cand_values"], named["markov_w1"], named["markov_w2"]
    if cand_values.dim() != 3 or markov_w1.dim() != 2 or markov_w2.dim() != 2:
        raise DSparkTrtError(f"{op} needs cand_values [B, N, k], markov_w1 [V, r] and markov_w2 [V_d, r]; got "
                             f"{tuple(cand_values.shape)}, {tuple(markov_w1.shape)}, {tuple(markov_w2.shape)}")
    B, N, k = cand_values.shape
    V, r = markov_w1.shape
    Vd = markov_w2.shape[0]
    floats = SUPPORTED_DTYPES
    want = {
        "cand_values": ((B, N, k), floats), "cand_ids": ((B, N, k), (torch.int32,)), "anchor": ((B,), (torch.int32,)),
        "markov_w1": ((V, r), floats), "markov_w2": ((Vd, r), floats), "d2t": ((Vd,), (torch.int32,)),
        "temperature": ((B,), (torch.float32,)), "seed": ((B,), (torch.int32,)), "position": ((B,), (torch.int32,)),
        "conf_base": ((B, N), (torch.float32,)), "conf_w": ((r,), (torch.float32,)),
        "gate_hidden": ((B, N, r), (torch.float32,)), "gate_w": ((r, r), floats),
        "joint_hidden": ((B, N, 3 * r), (torch.float32,)), "joint_w": ((3 * r, 2 * r), floats),
        "rnn_state0": ((B, r), (torch.float32,)),
    }
    for name, t in named.items():
        _check(name, t, *want[name], op)
    device, interpret = _launch_device(f"the fused {head} kernel", cand_values, markov_w1, markov_w2)
    why = head_unsupported_reason(head, k=k, r=r, n=N, logits_dtype=cand_values.dtype,
                                  weights_dtype=markov_w1.dtype, device=None if interpret else device)
    if why is not None:
        raise DSparkTrtError(f"the fused {head} kernel cannot run this case: {why}")
    if not math.isfinite(logit_scale):
        raise DSparkTrtError(f"logit_scale {logit_scale} must be finite")
    shapes = {"[B, N]": (B, N), "[B, N, k]": (B, N, k)}
    if out is None:
        out = tuple(torch.empty(shapes[c.shape], dtype=_DTYPES[c.dtype], device=device) for c in OUTPUTS)
    else:
        for c, t in zip(OUTPUTS, out, strict=True):
            _check(c.name, t, shapes[c.shape], (_DTYPES[c.dtype],), op)
            if not t.is_contiguous() or t.device != device:
                raise DSparkTrtError(f"output {c.name} must be a contiguous tensor on {device}")
    if B == 0:
        return tuple(out)
    tiles = head_tile_config(k, r)
    args = [t.contiguous() for t in inputs]
    constexprs = dict(N=N, K=k, R=r, BLOCK_K=tiles.block_k, BLOCK_R=tiles.block_r, BLOCK_M=tiles.block_m,
                      LOGIT_SCALE=float(logit_scale))
    fn = head_kernel(head)
    if interpret:
        fn[(B,)](*args, V, Vd, *out, **constexprs)
    else:
        with torch.cuda.device(device):
            fn[(B,)](*args, V, Vd, *out, **constexprs, num_warps=tiles.num_warps, enable_fp_fusion=False)
    return tuple(out)
