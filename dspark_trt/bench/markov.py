"""One draft round of the Markov walk: dense vs top-k, at Qwen3-8B shapes (V = 151936, r = 256, N = 7).

For each batch B and top-k k it times (median over repeats) the dense walk (N projections over the whole
vocabulary) and the top-k walk (TopK of the base logits once, then N gathered steps), both the reference
PyTorch implementations, and the device's native kernels when they support the case:

- CPU (Numba, ``plugins/cpu_walk.py``): ``kernel_ms`` = the walk given candidates; ``fused_ms`` = a whole
  top-k round (native selection + walk); ``fused_speedup`` = dense_ms / fused_ms (the reference dense round
  is already native here: N MKL GEMMs).
- CUDA: ``cublas_dense_ms`` = a dense round in the weights' dtype (cuBLAS); ``kernel_ms`` = the fused Triton
  kernel given candidates, ``kernel_speedup`` = cublas_dense_ms / kernel_ms; ``fused_ms`` = torch.topk + the
  kernel, ``fused_speedup`` = cublas_dense_ms / fused_ms.

With ``--markov-topm M`` (the candidate union, ``reference/markov.py``) every row also times the union
round over a random [V, M] table (its cost does not depend on which ids it holds; the real table is built
once at load/export): ``union_topk_ms`` (reference) and, with the native kernels, ``union_fused_ms`` (CPU:
the Numba selection + union walk; CUDA: torch.topk + the fused union kernel) and ``union_vs_topk`` =
union_fused_ms / union_plain_ms, the union round's cost
over the plain native round, both timed alternately (medians) so that the ratio survives a busy machine.

With ``--head gated|rnn`` every round walks that Markov head (``reference/markov_heads.py``) over random head
inputs (its per-slot hidden part [B, N, r | 3r], weight [r, r] | [3r, 2r], and for rnn a start state; computing the
hidden part belongs to the backbone, not to the round): the dense and top-k reference rounds and, where the
device's native kernels walk the head, its native round; ``head_vs_vanilla`` is the head's native top-k round
over the vanilla one on the same logits and weights, the two timed alternately (medians; ``vanilla_fused_ms`` the
vanilla one's). The candidate union is vanilla-only.

Memory: ``peak_rss_mb`` is the process's peak resident set while the row was timed (reset per row where Linux
allows it, ``/proc/self/clear_refs``; else the peak since the process started), ``peak_cuda_mb`` the peak CUDA
allocation over the row: the weights, the batch's base logits and whatever the rounds allocate.

Ratios are measured in one run; nothing here passes or fails.

Columns: ``speedup`` = dense_ms / topk_ms (reference vs reference); ``pass_ms`` = one read pass over the
base logits [B, N, V] (``amax``); ``topk_vs_pass`` and ``fused_vs_pass`` = a round in passes;
``floor_ms`` = bytes a top-k round must move (the base logits once + the gathered W2 rows,
B·N·V·|T| + B·N·k·r·|W|) at the read bandwidth measured in this run. ``dense_floor_ms`` likewise for
the dense round (N·V·r·|W| + B·N·V·|T|).

    dspark bench markov --device cpu --json rows.json --plot markov.png
    dspark bench markov --batch 1 --topk 16 --vocab 4099 --repeats 2     # a quick smoke run
    dspark bench markov --device cpu --batch 1,8 --topk 512 --markov-topm 32   # union cost at k = 512
    dspark bench markov --device cpu --batch 1,64 --topk 512 --head rnn   # the RNN head vs dense and vs vanilla
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..errors import DSparkTrtError
from ..process_memory import peak_rss_bytes, reset_peak_rss

__all__ = ["MarkovBenchConfig", "run_markov_bench", "plot_rows", "format_table", "add_arguments", "run"]

log = logging.getLogger("dspark.bench")

DEFAULT_BATCHES = (1, 8, 64)
DEFAULT_TOPKS = (64, 128, 256, 512, 1024, 2048, 4096)
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
HEADS = ("vanilla", "gated", "rnn")  # config.SUPPORTED_MARKOV_HEADS


@dataclass
class MarkovBenchConfig:
    device: str = "cpu"
    batches: tuple[int, ...] = DEFAULT_BATCHES
    topks: tuple[int, ...] = DEFAULT_TOPKS
    vocab: int = 151936  # V = V_d (Qwen3-8B)
    rank: int = 256
    steps: int = 7  # N
    repeats: int = 5
    warmup: int = 1
    dtype: str | None = None  # weights and logits; None: fp32 on CPU, bf16 on CUDA
    clock: str = "wall"  # CPU only: "cpu" = this process's CPU time (robust on a shared machine)
    seed: int = 0
    markov_topm: int = 0  # M > 0: also time the candidate union
    head: str = "vanilla"  # the Markov head the rounds walk: vanilla | gated | rnn
    extra: dict = field(default_factory=dict)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype or ("fp32" if self.device == "cpu" else "bf16")]


def _ms(x: float) -> float:
    """A time in ms to 4 significant digits."""
    return float(f"{x:.4g}")


def _timer(device: torch.device, clock: str = "wall") -> Callable[[Callable[[], object], int, int], float]:
    now = time.process_time if clock == "cpu" else time.perf_counter

    def median_ms(fn, repeats: int, warmup: int) -> float:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = now()
                fn()
                times.append((now() - t0) * 1e3)
        return statistics.median(times)

    return median_ms


def read_bandwidth_gbs(device: torch.device, timer, nbytes: int = 1 << 28) -> float:
    """Read bandwidth in GB/s: a reduction over ``nbytes`` (256 MiB) of fp32."""
    x = torch.ones(nbytes // 4, device=device)
    ms = timer(lambda: x.sum(), 3, 1)
    return nbytes / (ms * 1e-3) / 1e9


def bench_head(kind: str, B: int, N: int, r: int, g: torch.Generator, device: torch.device):
    """Random walk inputs of a gated / RNN head (``HeadFeatures``), or None for vanilla: pre-activations of unit
    scale, so the gates are neither saturated nor constant."""
    from ..reference.markov_heads import HeadFeatures

    if kind == "vanilla":
        return None
    if kind == "gated":
        return HeadFeatures("gated", torch.randn(B, N, r, generator=g).to(device),
                            (torch.randn(r, r, generator=g) / r**0.5).to(device))
    return HeadFeatures("rnn", torch.randn(B, N, 3 * r, generator=g).to(device),
                        (torch.randn(3 * r, 2 * r, generator=g) / (2 * r) ** 0.5).to(device),
                        torch.randn(B, r, generator=g).tanh().to(device))


class _PeakMemory:
    """The process's peak resident set (and peak CUDA allocation) over a span: ``reset()`` then ``read()``."""

    def __init__(self, device: torch.device):
        self.device = device

    def reset(self) -> None:
        reset_peak_rss()  # elsewhere than Linux: the peak since the process started
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def read(self) -> dict:
        out = {"peak_rss_mb": round(peak_rss_bytes() / 2**20, 1)}
        if self.device.type == "cuda":
            out["peak_cuda_mb"] = round(torch.cuda.max_memory_allocated(self.device) / 2**20, 1)
        return out


