"""Step 3 of gpu-check: ``dspark bench markov --device cuda`` (the fused walk vs the dense cuBLAS round, and vs
its bytes floor)."""

from __future__ import annotations

__all__ = ["bench", "bench_step"]


def bench(quick: bool) -> tuple[str, dict]:
    from ...bench.markov import MarkovBenchConfig, format_table, run_markov_bench

    cfg = MarkovBenchConfig(device="cuda", repeats=20, warmup=3,
                            topks=(64, 512, 3840) if quick else (64, 128, 256, 512, 1024, 2048, 3840))
    rows = run_markov_bench(cfg)
    print(format_table(rows), flush=True)
    k512 = {r["batch"]: r for r in rows if r["topk"] == 512 and "kernel_ms" in r}
    detail = "; ".join(f"B={b}: {r['kernel_speedup']}x cuBLAS dense, {r.get('kernel_vs_floor')}x its floor"
                       for b, r in sorted(k512.items()))
    return detail, {"rows": rows}


def bench_step(run) -> None:
    data = run.checks.run("bench markov --device cuda (k=512)", lambda: bench(run.options.quick))
    run.results["bench_markov"] = (data or {}).get("rows")
