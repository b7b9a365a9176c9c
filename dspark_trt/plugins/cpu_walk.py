"""The top-k Markov round on the CPU, natively: candidate selection and the N-step walk as Numba kernels.

Math — the reference's (``reference/markov.py`` is the oracle), per request b with base logits U [N, V_d]::

    S_j     = TopK_k(U_j)                                   once per slot, before the walk (unordered)
    e_j     = W1[d_j]                                       d_0 = anchor (a target id)
    z_j     = U_j[S_j] + s · (W2[S_j] @ e_j)                [k] fp32, W2 rows gathered, fp32 accumulation
    c_j     = σ(conf_base_j + conf_w · e_j)                 confidence (optional)
    t_j     = argmax z_j                                    greedy (T < 1e-5)
            = argmax z_j / T + G(seed, pos + j, S_j)        Gumbel-max; G from ``reference.sampling``
    d_{j+1} = S_j[t_j] + d2t[S_j[t_j]]                      draft id → target id

What the verifier receives is unchanged: ``cand_logits`` = z before temperature at ``cand_ids``.

Selection (chunk maxima, then histogram selects). Split a row into nc = ⌊V_d / C⌋ chunks of C elements
(``chunk_size`` picks C; the V_d − C·nc tail elements are always scanned) and let m_k be the k-th largest
chunk maximum. The k maxima ≥ m_k are k elements ≥ m_k, so every top-k element is ≥ m_k and lies in a
chunk whose maximum is ≥ m_k. ATen computes the maxima in one vectorised pass; per row, the kernel then
finds a τ ≤ m_k with a histogram over the nc maxima (branch-free counting: quickselect's data-dependent
branches mispredict on every new row), gathers the elements ≥ τ of the ≈ k chunks ≥ τ (≈ k·C reads), and
keeps the k largest with a second histogram over those survivors. Chunks are strided (chunk j = {j, j + nc,
j + 2·nc, …}: the maxima are an elementwise max of C slices, as fast as a plain read) while the base logits
fit in cache (``STRIDED_CHUNKS_MAX_BYTES``), contiguous beyond (each chunk's survivors then cost 2 cache
lines, not C). Ties at the k-th value are broken arbitrarily; rows holding a NaN or an infinity go to
``torch.topk`` (which ranks NaN highest). Per row: one read pass plus O(nc + k·C) work.

Walk: one task per request and step when B ≥ threads; with fewer requests each step's k candidates are
split across threads and the partial argmaxes reduced. While one W2 row's dot product runs, the rows of
the next candidates are prefetched (``llvm.prefetch``). Weights fp32 or bf16 (rows widened to fp32 in
L1); Numba has no float16 on the CPU, so fp16 weights stay with the reference.

Gated and RNN heads (``head=``, ``reference.markov_heads.HeadFeatures``): the bias multiplies the head's u_j
instead of e_j (the confidence still reads e_j). Each step first runs the head's r-sized products for every
request — ``pre_b = hidden_part[b, j] + W · x_b`` with x_b = e_j (gated, W [r, r]) or [s_j ; e_j] (rnn, W [3r, 2r])
— in one parallel pass (blocks of ``HEAD_BLOCK`` requests per task, each weight element loaded once per 4
requests; with fewer blocks than threads the weight's rows are split too); the candidate tasks then take u_j from
``pre`` elementwise (gated σ(pre) ⊙ e_j; rnn tanh(o)), and the RNN's next state is written by slices, one per
task of the request, into the other of two state buffers. The walk's hot part stays the W2 row gather: the
products are B·N·r² (gated) or 6·B·N·r² (rnn) multiply-adds against B·N·k·r. The union is vanilla-only.

Candidate union (``union_table`` [V, M], ``reference.markov``'s docstring): slot j walks k + M candidates,
the last M being ``union_table[d_j]`` valued from the base logits, −inf where the id is already a top-k
candidate (k comparisons each). The union ids' Gumbel noise is hashed in the kernel (the reference's
integer hash, exact; ``-log(-log u)`` in fp32 with the C library's ``logf``, which may differ from ATen's in
the last bit), since their ids are known only once d_j is drawn. One kernel (``_walk``) walks both: M = 0
is the plain walk, whose loop is the top-k one alone (the same results bit for bit, and the same time, as
a kernel of its own).

Cost per round: B·N·V_d·4 bytes read once by the selection + B·N·k·r·|W| bytes of gathered W2 rows
(``dspark bench markov`` reports this floor beside the measured time), plus for a gated / RNN head its weight
(r²·4 or 6·r²·4 bytes, cache-resident) once per step and block of requests.
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ..errors import DSparkTrtError
from ..reference.markov import MarkovWalkResult
from ..reference.markov_heads import HeadFeatures
from ..reference.sampling import DRAFT_SALT, HASH_PRIME, HASH_ROUNDS, gumbel_noise, is_greedy, noise_prefix

__all__ = [
    "SUPPORTED_WEIGHT_DTYPES",
    "chunk_size",
    "cpu_markov_walk",
    "cpu_select_candidates",
    "cpu_unsupported_reason",
    "cpu_walk_candidates",
]

SUPPORTED_WEIGHT_DTYPES = (torch.float32, torch.bfloat16)
CHUNK_SIZES = (32, 16, 8, 4, 2, 1)  # largest first: fewer maxima to select over, more elements per chunk
_BUCKETS = 1024  # histogram select
STRIDED_CHUNKS_MAX_BYTES = 16 << 20  # base logits up to this size: strided chunks (cache-resident rows)
PREFETCH_AHEAD = 2  # candidates whose W2 rows are in flight while one is being dotted
HEAD_BLOCK = 8  # requests whose gated / RNN head products share one pass over the head's weight
_CACHE_LINE_FLOATS = 16
_DOT_FLAGS = {"reassoc", "nsz", "contract"}  # lets LLVM vectorise the fp32 dot; nothing else is relaxed


def cpu_unsupported_reason(*, topk: int | None, weights_dtype: torch.dtype) -> str | None:
    """Why the reference walk must run instead of these kernels (one line), or None when they can."""
    if topk is None:
        return "dense Markov head (no top-k): one GEMM per step is already the fast path"
    if weights_dtype not in SUPPORTED_WEIGHT_DTYPES:
        return f"weights dtype {weights_dtype} (the CPU kernels take float32 or bfloat16)"
    return None


def chunk_size(vocab: int, k: int) -> int:
    """C for the chunk-maxima selection: the largest with at least k chunks (C = 1: the row itself)."""
    return next(c for c in CHUNK_SIZES if vocab // c >= k)


# ------------------------------------------------------------------------------------------- prefetching


@intrinsic
def _prefetch(typingctx, array, index):
    """``llvm.prefetch`` (read, high locality) of ``array.data + index`` elements."""
    sig = types.void(array, index)

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            "llvm.prefetch")
        address = builder.bitcast(builder.gep(data, [args[1]]), i8p)
        builder.call(fn, [address, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


@njit(inline="always")
def _prefetch_span(flat, start, length):
    """Prefetch the cache lines of ``flat[start : start + length]`` (fp32)."""
    for off in range(0, length, _CACHE_LINE_FLOATS):
        _prefetch(flat, start + off)


# ---------------------------------------------------------------------------------------------- selection


@njit(inline="always")
def _bucket(x, lo, scale, nb):
    """clip(⌊(x − lo)·scale⌋, 0, nb − 1): monotone non-decreasing in x."""
    return np.int64(min(max((np.float64(x) - lo) * scale, 0.0), nb - 1.0))


@njit(fastmath={"nnan", "ninf", "nsz", "reassoc"})
def _min_max(v):
    """(min, max) of finite v, vectorised."""
    lo, hi = v[0], v[0]
    for i in range(1, v.shape[0]):
        lo, hi = min(lo, v[i]), max(hi, v[i])
    return np.float64(lo), np.float64(hi)


@njit
def _threshold_bucket(v, k):
    """Histogram select over v (finite, len ≥ k) → (lo, scale, nb, b, above): with
    ``_bucket(·, lo, scale, nb)`` the ``above`` < k values in buckets > b are among the k largest, and the
    rest of the k largest are the largest of bucket b. Counting is branch-free (quickselect's data-dependent
    branches mispredict on every new row)."""
    n = v.shape[0]
    nb = min(_BUCKETS, 2 * n)
    lo, hi = _min_max(v)
    scale = (nb - 1.0) / (hi - lo) if hi > lo else 0.0
    hist = np.zeros(nb, np.int64)
    for i in range(n):
        hist[_bucket(v[i], lo, scale, nb)] += 1
    above, b = 0, nb - 1
    while above + hist[b] < k:
        above += hist[b]
        b -= 1
    return lo, scale, nb, b, above


@njit
def _lower_edge(lo, scale, b):
    """A value <= every x with ``_bucket(x) >= b`` (half a bucket of slack for rounding)."""
    return -np.inf if b == 0 or scale == 0.0 else lo + (b - 0.5) / scale


@njit(parallel=True, cache=True, nogil=True)
def _select_rows(x, maxima, strided, k, out_ids, out_vals, bad_rows):  # pragma: no cover - compiled
    """x [R, V] fp32, maxima [R, nc] fp32 (chunk j = x[:, j : C·nc : nc] when ``strided``, else
    x[:, j·C : j·C + C]; C = V // nc; the V − C·nc tail elements are always scanned) → out_ids [R, k] int64
    and out_vals [R, k] fp32, the unordered top-k; bad_rows [R] = 1 where a NaN or an infinity leaves the
    row undone."""
    R, V = x.shape
    nc = maxima.shape[1]
    C = V // nc
    for row in prange(R):
        xr, mr = x[row], maxima[row]
        bad = False
        for j in range(nc):
            bad |= not abs(mr[j]) < np.inf
        for i in range(C * nc, V):
            bad |= not abs(xr[i]) < np.inf
        if bad:
            bad_rows[row] = 1
            continue
        # every top-k element is >= m_k, the k-th largest chunk maximum, and sits in a chunk whose max is >= m_k
        lo, scale, nb, b, _ = _threshold_bucket(mr, k)
        tau = _lower_edge(lo, scale, b)  # <= m_k
        chunks = 0
        for j in range(nc):
            chunks += mr[j] >= tau
        vals = np.empty(chunks * C + V - C * nc, np.float32)  # survivors (>= k of them), room for all
        where = np.empty(vals.shape[0], np.int64)
        n = 0
        for j in range(nc):
            if mr[j] < tau:
                continue
            start, stop, step = (j, C * nc, nc) if strided else (j * C, j * C + C, 1)
            for i in range(start, stop, step):
                if xr[i] >= tau:
                    vals[n] = xr[i]
                    where[n] = i
                    n += 1
        for i in range(C * nc, V):
            if xr[i] >= tau:
                vals[n] = xr[i]
                where[n] = i
                n += 1
        vals, where = vals[:n], where[:n]
        # the k largest survivors: every value in a bucket above b, then the largest of bucket b
        lo, scale, nb, b, above = _threshold_bucket(vals, k)
        out = 0
        edge = 0
        for s in range(n):
            q = _bucket(vals[s], lo, scale, nb)
            if q > b:
                out_ids[row, out], out_vals[row, out] = where[s], vals[s]
                out += 1
            elif q == b:
                edge += 1
        tied = np.empty(edge, np.int64)  # survivors in bucket b, as positions in vals
        e = 0
        for s in range(n):
            if _bucket(vals[s], lo, scale, nb) == b:
                tied[e] = s
                e += 1
        order = np.argsort(-vals[tied])  # descending; bucket b is small unless values tie
        for t in range(k - above):
            out_ids[row, out + t], out_vals[row, out + t] = where[tied[order[t]]], vals[tied[order[t]]]


def cpu_select_candidates(base_logits: torch.Tensor, topk: int, *,
                          out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``reference.markov.select_candidates`` for top-k on the CPU: (values fp32, ids int64) [B, N, k].

    The same candidate set as ``torch.topk`` up to ties at the k-th value; the order is unspecified (the
    walk does not depend on it). ``out`` (optional): contiguous CPU buffers (values, ids) the kernel writes."""
    if base_logits.device.type != "cpu":
        raise DSparkTrtError(f"the CPU Markov kernels take CPU tensors, got {base_logits.device}")
    Vd = base_logits.shape[-1]
    if not 1 <= topk <= Vd:
        raise DSparkTrtError(f"top-k {topk} must be in [1, draft_vocab_size={Vd}]; use a smaller --topk or 'off'")
    base = base_logits.detach()
    base = base if base.dtype == torch.float32 else base.float()
    rows = base.reshape(-1, Vd)  # [R, V_d] (a view when contiguous)
    R = rows.shape[0]
    shape = (*base.shape[:-1], topk)
    if out is None:
        out = (torch.empty(shape), torch.empty(shape, dtype=torch.int64))
    _check_out(out, (shape, shape), (torch.float32, torch.int64))
    vals_t, ids_t = out[0].view(R, topk), out[1].view(R, topk)  # [R, k] each, every element written
    vals, ids = vals_t.numpy(), ids_t.numpy()
    bad_rows = np.zeros(R, np.uint8)
    if R:
        C = chunk_size(Vd, topk)
        nc = Vd // C
        strided = R * Vd * 4 <= STRIDED_CHUNKS_MAX_BYTES
        # [R, nc] in one vectorised ATen pass: strided chunks are an elementwise max of C slices (as fast as
        # a plain read) but their survivors sit C cache lines apart, cheap only while the rows stay cached
        maxima = rows[:, : C * nc].view(R, C, nc).amax(dim=1) if strided else rows[:, : C * nc].view(R, nc, C).amax(-1)
        _select_rows(rows.numpy(), maxima.numpy(), strided, topk, ids, vals, bad_rows)
    if bad_rows.any():  # NaN or infinite logits: torch.topk's ranking (NaN highest) decides those rows
        bad = torch.from_numpy(bad_rows.nonzero()[0])
        vals_t[bad], ids_t[bad] = torch.topk(rows[bad], topk, dim=-1)
    return out


# ------------------------------------------------------------------------------------------------- walk


@njit(inline="always")
def _prefetch_row(flat, row, r):
    _prefetch_span(flat, np.int64(row) * r, r)


@njit(fastmath=_DOT_FLAGS)
def _dot(a, b):
    s = np.float32(0.0)
    for i in range(b.shape[0]):
        s += np.float32(a[i]) * b[i]
    return s


@njit(fastmath=_DOT_FLAGS)
def _dot4(w, x0, x1, x2, x3):
    """(w · x0, w · x1, w · x2, w · x3) in fp32, each w[i] loaded once."""
    a0 = a1 = a2 = a3 = np.float32(0.0)
    for i in range(w.shape[0]):
        wi = w[i]
        a0 += wi * x0[i]
        a1 += wi * x1[i]
        a2 += wi * x2[i]
        a3 += wi * x3[i]
    return a0, a1, a2, a3


@njit
def _widen(row, bf16, out_bits, out_f32):
    """One weight row as fp32 in ``out_f32`` (``out_bits`` is its uint32 view): bf16 bits << 16, or a cast."""
    if bf16:
        for i in range(row.shape[0]):
            out_bits[i] = np.uint32(row[i]) << 16
    else:
        for i in range(row.shape[0]):
            out_f32[i] = np.float32(row[i])


_A1, _C1 = HASH_ROUNDS[0]
_A2, _C2 = HASH_ROUNDS[1]


@njit(inline="always")
def _mix(x):
    """``reference.sampling._mix`` on one int64 in [0, P)."""
    x = (x * x + _C1) % HASH_PRIME
    x = (x * _A1) % HASH_PRIME
    x = (x * x + _C2) % HASH_PRIME
    return (x * _A2) % HASH_PRIME


@njit(inline="always")
def _gumbel(prefix, token):
    """``reference.sampling.gumbel_noise`` from a hoisted ``noise_prefix`` and a token id."""
    h = _mix((prefix + token % HASH_PRIME) % HASH_PRIME)
    u = (np.float32(h // 256) + np.float32(0.5)) * np.float32(2.0**-23)
    return -np.log(-np.log(u))


@njit(inline="always")
def _corrected(v, cid, w2, w2_bf16, e, row, row_bits, scale):
    """z = v + s · (W2[cid] · e): one candidate's corrected logit (fp32 dot; a bf16 row widened into ``row``)."""
    if w2_bf16:
        _widen(w2[cid], True, row_bits, row)
        bias = _dot(row, e)
    else:
        bias = _dot(w2[cid], e)
    return v + np.float32(scale * bias)


@njit(inline="always")
def _sigmoid(x):
    return np.float32(1.0) / (np.float32(1.0) + np.exp(-x))


@njit(inline="always")
def _head_pre(kind, hidden, weight, state, w1, w1_bf16, prev, b0, b1, o0, o1, j, pre):
    """pre[b, o] = hidden[b, j, o] + weight[o] · x_b for requests [b0, b1) and rows [o0, o1): the gated / RNN
    head's products for a block of requests at once (x_b = e_b, or [s_b ; e_b] with s_b = state[j % 2, b]): each
    weight row is read once per block (the block's x rows stay in L1), each of its elements once per 4 requests."""
    r = w1.shape[1]
    width = weight.shape[1]
    x = np.empty((b1 - b0, width), np.float32)
    e = np.empty(r, np.float32)
    for t in range(b1 - b0):
        _widen(w1[prev[b0 + t]], w1_bf16, e.view(np.uint32), e)
        if kind == 1:
            x[t, :] = e
        else:
            x[t, :r] = state[j % 2, b0 + t]
            x[t, r:] = e
    n4 = (b1 - b0) // 4 * 4
    for o in range(o0, o1):
        w = weight[o]
        for t in range(0, n4, 4):  # four requests per pass over the row: one load of w[i] for four products
            a0, a1, a2, a3 = _dot4(w, x[t], x[t + 1], x[t + 2], x[t + 3])
            pre[b0 + t, o] = hidden[b0 + t, j, o] + a0
            pre[b0 + t + 1, o] = hidden[b0 + t + 1, j, o] + a1
            pre[b0 + t + 2, o] = hidden[b0 + t + 2, j, o] + a2
            pre[b0 + t + 3, o] = hidden[b0 + t + 3, j, o] + a3
        for t in range(n4, b1 - b0):
            pre[b0 + t, o] = hidden[b0 + t, j, o] + _dot(w, x[t])


@njit(inline="always")
def _head_from_pre(kind, pre, state, b, j, e, part, splits, u):
    """u_j of request b from its ``_head_pre`` products, and (RNN) this task's ``part`` of the ``splits`` shares
    of the next state, read from state[j % 2] and written to state[(j + 1) % 2]."""
    r = e.shape[0]
    if kind == 1:
        for o in range(r):
            u[o] = _sigmoid(pre[b, o]) * e[o]
        return
    for o in range(r):
        u[o] = np.tanh(pre[b, 2 * r + o])
    s_in, s_out = state[j % 2, b], state[(j + 1) % 2, b]
    per = (r + splits - 1) // splits
    for i in range(part * per, min(r, part * per + per)):
        gate = _sigmoid(pre[b, i])
        s_out[i] = gate * s_in[i] + (np.float32(1.0) - gate) * np.tanh(pre[b, r + i])


@njit(parallel=True, cache=True, nogil=True)
def _walk(vals, ids, base, table, anchor, w1, w1_bf16, w2, w2_bf16, d2t, scale, temp, greedy, noise, prefix,
          conf_base, conf_w, head_kind, head_hidden, head_w, head_state, head_row_splits, splits, all_ids, tokens,
          logits, conf, status):  # pragma: no cover - compiled
    """The N-step walk over k + M candidates per slot (module docstring; M = table's width, 0 = the plain walk,
    which reads no table, no base logits, no noise prefix and no union ids: its loop is the top-k one alone).

    Reads vals [B, N, k] f32, ids [B, N, k] i64, base [B, N, V_d] f32 and table [V, M] (the union's: its ids'
    base values, and the ids per predecessor), anchor [B] i64, w1 [V, r] and w2 [V_d, r] (f32, or bf16 bits as
    u16 where w*_bf16), d2t [V_d] i64 (empty: identity), temp [B] f32, greedy [B] bool, noise [B, N, k] f32 (the
    top-k ids' Gumbel noise, read for sampled requests only), prefix [B, N] i64 (the noise prefix per slot: the
    M union ids' noise is hashed here, their ids being known only once d_j is drawn), conf_base [B, N] f32 and
    conf_w [r] f32 (empty: no confidence); ``head_kind`` 0 (vanilla: the bias multiplies e_j), 1 (gated) or 2
    (rnn) with ``head_hidden`` [B, N, r | 3r] f32, ``head_w`` [r, r | 3r, 2r] f32 and ``head_state`` [2, B, r] f32
    (rnn: [0] holds the start state; the steps alternate between the two), ``head_row_splits`` tasks per block
    of requests for its products — the bias then multiplies the head's u_j (``_head_pre``, ``_head_from_pre``),
    the confidence still reads e_j; ``splits`` tasks per request and step, each over a range of the k + M
    candidates. Writes all_ids [B, N, k + M] (ids, then table[d_j]; only when M > 0), tokens [B, N] i64,
    logits [B, N, k + M] f32
    (−inf at a union id that is already a top-k id), conf [B, N] f32; status [B] = 1 where a target id left
    [0, V), 2 where a table id left [0, V_d) (that request's walk stops)."""
    B, N, k = vals.shape
    M = table.shape[1]
    K = k + M
    V, r = w1.shape
    Vd = w2.shape[0]
    flat = w2.reshape(-1)
    prev = anchor.copy()  # [B] target ids d_j
    per = (K + splits - 1) // splits
    best_score = np.empty((B, splits), np.float32)
    best_at = np.empty((B, splits), np.int64)
    with_conf = conf_base.shape[0] > 0
    # a gated / RNN head: each step first runs its products (blocks of HEAD_BLOCK requests × head_row_splits
    # shares of the weight's rows per task), then the candidate tasks read u_j from them
    with_head = head_kind != 0
    rows = head_w.shape[0]
    blocks = (B + HEAD_BLOCK - 1) // HEAD_BLOCK
    row_splits = max(1, min(head_row_splits, rows))
    row_per = (rows + row_splits - 1) // row_splits
    pre = np.empty((B if with_head else 0, rows), np.float32)  # [B, r | 3r]: hidden part + weight · x
    for j in range(N):
        if with_head:
            for task in prange(blocks * row_splits):
                blk, rs = task // row_splits, task % row_splits
                _head_pre(head_kind, head_hidden, head_w, head_state, w1, w1_bf16, prev, blk * HEAD_BLOCK,
                          min(B, blk * HEAD_BLOCK + HEAD_BLOCK), rs * row_per, min(rows, rs * row_per + row_per),
                          j, pre)
        for task in prange(B * splits):
            b, part = task // splits, task % splits
            if status[b]:
                continue
            e = np.empty(r, np.float32)  # [r] e_j = W1[d_j] in fp32
            _widen(w1[prev[b]], w1_bf16, e.view(np.uint32), e)
            if with_conf and part == 0:
                conf[b, j] = 1.0 / (1.0 + np.exp(-(conf_base[b, j] + _dot(conf_w, e))))
            u = e  # what multiplies the W2 rows
            if with_head:
                u = np.empty(r, np.float32)
                _head_from_pre(head_kind, pre, head_state, b, j, e, part, splits, u)
            row = np.empty(r, np.float32)  # [r] scratch for a widened bf16 W2 row
            row_bits = row.view(np.uint32)
            lo, hi = part * per, min(K, part * per + per)
            top, at = np.float32(-np.inf), lo
            hi_k = min(hi, k)  # the task's top-k candidates: [lo, hi_k)
            for c in range(lo, min(hi_k, lo + PREFETCH_AHEAD)):
                _prefetch_row(flat, ids[b, j, c], r)
            for c in range(lo, hi_k):
                if c + PREFETCH_AHEAD < hi_k:
                    _prefetch_row(flat, ids[b, j, c + PREFETCH_AHEAD], r)
                z = _corrected(vals[b, j, c], ids[b, j, c], w2, w2_bf16, u, row, row_bits, scale)
                logits[b, j, c] = z
                score = z if greedy[b] else z / temp[b] + noise[b, j, c]
                if score > top or c == lo:  # first maximum wins, as torch.argmax
                    top, at = score, c
            if M == 0:
                best_score[b, part], best_at[b, part] = top, at
                continue
            for c in range(lo, hi_k):  # the union's candidate ids: the top-k ones, then the table row of d_j
                all_ids[b, j, c] = ids[b, j, c]
            lo_m = max(lo, k)  # the task's union candidates: [lo_m, hi)
            for c in range(lo_m, hi):
                cid = np.int64(table[prev[b], c - k])
                if cid < 0 or cid >= Vd:
                    status[b] = 2  # a table id outside the draft vocabulary: this request stops
                    cid = 0
                all_ids[b, j, c] = cid
            for c in range(lo_m, min(hi, lo_m + PREFETCH_AHEAD)):
                _prefetch_row(flat, all_ids[b, j, c], r)
            for c in range(lo_m, hi):
                if c + PREFETCH_AHEAD < hi:
                    _prefetch_row(flat, all_ids[b, j, c + PREFETCH_AHEAD], r)
                cid = all_ids[b, j, c]
                hit = False
                for t in range(k):  # branch-free: vectorises
                    hit |= ids[b, j, t] == cid
                v = np.float32(-np.inf) if hit else base[b, j, cid]
                z = _corrected(v, cid, w2, w2_bf16, u, row, row_bits, scale)
                logits[b, j, c] = z
                score = z if greedy[b] else z / temp[b] + _gumbel(prefix[b, j], cid)
                if score > top or c == lo:  # after the top-k ones: a top-k candidate wins a tie
                    top, at = score, c
            best_score[b, part], best_at[b, part] = top, at
        for b in range(B):
            if status[b]:
                continue
            at = best_at[b, 0]
            for part in range(1, splits):
                if best_at[b, part] < K and best_score[b, part] > best_score[b, 0]:
                    best_score[b, 0], at = best_score[b, part], best_at[b, part]
            draft = ids[b, j, at] if at < k else all_ids[b, j, at]
            target = draft + d2t[draft] if d2t.shape[0] else draft
            if target < 0 or target >= V:
                status[b] = 1
                continue
            tokens[b, j] = target
            prev[b] = target


#: what the plain walk (M = 0) passes for the union's arrays: never read
_NO_TABLE, _NO_BASE = np.empty((0, 0), np.int64), np.empty((0, 0, 0), np.float32)
_NO_PREFIX, _NO_IDS = np.empty((0, 0), np.int64), np.empty((0, 0, 0), np.int64)


def _weights(w: torch.Tensor) -> tuple[np.ndarray, bool]:
    """A weight matrix as a NumPy array the kernel reads: fp32 as is, bf16 as its uint16 bit patterns."""
    w = w.detach().contiguous()
    if w.dtype == torch.bfloat16:
        return w.view(torch.int16).numpy().view(np.uint16), True
    return w.to(torch.float32).numpy(), False


#: what a vanilla walk passes for the head's arrays: never read
_NO_HEAD = (0, np.empty((0, 0, 0), np.float32), np.empty((0, 0), np.float32), np.empty((0, 0, 0), np.float32))
_HEAD_KINDS = {"gated": 1, "rnn": 2}


def _head_arrays(head: HeadFeatures | None, B: int, N: int, r: int) -> tuple:
    """(kind, hidden [B, N, r | 3r], weight, state [2, B, r]) as the kernel reads them (fp32, contiguous)."""
    if head is None:
        return _NO_HEAD
    if tuple(head.hidden_part.shape[:2]) != (B, N) or head.rank != r:
        raise DSparkTrtError(f"the {head.kind} head's hidden part has shape {list(head.hidden_part.shape)}; this "
                             f"walk needs [{B}, {N}, {r if head.kind == 'gated' else 3 * r}] (B, N, rank r)")
    hidden = head.hidden_part.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy()
    weight = head.weight.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy()
    state = np.zeros((2, B, r), np.float32)
    if head.kind == "rnn" and head.state0 is not None:
        state[0] = head.state0.detach().to(device="cpu", dtype=torch.float32).numpy()
    return _HEAD_KINDS[head.kind], hidden, weight, state


def _check_out(out: tuple, shapes: tuple, dtypes: tuple) -> None:
    for t, shape, dtype in zip(out, shapes, dtypes):
        if tuple(t.shape) != tuple(shape) or t.dtype != dtype or not t.is_contiguous() or t.device.type != "cpu":
            raise DSparkTrtError(f"out buffers must be contiguous CPU {dtype}{tuple(shape)}; "
                                 f"got {t.dtype}{tuple(t.shape)}")


def _threads() -> int:
    return numba.get_num_threads()


def cpu_walk_candidates(
    cand_vals: torch.Tensor,  # [B, N, k] base logits at the candidates
    cand_ids: torch.Tensor | None,  # [B, N, k] int draft-vocab ids
    anchor: torch.Tensor,  # [B] int target ids
    w1: torch.Tensor,  # [V, r]
    w2: torch.Tensor,  # [V_d, r]
    *,
    logit_scale: float = 1.0,
    d2t: torch.Tensor | None = None,  # [V_d] int offsets
    temperature: torch.Tensor | None = None,  # [B] fp32; < 1e-5 greedy
    seed: torch.Tensor | None = None,  # [B] int >= 0
    positions: torch.Tensor | None = None,  # [B] int: position of d_1
    conf_base: torch.Tensor | None = None,  # [B, N] fp32
    conf_w_markov: torch.Tensor | None = None,  # [r]
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,  # tokens, cand_logits, confidence
    union_table: torch.Tensor | None = None,  # [V, M] int draft ids: the candidate union (reference.markov)
    base_logits: torch.Tensor | None = None,  # [B, N, V_d] base logits, read at the union's ids
    head: HeadFeatures | None = None,  # a gated or RNN head's walk inputs (None = vanilla)
) -> MarkovWalkResult:
    """``reference.markov.walk_candidates`` (top-k) as one native kernel on the CPU; same result type.

    ``out`` (optional): contiguous CPU buffers the kernel writes — tokens [B, N] int64, cand_logits [B, N, k + M]
    fp32, confidence [B, N] fp32 — returned in the result. With ``union_table`` (M > 0) the candidate union:
    cand_ids and cand_logits are [B, N, k + M]; M = 0 (no table) is the plain walk, the same kernel. With
    ``head`` (``reference.markov_heads.HeadFeatures``) the bias multiplies the gated / RNN head's u_j."""
    M = 0 if union_table is None else int(union_table.shape[-1])
    if M and head is not None:
        raise DSparkTrtError(f"the candidate union (--markov-topm M > 0) is defined for the vanilla Markov head "
                             f"only: a {head.kind} head's bias depends on the context; use --markov-topm 0")
    if cand_ids is None:
        raise DSparkTrtError("the candidate union (--markov-topm M > 0) needs a top-k head: the dense head already "
                             "scores every token; use --markov-topm 0 or a --topk" if M else
                             "the CPU Markov kernel walks top-k candidates; use reference walk_candidates for dense")
    if M and base_logits is None:
        raise DSparkTrtError("the candidate union needs the base logits [B, N, V_d] to value the table's ids")
    if temperature is not None and (seed is None or positions is None):
        raise DSparkTrtError("a temperature tensor needs seed and positions tensors (the Gumbel noise key)")
    B, N, k = cand_vals.shape
    V, Vd = w1.shape[0], w2.shape[0]
    ids = cand_ids.detach().to(torch.int64).contiguous()  # [B, N, k]
    ids_np, anchor_np = ids.numpy(), anchor.detach().to(torch.int64).contiguous().numpy()
    for name, a, hi in (("cand_ids", ids_np, Vd), ("anchor", anchor_np, V)):  # the kernel reads memory unchecked
        if a.size and (a.min() < 0 or a.max() >= hi):
            raise DSparkTrtError(f"{name} must lie in [0, {hi}); got [{a.min()}, {a.max()}]")
    if M:
        table = union_table.detach()  # [V, M] int32 or int64, read as is (ids range-checked in the kernel)
        table = table if table.dtype in (torch.int32, torch.int64) and table.is_contiguous() else \
            table.to(torch.int64).contiguous()
        if table.shape[0] != V:
            raise DSparkTrtError(f"union_table has {table.shape[0]} rows; it is indexed by target id ([V={V}, M])")
        table_np = table.numpy()
        base = base_logits.detach().to(torch.float32).contiguous().numpy()  # [B, N, V_d]
        prefix = np.zeros((B, N), np.int64)
    else:  # the plain walk: no table, no base logits, no prefix
        table_np, base, prefix = _NO_TABLE, _NO_BASE, _NO_PREFIX
    w1_np, w1_bf16 = _weights(w1)
    w2_np, w2_bf16 = _weights(w2)
    if temperature is None:
        greedy, temp, noise = np.ones(B, np.bool_), np.ones(B, np.float32), np.empty((0, 0, 0), np.float32)
    else:
        t = temperature.detach().to(torch.float32).cpu()  # [B]
        greedy_t = is_greedy(t)
        greedy, temp = greedy_t.numpy(), torch.where(greedy_t, 1.0, t).numpy()
        steps = positions.to(torch.int64).cpu().view(B, 1, 1) + torch.arange(N).view(1, N, 1)  # [B, N, 1]
        seeds = seed.to(torch.int64).cpu().view(B, 1, 1)
        noise = gumbel_noise(seeds, steps, ids, DRAFT_SALT).numpy()  # [B, N, k]
        if M:  # the union ids' noise is hashed in the kernel from this per-slot prefix
            prefix = noise_prefix(seeds.view(B, 1), steps.view(B, N), DRAFT_SALT).contiguous().numpy()  # [B, N]
    with_conf = conf_base is not None
    empty = np.empty(0, np.float32)
    cb = conf_base.detach().to(torch.float32).contiguous().numpy() if with_conf else empty.reshape(0, 0)  # [B, N]
    cw = empty if not with_conf else (np.zeros(w1.shape[1], np.float32) if conf_w_markov is None
                                      else conf_w_markov.detach().to(torch.float32).contiguous().numpy())  # [r]
    offsets = np.empty(0, np.int64) if d2t is None else d2t.to(torch.int64).contiguous().numpy()  # [V_d]
    head_kind, head_hidden, head_w, head_state = _head_arrays(head, B, N, w1.shape[1])
    if out is None:
        out = (torch.empty(B, N, dtype=torch.int64), torch.empty(B, N, k + M), torch.empty(B, N))
    _check_out(out, ((B, N), (B, N, k + M), (B, N)), (torch.int64, torch.float32, torch.float32))
    tokens, logits, conf = (t.numpy() for t in out)
    all_ids = torch.empty(B, N, k + M, dtype=torch.int64) if M else ids  # [B, N, k + M]: ids ++ table[d_j]
    status = np.zeros(B, np.uint8)
    if B and N and k + M:
        splits = max(1, min(_threads() // B, k + M))  # few requests: split each step's candidates over threads
        vals = cand_vals.detach().to(torch.float32).contiguous().numpy()  # [B, N, k]
        _walk(vals, ids_np, base, table_np, anchor_np, w1_np, w1_bf16, w2_np, w2_bf16, offsets,
              np.float32(logit_scale), temp, greedy, noise, prefix, cb, cw, head_kind, head_hidden, head_w,
              head_state, max(1, _threads() // -(-B // HEAD_BLOCK)), splits,
              all_ids.numpy() if M else _NO_IDS, tokens, logits, conf, status)
    if status.any():
        if (status == 2).any():
            raise DSparkTrtError(f"union_table holds ids outside [0, {Vd}); build it with "
                                 f"reference.markov.markov_union_table from this drafter's weights")
        raise DSparkTrtError(f"request {int(status.argmax())}: a drafted id mapped through d2t left the target "
                             f"vocabulary [0, {V}); check the checkpoint's d2t table")
    return MarkovWalkResult(tokens=out[0], cand_ids=all_ids,
                            cand_logits=out[1], confidence=out[2] if with_conf else None, union_width=M)


def cpu_markov_walk(base_logits: torch.Tensor, anchor: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, *,
                    topk: int | None = None, **walk_options) -> MarkovWalkResult:
    """``reference.markov.markov_walk`` for top-k: native selection, then the native walk."""
    if topk is None:
        raise DSparkTrtError("the CPU Markov kernels walk top-k candidates; use reference markov_walk for dense")
    cand_vals, cand_ids = cpu_select_candidates(base_logits, topk)
    if walk_options.get("union_table") is not None:
        walk_options.setdefault("base_logits", base_logits)
    return cpu_walk_candidates(cand_vals, cand_ids, anchor, w1, w2, **walk_options)