def run_markov_bench(cfg: MarkovBenchConfig) -> list[dict]:
    """Time the rounds; one row per (batch, topk)."""
    from ..reference.markov import markov_walk

    from ..devices import resolve_device

    if cfg.head not in HEADS:
        raise DSparkTrtError(f"--head {cfg.head!r}: use one of {', '.join(HEADS)}")
    if cfg.head != "vanilla" and cfg.markov_topm:
        raise DSparkTrtError(f"--markov-topm {cfg.markov_topm} with --head {cfg.head}: the candidate union is defined "
                             f"for the vanilla Markov head only (a {cfg.head} head's bias depends on the context); "
                             f"use --markov-topm 0")
    device = resolve_device(cfg.device)
    bad = [k for k in cfg.topks if not 1 <= k <= cfg.vocab]
    if bad:
        raise DSparkTrtError(f"--topk {bad} must be in [1, --vocab {cfg.vocab}]")
    dtype = cfg.torch_dtype
    if cfg.clock not in ("wall", "cpu") or (cfg.clock == "cpu" and device.type != "cpu"):
        raise DSparkTrtError(f"--clock {cfg.clock}: use wall, or cpu with --device cpu")
    timer = _timer(device, cfg.clock)
    g = torch.Generator().manual_seed(cfg.seed)
    V, r, N = cfg.vocab, cfg.rank, cfg.steps
    w1 = (torch.randn(V, r, generator=g) / r**0.5).to(device=device, dtype=dtype)  # [V, r]
    w2 = torch.randn(V, r, generator=g).to(device=device, dtype=dtype)  # [V_d, r]
    bw = read_bandwidth_gbs(device, timer)
    wsize, tsize = w2.element_size(), torch.empty((), dtype=dtype).element_size()
    M = cfg.markov_topm
    if not 0 <= M <= V:
        raise DSparkTrtError(f"--markov-topm {M} must be in [0, --vocab {V}]")
    table = torch.randint(0, V, (V, M), generator=g, dtype=torch.int32).to(device) if M else None  # [V, M]
    native = _native_round(device, cfg, dtype, w1, w2, timer, bw, table)
    peak = _PeakMemory(device)
    rows = []
    for B in cfg.batches:
        peak.reset()
        base = (torch.randn(B, N, V, generator=g) * 3).to(device=device, dtype=dtype)  # [B, N, V]
        anchor = torch.randint(0, V, (B,), generator=g).to(device)
        head = bench_head(cfg.head, B, N, r, g, device)
        opts = {} if head is None else {"head": head}
        pass_ms = timer(lambda: torch.amax(base, dim=-1), cfg.repeats, cfg.warmup)
        dense_ms = timer(lambda: markov_walk(base, anchor, w1, w2, topk=None, **opts), cfg.repeats, cfg.warmup)
        cublas_ms = None
        if device.type == "cuda":  # the dense round as a native-dtype cuBLAS loop (what the kernel must beat)
            cublas_ms = timer(lambda: _dense_round_native(base, anchor, w1, w2), cfg.repeats, cfg.warmup)
        log.info("B=%d: dense %.2f ms, one pass over the base logits %.3f ms", B, dense_ms, pass_ms)
        for k in cfg.topks:
            if k != cfg.topks[0]:
                peak.reset()  # the first row's peak includes drawing this batch's logits
            topk_ms = timer(lambda: markov_walk(base, anchor, w1, w2, topk=k, **opts), cfg.repeats, cfg.warmup)
            row = {
                "device": device.type,
                "head": cfg.head,
                "batch": B,
                "topk": k,
                "dense_ms": _ms(dense_ms),
                "topk_ms": _ms(topk_ms),
                "speedup": round(dense_ms / topk_ms, 2),
                "floor_ms": _ms((B * N * V * tsize + B * N * k * r * wsize) / (bw * 1e6)),
                "dense_floor_ms": _ms((N * V * r * wsize + B * N * V * tsize) / (bw * 1e6)),
                "pass_ms": _ms(pass_ms),
                "topk_vs_pass": round(topk_ms / pass_ms, 2),
            }
            if table is not None:
                union_ms = timer(lambda: markov_walk(base, anchor, w1, w2, topk=k, union_table=table), cfg.repeats,
                                 cfg.warmup)
                row.update(markov_topm=M, union_topk_ms=_ms(union_ms))
            if cublas_ms is not None:
                row["cublas_dense_ms"] = _ms(cublas_ms)
            if native is not None:
                row.update(native(base, anchor, k, cublas_ms if cublas_ms is not None else dense_ms, pass_ms, head))
            row.update(peak.read())
            rows.append(row)
            log.info("B=%d k=%d: top-k %.3f ms (%.1fx dense)", B, k, topk_ms, row["speedup"])
        base = anchor = head = opts = None  # free this batch's logits before the next batch's are drawn
    return rows


