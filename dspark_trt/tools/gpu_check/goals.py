"""The performance goals gpu-check records (``goals`` in the JSON) and, with ``--perf``, enforces as rows.

Goals (docs/kernel.md): the fused top-k 512 walk ≥ 10× faster than the dense cuBLAS round for every B ≤ 8 and
within 1.5× of its bytes floor at B = 64 (``dspark bench markov``); a draft round replayed from a CUDA graph
≥ 3× faster than eager at B = 1. ``perf_verdicts`` is the pure decision: one (goal, ok, detail) per goal; a
goal whose measurement is missing (its step skipped or not run) is not met.
"""

from __future__ import annotations

__all__ = ["WALK_VS_DENSE", "GRAPH_VS_EAGER", "WALK_VS_FLOOR", "recorded_goals", "perf_verdicts", "perf_step"]

WALK_VS_DENSE = 10.0  # kernel_speedup at k = 512, every B <= 8
GRAPH_VS_EAGER = 3.0  # eager_vs_graph speedup at B = 1
WALK_VS_FLOOR = 1.5  # kernel_vs_floor at k = 512, B = 64 (at most)


def _k512(bench_rows) -> list[dict]:
    return [r for r in bench_rows or [] if r.get("topk") == 512 and "kernel_ms" in r]


def recorded_goals(bench_rows, graphs, union_rows) -> dict:
    """The measurements the goals are judged by, as the JSON records them (with or without ``--perf``)."""
    rows512 = _k512(bench_rows)
    b1 = next((g for g in graphs or [] if g["batch"] == 1 and g["kind"] == "eager_vs_graph"), None)
    from .common import UNION_M

    return {
        f"graph_vs_eager_b1 >= {GRAPH_VS_EAGER:g}": None if b1 is None else b1["speedup"],
        f"kernel_vs_cublas_dense_b<=8 >= {WALK_VS_DENSE:g}": {r["batch"]: r["kernel_speedup"] for r in rows512
                                                              if r["batch"] <= 8},
        f"kernel_vs_floor_b64 <= {WALK_VS_FLOOR:g}": next((r.get("kernel_vs_floor") for r in rows512
                                                          if r["batch"] == 64), None),
        f"union_vs_plain_k512_m{UNION_M} (recorded)": {r["batch"]: r["union_vs_plain"] for r in union_rows or []},
        "draft_round_bound_over_copied_context (recorded)": {g["batch"]: g["bound_over_copied"] for g in graphs or []
                                                            if g["kind"] == "copied_vs_bound"},
    }


def perf_verdicts(bench_rows, graphs) -> list[tuple[str, bool, str]]:
    """(goal, met, detail) for each enforced goal (module docstring)."""
    out = []
    rows512 = _k512(bench_rows)
    small = sorted((r for r in rows512 if r["batch"] <= 8), key=lambda r: r["batch"])
    name = f"walk >= {WALK_VS_DENSE:g}x dense cuBLAS at B <= 8 (k=512)"
    if not small:
        out.append((name, False, "not measured: bench markov did not run"))
    else:
        slow = [r for r in small if r["kernel_speedup"] < WALK_VS_DENSE]
        each = ", ".join(f"B={r['batch']}: {r['kernel_speedup']}x" for r in small)
        out.append((name, not slow, each))
    name = f"walk <= {WALK_VS_FLOOR:g}x its bytes floor at B = 64 (k=512)"
    b64 = next((r for r in rows512 if r["batch"] == 64 and r.get("kernel_vs_floor") is not None), None)
    out.append((name, False, "not measured: bench markov did not run") if b64 is None else
               (name, b64["kernel_vs_floor"] <= WALK_VS_FLOOR, f"{b64['kernel_vs_floor']}x"))
    name = f"draft round graph >= {GRAPH_VS_EAGER:g}x eager at B = 1"
    b1 = next((g for g in graphs or [] if g["batch"] == 1 and g["kind"] == "eager_vs_graph"), None)
    out.append((name, False, "not measured: the graph timings did not run") if b1 is None else
               (name, b1["speedup"] >= GRAPH_VS_EAGER, f"{b1['speedup']}x"))
    return out


def perf_step(run) -> None:
    """``--perf``: one row per goal, FAIL where it is not met (or not measured)."""
    for name, met, detail in perf_verdicts(run.results.get("bench_markov"), run.results.get("graphs")):
        def verdict(met=met, detail=detail):
            assert met, detail
            return detail
        run.checks.run(f"goal: {name}", verdict)
