"""Random inputs for the ``DSparkTopKMarkov`` op and a tie-robust comparison of two walks: the op's conformance check.

Used by ``dspark gpu-check`` (``tools/gpu_check/``) and by the kernel, dispatch and plugin tests, so every
executor of the op is held to the same oracle (``contract.reference_op``) in the same way.

Tie robustness: two executors may sum the rank-r dot products in different orders, so two candidates
whose scores are within rounding of each other may be picked differently. ``compare_walks`` accepts a
different token only where the reference's own scores make it a near-tie, and then stops comparing that
request (its later steps follow a different predecessor).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..reference.markov import MarkovWalkResult
from ..reference.sampling import DRAFT_SALT, gumbel_noise, is_greedy

__all__ = ["WalkCase", "make_walk_inputs", "make_union_inputs", "make_head_inputs", "compare_walks",
           "compare_union_walks", "WalkMismatch", "by_candidate_id", "HEAD_KERNEL_CASES", "head_kernel_check",
           "head_kernel_checks"]


@dataclass(frozen=True)
class WalkCase:
    batch: int = 5  # B
    steps: int = 7  # N
    vocab: int = 257  # V (target vocabulary: rows of W1)
    rank: int = 8  # r
    topk: int = 16  # k
    draft_vocab: int | None = None  # V_d (rows of W2); None = V (then d2t is all zeros)
    logits_dtype: torch.dtype = torch.float32
    weights_dtype: torch.dtype = torch.float32
    logit_scale: float = 1.0
    mode: str = "greedy"  # greedy | sampled | mixed (per-request temperatures, some greedy)
    seed: int = 0

    @property
    def vd(self) -> int:
        return self.vocab if self.draft_vocab is None else self.draft_vocab


def _temperatures(case: WalkCase) -> torch.Tensor:
    B = case.batch
    if case.mode == "greedy":
        return torch.zeros(B)
    if case.mode == "sampled":
        return torch.linspace(0.6, 1.4, B) if B > 1 else torch.tensor([0.8])
    if case.mode == "mixed":  # greedy, sampled and the 1e-5 threshold on both sides, in one launch
        pattern = torch.tensor([0.0, 0.7, 1e-5, 1.3, 5e-6])  # 1e-5 samples, 5e-6 is greedy
        return pattern.repeat((B + 4) // 5)[:B]
    raise ValueError(f"unknown mode {case.mode!r}")


def make_walk_inputs(case: WalkCase, device: torch.device | str = "cpu", *, shuffle: bool = True) -> tuple:
    """The op's 11 inputs in contract order, random but determined by ``case.seed``.

    Candidates are the top-k of random base logits, in random order when ``shuffle`` (order must not matter).
    """
    return _walk_inputs(case, device, shuffle=shuffle)[0]


def make_union_inputs(case: WalkCase, topm: int, device: torch.device | str = "cpu", *, plant: bool = True) -> tuple:
    """The union op's 13 inputs (``contract.UNION_INPUTS`` order): ``make_walk_inputs``'s 11, a random
    ``union_table`` [V, M] int32 (M distinct draft ids per row) and the ``base_logits`` [B, N, V_d] the
    candidates were taken from. Cheap at real vocabularies (no [V, V_d] intermediate).

    ``plant``: each request's anchor row of the table holds some of its slot-0 top-k ids (so step 0 always
    has masked duplicates), and half the other rows hold "hot" ids whose base logits are raised into most
    slots' top-k (duplicates at later steps too)."""
    g = torch.Generator().manual_seed(case.seed + 7919)
    B, V, Vd, k, M = case.batch, case.vocab, case.vd, case.topk, topm
    h = min(4, M, k) if plant else 0  # hot ids 0..h-1, never drawn by the random rows
    inputs, base = _walk_inputs(case, "cpu", shuffle=True, hot=h)
    # row t: an arithmetic progression r_t + m·s_t over [h, V_d) with s_t·(M-1) < V_d - h: M distinct ids
    span = Vd - h
    start = torch.randint(0, span, (V, 1), generator=g)
    step = torch.randint(1, max(2, span // max(M, 1)), (V, 1), generator=g)
    table = h + (start + torch.arange(M) * step) % span  # [V, M]
    if plant:
        rows = torch.rand(V, generator=g) < 0.5
        table[rows, :h] = torch.arange(h)  # no random id is < h: still distinct
        ids, anchor = inputs[1], inputs[2]
        for b in range(B):
            a = int(anchor[b])
            take = ids[b, 0, : max(1, min(k, M) // 2)].to(torch.int64)  # slot-0 top-k ids (random order)
            rest = table[a][~torch.isin(table[a], take)][: M - len(take)]
            table[a] = torch.cat((take, rest))[torch.randperm(M, generator=g)]
    union = (table.to(torch.int32), base.to(case.logits_dtype))
    return tuple(t.to(device) for t in (*inputs, *union))


def make_head_inputs(case: WalkCase, head: str, device: torch.device | str = "cpu") -> tuple:
    """The gated (13: ``contract.GATED_INPUTS``) or RNN (14: ``RNN_INPUTS``) op's inputs: ``make_walk_inputs``'s 11,
    then random head inputs, the weight in ``case.weights_dtype``.

    Scales keep every nonlinearity in its working range: the hidden parts ~ N(0, 1), the weights ~ N(0, 1/fan-in),
    the RNN start state in (−1, 1). For the RNN head (u = tanh(o), entries of size 1 where e's are of size
    1/√r) W2 is scaled by 1/√r, so the bias stays of the base logits' size as for the other heads."""
    if head not in ("gated", "rnn"):
        raise ValueError(f"unknown head {head!r}")
    g = torch.Generator().manual_seed(case.seed + 104729)
    B, N, r = case.batch, case.steps, case.rank
    inputs = list(make_walk_inputs(case, "cpu"))
    if head == "gated":
        extra = (torch.randn(B, N, r, generator=g),  # gate_hidden [B, N, r] fp32
                 (torch.randn(r, r, generator=g) / r**0.5 * 4.0).to(case.weights_dtype))  # gate_w [r, r] W
    else:
        inputs[4] = (inputs[4].to(torch.float32) / r**0.5).to(case.weights_dtype)
        extra = (torch.randn(B, N, 3 * r, generator=g),  # joint_hidden [B, N, 3r] fp32
                 (torch.randn(3 * r, 2 * r, generator=g) / r**0.5).to(case.weights_dtype),  # joint_w [3r, 2r] W
                 torch.rand(B, r, generator=g) * 2.0 - 1.0)  # rnn_state0 [B, r] fp32
    return tuple(t.to(device) for t in (*inputs, *extra))


def _walk_inputs(case: WalkCase, device, *, shuffle: bool, hot: int = 0) -> tuple[tuple, torch.Tensor]:
    """(the 11 inputs, the fp32 base logits [B, N, V_d] they came from); ``hot``: raise ids 0..hot-1 by 5."""
    g = torch.Generator().manual_seed(case.seed)
    B, N, V, Vd, r, k = case.batch, case.steps, case.vocab, case.vd, case.rank, case.topk
    base = torch.randn(B, N, Vd, generator=g) * 3.0  # [B, N, V_d]
    if hot:
        base[..., :hot] += 5.0  # in most slots' top-k (union tests: duplicates between top-k and table rows)
    base = base.to(case.logits_dtype).to(torch.float32)  # representable in the logits dtype
    vals, ids = torch.topk(base, k, dim=-1)  # [B, N, k]
    if shuffle:
        perm = torch.argsort(torch.rand(B, N, k, generator=g), dim=-1)
        vals, ids = vals.gather(-1, perm), ids.gather(-1, perm)
    w1 = torch.randn(V, r, generator=g) / r**0.5  # e = W1[prev] has unit-scale dot products with W2 rows
    w2 = torch.randn(Vd, r, generator=g)
    if Vd < V:  # reduced vocabulary: draft id d ↦ target id t(d), strictly increasing, as speculators' d2t
        targets = torch.sort(torch.randperm(V, generator=g)[:Vd]).values
        d2t = targets - torch.arange(Vd)
    else:
        d2t = torch.zeros(Vd, dtype=torch.int64)
    inputs = (
        vals.to(case.logits_dtype),  # cand_values [B, N, k] T
        ids.to(torch.int32),  # cand_ids [B, N, k]
        torch.randint(0, V, (B,), generator=g, dtype=torch.int32),  # anchor [B]
        w1.to(case.weights_dtype),  # markov_w1 [V, r] W
        w2.to(case.weights_dtype),  # markov_w2 [V_d, r] W
        d2t.to(torch.int32),  # d2t [V_d]
        _temperatures(case),  # temperature [B] fp32
        torch.randint(0, 2**31 - 1, (B,), generator=g, dtype=torch.int32),  # seed [B]
        torch.randint(0, 1 << 20, (B,), generator=g, dtype=torch.int32),  # position [B]
        torch.randn(B, N, generator=g),  # conf_base [B, N] fp32
        torch.randn(r, generator=g) / r**0.5,  # conf_w [r] fp32
    )
    return tuple(t.to(device) for t in inputs), base


class WalkMismatch(AssertionError):
    pass


def _scores(z: torch.Tensor, ids: torch.Tensor, temp: float, seed: int, pos: int) -> torch.Tensor:
    """What the walk argmaxes at one step: z (greedy) or z / T + Gumbel noise (reference noise)."""
    if bool(is_greedy(torch.tensor([temp]))[0]):
        return z
    g = gumbel_noise(torch.tensor(seed), torch.tensor(pos), ids.to(torch.int64), DRAFT_SALT)
    return z / torch.tensor(temp, dtype=torch.float32) + g


def compare_walks(got: tuple, want: tuple, inputs: tuple, *, atol: float, rtol: float,
                  tie_tol: float = 1e-4) -> dict:
    """Check (draft_tokens, cand_logits, confidence) ``got`` against the reference ``want``.

    Logits and confidences must be close (``atol``/``rtol``) at every step up to and including a request's
    first token difference; a token difference is allowed only where the reference's score of the
    candidate ``got`` picked is within ``tie_tol`` of the best score (a near-tie). Raises ``WalkMismatch``
    naming the request, step and values; returns ``{"steps": compared, "near_ties": n}``.
    """
    tok_g, log_g, conf_g = (t.detach().cpu() for t in got)
    tok_w, log_w, conf_w = (t.detach().cpu() for t in want)
    ids, d2t, temp, seed, pos = (inputs[i].detach().cpu() for i in (1, 5, 6, 7, 8))
    B, N, k = log_w.shape
    for name, a, b in (("draft_tokens", tok_g, tok_w), ("cand_logits", log_g, log_w), ("confidence", conf_g, conf_w)):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise WalkMismatch(f"{name}: got {a.dtype}{tuple(a.shape)}, want {b.dtype}{tuple(b.shape)}")
    steps = ties = 0
    for b in range(B):
        for j in range(N):
            steps += 1
            if not torch.allclose(log_g[b, j], log_w[b, j], atol=atol, rtol=rtol):
                err = (log_g[b, j] - log_w[b, j]).abs()
                c = int(torch.nan_to_num(err, nan=float("inf")).argmax())
                raise WalkMismatch(f"cand_logits[{b}, {j}, {c}] = {log_g[b, j, c].item()!r}, reference "
                                   f"{log_w[b, j, c].item()!r} (|diff| {err[c].item():.3g} > atol {atol} + rtol {rtol})")
            if not torch.allclose(conf_g[b, j], conf_w[b, j], atol=atol, rtol=rtol):
                raise WalkMismatch(f"confidence[{b}, {j}] = {conf_g[b, j].item()!r}, reference {conf_w[b, j].item()!r}")
            if tok_g[b, j] == tok_w[b, j]:
                continue
            score = _scores(log_w[b, j], ids[b, j], float(temp[b]), int(seed[b]), int(pos[b]) + j)
            target_ids = ids[b, j].to(torch.int64) + d2t[ids[b, j].to(torch.int64)].to(torch.int64)
            picked = target_ids == tok_g[b, j].to(torch.int64)
            if not picked.any():
                raise WalkMismatch(f"draft_tokens[{b}, {j}] = {int(tok_g[b, j])} is not a candidate's target id")
            gap = (score.max() - score[picked].max()).item()
            if gap > tie_tol:
                raise WalkMismatch(f"draft_tokens[{b}, {j}] = {int(tok_g[b, j])}, reference {int(tok_w[b, j])}: "
                                   f"its reference score is {gap:.3g} below the best (not a near-tie)")
            ties += 1
            break  # later steps of this request follow a different predecessor
    return {"steps": steps, "near_ties": ties}


def compare_union_walks(got: tuple, want: tuple, inputs: tuple, *, atol: float, rtol: float,
                        tie_tol: float = 1e-4) -> dict:
    """``compare_walks`` for the union op: (draft_tokens, cand_logits [B, N, k + M], confidence, union_ids) against
    the reference's, with S_j = cand_ids ++ the reference's union_ids. The union ids must be equal at every step
    up to and including a request's first token difference (they are table[d_j]); −inf (masked duplicates)
    must sit at the same places. Returns ``compare_walks``' dict plus ``duplicates`` (masked entries seen)."""
    uid_g, uid_w = got[3].detach().cpu(), want[3].detach().cpu()
    if uid_g.shape != uid_w.shape or uid_g.dtype != uid_w.dtype:
        raise WalkMismatch(f"union_ids: got {uid_g.dtype}{tuple(uid_g.shape)}, want {uid_w.dtype}{tuple(uid_w.shape)}")
    ids = torch.cat((inputs[1].detach().cpu(), uid_w.to(inputs[1].dtype)), dim=-1)  # [B, N, k + M]
    report = compare_walks(got[:3], want[:3], (inputs[0], ids, *inputs[2:]), atol=atol, rtol=rtol, tie_tol=tie_tol)
    tok_g, tok_w = got[0].detach().cpu(), want[0].detach().cpu()
    B, N, M = uid_w.shape
    for b in range(B):
        diff = (tok_g[b] != tok_w[b]).nonzero()
        last = int(diff[0]) if len(diff) else N - 1  # steps 0..last walked from the same predecessors
        for j in range(last + 1):
            if not torch.equal(uid_g[b, j], uid_w[b, j]):
                raise WalkMismatch(f"union_ids[{b}, {j}] = {uid_g[b, j].tolist()}, reference {uid_w[b, j].tolist()}")
    log_w = want[1].detach().cpu()
    report["duplicates"] = int((log_w[..., -M:] == float("-inf")).sum()) if M else 0
    return report


def by_candidate_id(result: MarkovWalkResult) -> MarkovWalkResult:
    """``result`` with each slot's candidates in ascending id order: executors may order them differently
    (``torch.topk`` by value, the CPU kernels unordered) and the walk does not depend on the order."""
    order = result.cand_ids.argsort(dim=-1)  # [B, N, k]
    return MarkovWalkResult(tokens=result.tokens, cand_ids=result.cand_ids.gather(-1, order),
                            cand_logits=result.cand_logits.gather(-1, order), confidence=result.confidence)


# ------------------------------------------------------------------ gpu-check rows for the gated and RNN kernels
#: (head, B, k, weights/logits dtype name, mode) at Qwen3-8B shapes (V = 151936, r = 256, N = 7); quick = first two
HEAD_KERNEL_CASES = (("gated", 64, 512, "bfloat16", "mixed"), ("rnn", 64, 512, "bfloat16", "mixed"),
                     ("gated", 8, 3840, "float32", "sampled"), ("rnn", 8, 3840, "bfloat16", "sampled"),
                     ("rnn", 1, 512, "float32", "greedy"))
_QWEN3_8B = dict(vocab=151936, rank=256, steps=7)


def head_kernel_check(head: str, case: WalkCase, device: torch.device | str = "cuda", *,
                      aot_arch: int | None = None) -> str:
    """One gpu-check row: the fused ``head`` kernel on ``make_head_inputs(case)`` (poisoned outputs) against
    ``contract.REFERENCE_OPS[head]`` on the CPU, tie-robust; a one-line summary, ``WalkMismatch`` on a difference.

    ``aot_arch`` (a CUDA device): instead of the JIT kernel, the AOT PTX built here for that compute capability
    (``aot.compile_walk_kernel``, ISA capped by this driver), loaded by the driver and launched in TensorRT's AOT
    order (``ptx_launch``). ``device`` cpu runs the JIT kernel in Triton's interpreter (tests)."""
    from .contract import HEAD_OPS, REFERENCE_OPS

    inputs = make_head_inputs(case, head, device)
    B, N, k = inputs[0].shape
    dev = inputs[0].device
    out = (torch.full((B, N), -1, dtype=torch.int32, device=dev), torch.full((B, N, k), float("nan"), device=dev),
           torch.full((B, N), float("nan"), device=dev))
    where = "jit"
    if aot_arch is None:
        from .head_kernels import head_markov_walk

        head_markov_walk(head, *inputs, logit_scale=case.logit_scale, out=out)
    else:
        from .aot import DTYPE_NAMES, WalkKernelSpec, compile_walk_kernel, extra_arg_values
        from .ptx_launch import PtxModule, aot_kernel_params

        names = {getattr(torch, n): n for n in DTYPE_NAMES}
        spec = WalkKernelSpec(N, k, case.rank, case.logit_scale, names[case.logits_dtype], names[case.weights_dtype],
                              aot_arch, markov_head_type=head)
        ck = compile_walk_kernel(spec)
        shapes = {c.name: tuple(t.shape) for c, t in zip(HEAD_OPS[head][1], inputs)}
        params = aot_kernel_params([t.data_ptr() for t in inputs], extra_arg_values(shapes),
                                   [t.data_ptr() for t in out], ck.trailing_params)
        stream = torch.cuda.current_stream()
        with PtxModule(ck.ptx, ck.name) as module:
            module.launch((B, 1, 1), tuple(ck.launch["block"]), ck.launch["shared_mem"], stream.cuda_stream, params)
            stream.synchronize()
        where = f"aot {spec.sm} ISA {ck.ptx_isa}"
    if dev.type == "cuda":
        torch.cuda.synchronize()
    want = REFERENCE_OPS[head](*(t.cpu() for t in inputs), logit_scale=case.logit_scale)
    report = compare_walks(out, want, inputs, atol=2e-5, rtol=1e-5)
    return f"{where}: {report['steps']} steps, {report['near_ties']} near-ties"


def head_kernel_checks(quick: bool = False, arch: int | None = None) -> list[tuple[str, object]]:
    """The gpu-check's (row name, zero-argument check) pairs for the gated and RNN kernels: JIT at Qwen3-8B shapes
    (``HEAD_KERNEL_CASES``), and with ``arch`` (the PTX arch this GPU loads: ``aot.plugin_arch``) each head's AOT
    PTX built here, bf16, k = 512, B = 8."""
    rows = []
    for head, B, k, dt, mode in HEAD_KERNEL_CASES[:2] if quick else HEAD_KERNEL_CASES:
        case = WalkCase(batch=B, topk=k, logits_dtype=getattr(torch, dt), weights_dtype=getattr(torch, dt),
                        mode=mode, logit_scale=1.0, seed=B + k + 2, **_QWEN3_8B)
        rows.append((f"jit {head} B={B} k={k} {dt} {mode}", lambda h=head, c=case: head_kernel_check(h, c)))
    if arch is not None:
        for head in ("gated", "rnn"):
            case = WalkCase(batch=8, topk=512, logits_dtype=torch.bfloat16, weights_dtype=torch.bfloat16,
                            mode="mixed", logit_scale=1.0, seed=5, **_QWEN3_8B)
            rows.append((f"aot {head} (built here) bf16 k=512",
                         lambda h=head, c=case: head_kernel_check(h, c, aot_arch=arch)))
    return rows