def _native_round(device: torch.device, cfg: MarkovBenchConfig, dtype: torch.dtype, w1: torch.Tensor,
                  w2: torch.Tensor, timer, bw: float, table: torch.Tensor | None = None):
    """``time(base, anchor, k, dense_ms, pass_ms, head) -> dict`` of the device's native top-k round's columns for
    one (B, k) row (``head``: the round's ``HeadFeatures``, None for vanilla), or None (logged) when no native
    kernel runs this case."""
    from ..plugins.dispatch import fallback_reason

    why = fallback_reason(device, topk=min(cfg.topks), rank=cfg.rank, num_draft_tokens=cfg.steps, logits_dtype=dtype,
                          weights_dtype=dtype, markov_head_type=cfg.head)
    if why is not None:
        log.warning("native kernel not timed: %s", why)
        return None
    if device.type == "cpu":
        from ..plugins.cpu_walk import cpu_markov_walk, cpu_select_candidates, cpu_walk_candidates

        def time_cpu(base, anchor, k, dense_ms, pass_ms, head=None):
            opts = {} if head is None else {"head": head}
            vals, ids = cpu_select_candidates(base, k)
            kernel_ms = timer(lambda: cpu_walk_candidates(vals, ids, anchor, w1, w2, **opts), cfg.repeats,
                              cfg.warmup)
            fused_ms = timer(lambda: cpu_markov_walk(base, anchor, w1, w2, topk=k, **opts), cfg.repeats, cfg.warmup)
            out = dict(kernel_ms=_ms(kernel_ms), fused_ms=_ms(fused_ms),
                       fused_speedup=round(dense_ms / fused_ms, 2), fused_vs_pass=round(fused_ms / pass_ms, 2))
            if head is not None:  # interleaved with the vanilla round: the ratio survives a busy machine
                vanilla_ms, head_ms = _paired(timer, lambda: cpu_markov_walk(base, anchor, w1, w2, topk=k),
                                              lambda: cpu_markov_walk(base, anchor, w1, w2, topk=k, head=head),
                                              cfg.repeats, cfg.warmup)
                out.update(vanilla_fused_ms=_ms(vanilla_ms), head_vs_vanilla=round(head_ms / vanilla_ms, 3))
            if table is not None:  # interleaved with the plain round: the ratio survives a busy machine
                plain_ms, union_ms = _paired(timer, lambda: cpu_markov_walk(base, anchor, w1, w2, topk=k),
                                             lambda: cpu_markov_walk(base, anchor, w1, w2, topk=k, union_table=table),
                                             cfg.repeats, cfg.warmup)
                out.update(union_fused_ms=_ms(union_ms), union_plain_ms=_ms(plain_ms),
                           union_vs_topk=round(union_ms / plain_ms, 3))
            return out

        return time_cpu
    from ..plugins.kernel import MAX_TOPK, topk_markov_walk

    def time_cuda(base, anchor, k, cublas_ms, pass_ms, head=None):
        if k > MAX_TOPK:
            return {}
        if head is not None:
            return time_cuda_head(base, anchor, k, cublas_ms, pass_ms, head)
        B, N, V = base.shape
        vals, ids = torch.topk(base, k, dim=-1)  # [B, N, k] as the engine's TopK hands them over
        dev = base.device
        rest = (anchor.to(torch.int32), w1, w2, torch.zeros(V, dtype=torch.int32, device=dev),
                torch.zeros(B, device=dev), torch.zeros(B, dtype=torch.int32, device=dev),
                torch.zeros(B, dtype=torch.int32, device=dev), torch.zeros(B, N, device=dev),
                torch.zeros(w1.shape[1], device=dev))

        def fused():  # TopK + the walk: a whole top-k round
            v, i = torch.topk(base, k, dim=-1)
            return topk_markov_walk(v, i.to(torch.int32), *rest, logit_scale=1.0)

        kernel_ms = timer(lambda: topk_markov_walk(vals, ids.to(torch.int32), *rest, logit_scale=1.0), cfg.repeats,
                          cfg.warmup)
        floor_ms = B * N * k * w1.shape[1] * w2.element_size() / (bw * 1e6)  # the gathered W2 rows at read bandwidth
        fused_ms = timer(fused, cfg.repeats, cfg.warmup)
        out = dict(kernel_ms=_ms(kernel_ms), kernel_speedup=round(cublas_ms / kernel_ms, 2),
                   fused_ms=_ms(fused_ms), fused_speedup=round(cublas_ms / fused_ms, 2),
                   fused_vs_pass=round(fused_ms / pass_ms, 2),
                   kernel_floor_ms=_ms(floor_ms), kernel_vs_floor=round(kernel_ms / floor_ms, 2))
        if table is not None:  # TopK + the union kernel, interleaved with TopK + the plain kernel
            from ..plugins.union_kernel import union_markov_walk

            def union():
                v, i = torch.topk(base, k, dim=-1)
                return union_markov_walk(v, i.to(torch.int32), *rest, table, base, logit_scale=1.0)

            plain_ms, union_ms = _paired(timer, fused, union, cfg.repeats, cfg.warmup)
            out.update(union_fused_ms=_ms(union_ms), union_plain_ms=_ms(plain_ms),
                       union_vs_topk=round(union_ms / plain_ms, 3))
        return out

    def time_cuda_head(base, anchor, k, cublas_ms, pass_ms, head):
        """A gated / RNN head's fused round (TopK + ``dispatch.fused_walk_candidates(head=)``), interleaved with
        the vanilla fused round on the same requests: the ratio survives a busy machine."""
        from ..plugins.dispatch import fused_walk_candidates

        def round_of(h):
            v, i = torch.topk(base, k, dim=-1)
            return fused_walk_candidates(v, i, anchor, w1, w2, **({} if h is None else {"head": h}))

        vanilla_ms, head_ms = _paired(timer, lambda: round_of(None), lambda: round_of(head), cfg.repeats, cfg.warmup)
        return dict(fused_ms=_ms(head_ms), fused_speedup=round(cublas_ms / head_ms, 2),
                    fused_vs_pass=round(head_ms / pass_ms, 2), vanilla_fused_ms=_ms(vanilla_ms),
                    head_vs_vanilla=round(head_ms / vanilla_ms, 3))

    return time_cuda


def _paired(timer, fn_a, fn_b, repeats: int, warmup: int) -> tuple[float, float]:
    """Medians (ms) of ``fn_a`` and ``fn_b`` timed alternately, one call each per repeat."""
    fn_a(), fn_b()
    a, b = [], []
    for _ in range(max(repeats, 1)):
        a.append(timer(fn_a, 1, warmup - 1 if warmup > 1 else 0))
        b.append(timer(fn_b, 1, 0))
    return statistics.median(a), statistics.median(b)


def _dense_round_native(base: torch.Tensor, anchor: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """A dense greedy round in the weights' dtype: N GEMMs [B, r] × [r, V_d] (cuBLAS on CUDA) and argmaxes."""
    prev, tokens = anchor, []
    for j in range(base.shape[1]):
        prev = (base[:, j] + w1[prev] @ w2.T).argmax(dim=-1)  # [B]
        tokens.append(prev)
    return torch.stack(tokens, dim=1)


def format_table(rows: list[dict]) -> str:
    cols = ["device", "head", "batch", "topk", "dense_ms", "topk_ms", "speedup", "pass_ms", "topk_vs_pass",
            "floor_ms"]
    optional = ["cublas_dense_ms", "kernel_ms", "kernel_speedup", "fused_ms", "fused_speedup", "fused_vs_pass",
                "kernel_floor_ms", "kernel_vs_floor", "vanilla_fused_ms", "head_vs_vanilla", "markov_topm",
                "union_topk_ms", "union_plain_ms", "union_fused_ms", "union_vs_topk", "peak_rss_mb", "peak_cuda_mb"]
    cols += [c for c in optional if any(c in r for r in rows)]
    widths = [max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols]
    lines = ["  ".join(c.rjust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(str(r.get(c, "")).rjust(w) for c, w in zip(cols, widths)) for r in rows]
    return "\n".join(lines)


def plot_rows(rows: list[dict], path: str) -> None:
    """Speed ratio vs k, one line per batch (and per kernel when timed); log-scaled axes."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from ..optional import pip_install

        raise DSparkTrtError(f"--plot needs matplotlib: {pip_install('bench')}") from None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for B in sorted({r["batch"] for r in rows}):
        rs = [r for r in rows if r["batch"] == B]
        ax.plot([r["topk"] for r in rs], [r["speedup"] for r in rs], marker="o", label=f"reference top-k, B={B}")
        if any("fused_speedup" in r for r in rs):
            ks = [r for r in rs if "fused_speedup" in r]
            ax.plot([r["topk"] for r in ks], [r["fused_speedup"] for r in ks], marker="s", linestyle="--",
                    label=f"native round, B={B}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("top-k candidates per slot")
    ax.set_ylabel("speed ratio vs dense round")
    head = rows[0].get("head", "vanilla") if rows else "vanilla"
    ax.set_title(f"Markov walk ({head} head), one draft round ({rows[0]['device']})" if rows else "Markov walk")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    from ..atomic import atomic_output_file

    try:
        with atomic_output_file(path) as tmp:  # a half-written plot never replaces a good one
            fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    finally:
        plt.close(fig)


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default cpu")
    p.add_argument("--batch", type=_int_list, default=None, help="batch sizes, e.g. 1,8,64 (default)")
    p.add_argument("--topk", type=_int_list, default=None, help="top-k values (default 64,...,4096)")
    p.add_argument("--vocab", type=int, default=None, help="V = V_d (default 151936, Qwen3-8B)")
    p.add_argument("--rank", type=int, default=None, help="Markov rank r (default 256)")
    p.add_argument("--steps", type=int, default=None, help="N draft tokens (default 7)")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats, median reported (default 5)")
    p.add_argument("--clock", choices=["wall", "cpu"], default=None,
                   help="wall time (default) or, on CPU, this process's CPU time (steadier on a busy machine)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads of torch and the CPU kernels (default: all cores)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default fp32 on CPU, bf16 on CUDA")
    p.add_argument("--markov-topm", type=int, default=None, metavar="M",
                   help="also time the candidate union with M table ids per slot (default 0: off; vanilla head only)")
    p.add_argument("--head", choices=HEADS, default=None,
                   help="the Markov head the rounds walk (default vanilla); gated/rnn rows also time the vanilla "
                        "native round alternately (head_vs_vanilla)")
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                   help="write the rows as JSON to PATH (or stdout without PATH) instead of the table")
    p.add_argument("--plot", default=None, metavar="PNG", help="write a speed-ratio plot")
    p.add_argument("--force", action="store_true", help="replace existing --json/--plot files")


def run(args: argparse.Namespace) -> int:
    from ..atomic import check_output_file

    given = {"device": args.device, "batches": args.batch, "topks": args.topk, "vocab": args.vocab,
             "rank": args.rank, "steps": args.steps, "repeats": args.repeats, "dtype": args.dtype, "clock": args.clock,
             "markov_topm": args.markov_topm, "head": args.head}
    cfg = MarkovBenchConfig(**{k: v for k, v in given.items() if v is not None})
    if args.threads is not None:
        from ..threads import set_cpu_threads

        set_cpu_threads(args.threads)
    for path in (args.json, args.plot):
        if path not in (None, "-"):
            check_output_file(path, force=args.force)  # refused before the (long) benchmark runs
    if args.plot:
        from ..optional import require

        require("matplotlib", "--plot")
    rows = run_markov_bench(cfg)
    if args.plot:
        plot_rows(rows, args.plot)
    if args.json == "-":
        json.dump(rows, sys.stdout, indent=1)
        print()
    else:
        if args.json:
            from ..atomic import atomic_write_text

            atomic_write_text(args.json, json.dumps(rows, indent=1) + "\n")
        print(format_table(rows))
    return 0
