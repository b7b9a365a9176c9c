"""``dspark gpu-check --out DIR``: everything that needs a GPU, in one command (≈ 4–8 min on one H200).

    # optional, on the CPU machine: the PTX a TensorRT engine would embed (ISA 8.0: CUDA >= 12.0 drivers)
    python -m dspark_trt.plugins.aot --out ptx --n 7 --k 512 --rank 256 --dtypes fp32-bf16,bf16-bf16 --validate
    # on the GPU host, from the repository root, with its own torch/Triton (installs nothing)
    PYTHONPATH=. python -m dspark_trt.cli.main gpu-check --out gpu-check [--ptx-dir ptx] [--quick]

1. **JIT kernel vs reference** at real shapes (V = 151936, r = 256, N = 7; k ∈ {512, 3840}; B ∈ {1, 8, 64};
   bf16 and fp32; greedy and mixed temperatures; a reduced vocabulary): the Triton kernel on CUDA against
   ``contract.reference_op`` on the CPU, tie-robust (``plugins.walk_compare.compare_walks``).
2. **AOT PTX through the driver API**: PTX compiled here (ISA capped by this driver) and, with ``--ptx-dir``,
   the files built on the CPU machine — loaded with ``cuModuleLoadDataEx`` (the driver's JIT) and launched
   with ``cuLaunchKernel`` in TensorRT's AOT order; a file runs only where it loads (``aot.ptx_runs_on``:
   sm_90a PTX on capability 9.0 exactly, sm_80 PTX on 8.0 and newer).
   The candidate union's kernel (``union_kernel.py``, M = 32) the same way: JIT against
   ``contract.reference_union_op`` (planted duplicates between top-k and table rows), its AOT PTX through the
   driver API in the 13-input / 4-output order, and its time against the plain kernel's at k = 512, M = 32
   (B ∈ {1, 8, 64}: the union's cost, reported as a ratio).
3. **``dspark bench markov --device cuda``**: the fused walk vs the dense cuBLAS round, and vs its bytes floor.
4. **CUDA graphs**: a Qwen3-8B-shaped drafter (5 layers, d = 4096, V = 151936, random bf16 weights), the
   torch backend's captured round (backbone + top-k + fused walk) against the same padded round run
   eagerly, token for token, at batch buckets 1/4/8 (greedy and sampled rounds, fresh seeds per replay);
   then a draft round's time eager (unpadded, no graph) vs replayed, per bucket (``graphs`` rows of
   ``"kind": "eager_vs_graph"``); the same with a bound ``DrafterState`` (``"kind": "copied_vs_bound"``).
   Wherever a graph mode is claimed (here and in 5) a capture that fell back to eager is a FAIL row
   (``assert_graphs_captured``; ``GraphRunner.fallbacks``), not the warning it is elsewhere.
5. **TensorRT** (when full TensorRT is importable; otherwise one ``SKIP`` row, "TensorRT not importable: …",
   and the rest runs): the tiny pair exported with engines through the ONNX parser (context, draft with the
   AOT plugin, target with its small-Q verify profile); the drafter engines eagerly and through the CUDA-graph
   path against the reference drafter (``export.validate``'s checks; TensorRT's tolerance, ``TRT_TOLERANCE``);
   the target engine (prefill, verify, rollback, verify) against transformers, both paths; generation with
   ``backend="tensorrt"`` (eager and graph) against the onnxruntime backend's tokens, with its time and the
   device memory the runtime reserves (each engine's one scratch buffer, the caching allocator).
6. **``pytest -m "tensorrt or gpu"``** from the checkout's ``tests/`` (skipped, with a row saying so, when the
   package runs without its tests; ``--skip-pytest``).

Writes ``DIR/gpu_check.json`` (device, versions, every check, the benchmark rows, the graph timings, the
TensorRT section, the device memory and the goals) and prints a table last. Exit status 0 when every check
passes (``SKIP`` rows do not fail it), 3 when one disagrees with the reference, 1 without a CUDA device
(one line) or on a setup error. The whole check stays under 8 minutes on one H200.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

from ..errors import DSparkTrtError

__all__ = ["main", "run_gpu_check", "qwen3_8b_drafter_config", "GRAPH_BUCKETS", "Checks", "tensorrt_checks",
           "pytest_command", "parse_pytest_summary", "pytest_check", "PYTEST_MARKERS", "assert_graphs_captured"]

QWEN3_8B = dict(vocab=151936, rank=256, steps=7)
GRAPH_BUCKETS = (1, 4, 8)
OUT_FILE = "gpu_check.json"


def qwen3_8b_drafter_config(num_layers: int = 5, topk: int = 512):
    """The DSpark drafter of Qwen3-8B (``dspark_qwen3_8b_block7``'s shapes, docs/dspark.md §2)."""
    from ..config import DSparkConfig

    return DSparkConfig(vocab_size=151936, draft_vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                        num_hidden_layers=num_layers, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                        rms_norm_eps=1e-6, rope_theta=1e6, block_size=7, mask_token_id=151669,
                        target_layer_ids=(1, 9, 17, 25, 33), num_target_layers=36, markov_rank=256,
                        draft_topk=topk)


class Checks:
    """Runs named checks; a failing or crashing check is recorded, never fatal."""

    def __init__(self):
        self.rows: list[dict] = []

    def run(self, name: str, fn) -> object:
        t0 = time.perf_counter()
        data = None
        try:
            result = fn()
            detail, data = (result if isinstance(result, tuple) else (result or "", None))
            status = "PASS"
        except AssertionError as e:
            status, detail = "FAIL", str(e).splitlines()[0][:200] if str(e) else "assertion failed"
        except Exception as e:  # a check that cannot run is a failure of the check, not a crash of the tool
            status, detail = "ERROR", f"{type(e).__name__}: {str(e).splitlines()[0][:180] if str(e) else ''}"
            traceback.print_exc()
        row = {"check": name, "status": status, "detail": detail, "seconds": round(time.perf_counter() - t0, 1)}
        if data is not None:
            row["data"] = data
        self.rows.append(row)
        print(f"{status:5} {name}: {detail}", flush=True)
        return data

    def skip(self, name: str, reason: str) -> None:
        """A check that cannot run here, said explicitly (``SKIP`` rows do not fail the report)."""
        self.rows.append({"check": name, "status": "SKIP", "detail": reason, "seconds": 0.0})
        print(f"SKIP  {name}: {reason}", flush=True)

    @property
    def passed(self) -> bool:
        return all(r["status"] in ("PASS", "SKIP") for r in self.rows)

    def table(self) -> str:
        w = max(len(r["check"]) for r in self.rows)
        lines = [f"{'check'.ljust(w)}  status  detail", "-" * (w + 40)]
        lines += [f"{r['check'].ljust(w)}  {r['status']:6}  {r['detail']} [{r['seconds']}s]" for r in self.rows]
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- 1–2 kernel
def _outputs(B: int, N: int, k: int, device: str = "cuda"):
    return (torch.full((B, N), -1, dtype=torch.int32, device=device),
            torch.full((B, N, k), float("nan"), device=device), torch.full((B, N), float("nan"), device=device))


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _jit_case(case) -> str:
    from ..plugins.contract import reference_op
    from ..plugins.kernel import topk_markov_walk
    from ..plugins.walk_compare import compare_walks, make_walk_inputs

    inputs = make_walk_inputs(case, "cuda")
    out = _outputs(*inputs[0].shape)
    topk_markov_walk(*inputs, logit_scale=case.logit_scale, out=out)
    torch.cuda.synchronize()
    want = reference_op(*(t.cpu() for t in inputs), logit_scale=case.logit_scale)
    report = compare_walks(out, want, inputs, atol=2e-5, rtol=1e-5)
    return f"{report['steps']} steps, {report['near_ties']} near-ties"


def _union_outputs(B: int, N: int, k: int, M: int, device: str = "cuda"):
    return (*_outputs(B, N, k + M, device), torch.full((B, N, M), -1, dtype=torch.int32, device=device))


def _jit_union_case(case, M: int, device: str = "cuda") -> str:
    """The union kernel against ``reference_union_op`` (``device`` cpu: Triton's interpreter, for the tests)."""
    from ..plugins.contract import reference_union_op
    from ..plugins.union_kernel import union_markov_walk
    from ..plugins.walk_compare import compare_union_walks, make_union_inputs

    inputs = make_union_inputs(case, M, device)
    out = _union_outputs(*inputs[0].shape, M, device)
    union_markov_walk(*inputs, logit_scale=case.logit_scale, out=out)
    _sync(device)
    want = reference_union_op(*(t.cpu() for t in inputs), logit_scale=case.logit_scale)
    report = compare_union_walks(out, want, inputs, atol=2e-5, rtol=1e-5)
    assert report["duplicates"] > 0, "no masked duplicate reached the comparison"
    return f"{report['steps']} steps, {report['near_ties']} near-ties, {report['duplicates']} masked duplicates"


def _aot_case(ptx: str, entry: dict, kernel_name: str, case, markov_topm: int = 0) -> str:
    from ..plugins.aot import extra_arg_values
    from ..plugins.contract import INPUTS, UNION_INPUTS, reference_op, reference_union_op
    from ..plugins.ptx_launch import PtxModule, aot_kernel_params
    from ..plugins.walk_compare import compare_union_walks, compare_walks, make_union_inputs, make_walk_inputs

    union = markov_topm > 0
    inputs = make_union_inputs(case, markov_topm, "cuda") if union else make_walk_inputs(case, "cuda")
    B = inputs[0].shape[0]
    outs = _union_outputs(*inputs[0].shape, markov_topm) if union else _outputs(*inputs[0].shape)
    shapes = {c.name: tuple(t.shape) for c, t in zip(UNION_INPUTS if union else INPUTS, inputs)}
    params = aot_kernel_params([t.data_ptr() for t in inputs], extra_arg_values(shapes), [t.data_ptr() for t in outs],
                               entry["trailing_params"])
    launch = entry["launch"]
    stream = torch.cuda.current_stream()
    with PtxModule(ptx, kernel_name) as module:
        module.launch((B, 1, 1), tuple(launch["block"]), launch["shared_mem"], stream.cuda_stream, params)
        stream.synchronize()
    if union:
        want = reference_union_op(*(t.cpu() for t in inputs), logit_scale=case.logit_scale)
        report = compare_union_walks(outs, want, inputs, atol=2e-5, rtol=1e-5)
    else:
        want = reference_op(*(t.cpu() for t in inputs), logit_scale=case.logit_scale)
        report = compare_walks(outs, want, inputs, atol=2e-5, rtol=1e-5)
    return f"ISA {entry['ptx_isa']} {entry.get('arch', '')}: {report['steps']} steps, {report['near_ties']} near-ties"


def _dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


UNION_M = 32  # the union width the GPU check builds and times (k = 512)


def _union_timing(batches=(1, 8, 64), k: int = 512, M: int = UNION_M, *, shapes: dict = QWEN3_8B,
                  device: str = "cuda", repeats: int = 50) -> tuple[str, dict]:
    """The union kernel's time against the plain kernel's on the same requests (Qwen3-8B shapes, bf16)."""
    from ..plugins.kernel import topk_markov_walk
    from ..plugins.union_kernel import union_markov_walk
    from ..plugins.walk_compare import WalkCase, make_union_inputs

    rows = []
    for B in batches:
        case = WalkCase(batch=B, topk=k, logits_dtype=torch.bfloat16, weights_dtype=torch.bfloat16, mode="mixed",
                        seed=B, **shapes)
        inputs = make_union_inputs(case, M, device)
        plain_out, union_out = _outputs(B, case.steps, k, device), _union_outputs(B, case.steps, k, M, device)
        plain_ms = _median_ms(lambda: topk_markov_walk(*inputs[:11], logit_scale=1.0, out=plain_out), repeats,
                              device=device)
        union_ms = _median_ms(lambda: union_markov_walk(*inputs, logit_scale=1.0, out=union_out), repeats,
                              device=device)
        rows.append({"batch": B, "topk": k, "markov_topm": M, "plain_ms": round(plain_ms, 4),
                     "union_ms": round(union_ms, 4), "union_vs_plain": round(union_ms / plain_ms, 3)})
    detail = "; ".join(f"B={r['batch']}: {r['union_ms']:.3f} ms = {r['union_vs_plain']}x plain" for r in rows)
    return detail, {"rows": rows}


def _kernel_checks(checks: Checks, arch: int, quick: bool, ptx_dir: str | None) -> dict | None:
    from ..plugins.aot import DESCRIPTION_FILE, WalkKernelSpec, compile_walk_kernel, plugin_arch, ptx_param_count
    from ..plugins.aot import ptx_runs_on
    from ..plugins.walk_compare import WalkCase

    bf16, fp32 = torch.bfloat16, torch.float32
    cases = [(64, 512, bf16, "mixed", None), (1, 512, bf16, "greedy", None), (8, 3840, bf16, "mixed", None),
             (8, 512, fp32, "sampled", None), (8, 512, bf16, "mixed", 32000)]
    for B, k, dt, mode, vd in cases[:2] if quick else cases:
        case = WalkCase(batch=B, topk=k, logits_dtype=dt, weights_dtype=dt, mode=mode, draft_vocab=vd,
                        logit_scale=1.0, seed=B + k, **QWEN3_8B)
        checks.run(f"jit B={B} k={k} {str(dt)[6:]} {mode}" + (f" V_d={vd}" if vd else ""), lambda c=case: _jit_case(c))

    union_cases = [(64, 512, bf16, "mixed"), (8, 512, fp32, "sampled"), (1, 512, bf16, "greedy")]
    for B, k, dt, mode in union_cases[:2] if quick else union_cases:
        case = WalkCase(batch=B, topk=k, logits_dtype=dt, weights_dtype=dt, mode=mode, logit_scale=1.0, seed=B + k + 1,
                        **QWEN3_8B)
        checks.run(f"jit union B={B} k={k} M={UNION_M} {str(dt)[6:]} {mode}",
                   lambda c=case: _jit_union_case(c, UNION_M))

    def local_aot(dt: str, markov_topm: int = 0) -> str:
        spec = WalkKernelSpec(7, 512, 256, 1.0, dt, dt, plugin_arch("none", arch), markov_topm=markov_topm)
        ck = compile_walk_kernel(spec)  # ISA capped by this host's driver too
        entry = {"ptx_isa": ck.ptx_isa, "arch": spec.sm, "launch": ck.launch, "trailing_params": ck.trailing_params,
                 "params": ptx_param_count(ck.ptx, ck.name)}
        case = WalkCase(batch=8, topk=512, logits_dtype=_dtype(dt), weights_dtype=_dtype(dt), mode="mixed", seed=3,
                        **QWEN3_8B)
        return _aot_case(ck.ptx, entry, ck.name, case, markov_topm)

    from ..plugins.walk_compare import head_kernel_checks  # the gated / RNN kernels: JIT and AOT rows
    for name, fn in head_kernel_checks(quick, plugin_arch("none", arch)):
        checks.run(name, fn)
    checks.run("aot (built here) bf16 k=512", lambda: local_aot("bfloat16"))
    checks.run(f"aot union (built here) bf16 k=512 M={UNION_M}", lambda: local_aot("bfloat16", UNION_M))
    timing = checks.run(f"union vs plain kernel time k=512 M={UNION_M}", _union_timing)
    if not ptx_dir:
        return timing
    from ..plugins.aot import UNION_DESCRIPTION_FILE

    desc_path = Path(ptx_dir) / DESCRIPTION_FILE

    def missing():
        raise AssertionError(f"{desc_path} missing: build with python -m dspark_trt.plugins.aot --out {ptx_dir}")

    if not desc_path.is_file():
        checks.run(f"aot ({ptx_dir})", missing)
    for path in (desc_path, Path(ptx_dir) / UNION_DESCRIPTION_FILE):  # the union's: when built (--markov-topm)
        if not path.is_file():
            continue
        desc = json.loads(path.read_text())
        c = desc["constexprs"]
        for entry in desc["kernels"]:
            if not ptx_runs_on(entry["arch"], arch):  # sm_90a: capability 9.0 only; sm_80: 8.0 and newer
                continue
            case = WalkCase(batch=8, steps=c["N"], topk=c["K"], rank=c["R"], vocab=QWEN3_8B["vocab"],
                            logits_dtype=_dtype(entry["logits_dtype"]), weights_dtype=_dtype(entry["weights_dtype"]),
                            logit_scale=c["LOGIT_SCALE"], mode="mixed", seed=5)
            ptx = (Path(ptx_dir) / entry["file"]).read_text()
            checks.run(f"aot (triton {desc['triton_version']}) {entry['file']}",
                       lambda ptx=ptx, entry=entry, case=case, desc=desc: _aot_case(
                           ptx, entry, desc["kernel_name"], case, desc.get("markov_topm", 0)))
    return timing


# ---------------------------------------------------------------------------------------------- 3 bench
def _bench(quick: bool) -> tuple[str, dict]:
    from ..bench.markov import MarkovBenchConfig, format_table, run_markov_bench

    cfg = MarkovBenchConfig(device="cuda", repeats=20, warmup=3,
                            topks=(64, 512, 3840) if quick else (64, 128, 256, 512, 1024, 2048, 3840))
    rows = run_markov_bench(cfg)
    print(format_table(rows), flush=True)
    k512 = {r["batch"]: r for r in rows if r["topk"] == 512 and "kernel_ms" in r}
    detail = "; ".join(f"B={b}: {r['kernel_speedup']}x cuBLAS dense, {r.get('kernel_vs_floor')}x its floor"
                       for b, r in sorted(k512.items()))
    return detail, {"rows": rows}


# ---------------------------------------------------------------------------------------------- 4 graphs
def _drafter(num_layers: int, seed: int = 0):
    """A Qwen3-8B-shaped DSpark drafter with random bf16 weights, built on the GPU (nothing downloaded)."""
    from ..reference.drafter import DSparkDrafter

    torch.manual_seed(seed)
    with torch.device("cuda"):
        drafter = DSparkDrafter(qwen3_8b_drafter_config(num_layers)).to(torch.bfloat16).eval()
    with torch.no_grad():  # logits with a realistic spread (default init gives near-uniform ones)
        drafter.lm_head.weight.mul_(8.0)
    return drafter


def _round_inputs(drafter, B: int, T: int, seed: int):
    c = drafter.config
    g = torch.Generator(device="cuda").manual_seed(seed)
    kv = (c.num_hidden_layers, B, T, c.num_key_value_heads, c.head_dim)
    ctx_k = torch.randn(kv, generator=g, device="cuda").to(torch.bfloat16)
    ctx_v = torch.randn(kv, generator=g, device="cuda").to(torch.bfloat16)
    ctx_len = torch.randint(T // 2, T + 1, (B,), generator=g, device="cuda")
    ctx_len[0] = T
    anchor = torch.randint(0, c.vocab_size, (B,), generator=g, device="cuda")
    temperature = torch.where(torch.arange(B, device="cuda") % 2 == 0, 0.0, 0.8)  # greedy and sampled rows
    seeds = torch.randint(0, 2**40, (B,), generator=g, device="cuda")
    return anchor, ctx_k, ctx_v, ctx_len, temperature, seeds


def _median_ms(fn, repeats: int = 20, warmup: int = 3, device: str = "cuda") -> float:
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def assert_graphs_captured(what: str, runners, need=None) -> str:
    """A graph mode claimed is a graph mode proven. ``runners``: {name: GraphRunner}. Fails (AssertionError: a
    FAIL row) when a runner is not in graph mode, when any capture fell back to eager (``GraphRunner.fallbacks``:
    elsewhere a warning), or when a group of ``need`` (tuples of names; default: each runner alone) captured no
    graph at all. Returns the captures per runner."""
    for name, runner in runners.items():
        why = runner.why_not_captured()
        if runner.mode != "graph" or runner.fallbacks:
            raise AssertionError(f"{what}: {name}: {why}")
    for group in need if need is not None else [(name,) for name in runners]:
        assert sum(runners[name].captures for name in group), (
            f"{what}: {' / '.join(group)}: no graph captured (no round ran through the graph runner)")
    return ", ".join(f"{name} {runner.captures} captured" for name, runner in runners.items())


def _graph_checks(checks: Checks, num_layers: int, context: int, topk: int) -> list[dict]:
    from ..runtime.drafters.torch import TorchDrafterBackend

    drafter = _drafter(num_layers)
    graphed = TorchDrafterBackend(drafter, graphs="graph")
    padded_eager = TorchDrafterBackend(drafter, graphs="eager")
    plain = TorchDrafterBackend(drafter, graphs="off")
    timings: list[dict] = []

    def same_tokens(B: int) -> str:
        rounds = 0
        for seed in range(3):  # every replay with new inputs and new noise keys
            x = _round_inputs(drafter, B, context - 17 * seed, seed)
            kw = dict(topk=topk, temperature=x[4], seed=x[5])
            want = padded_eager.draft(*x[:4], **kw)
            got = graphed.draft(*x[:4], **kw)
            assert torch.equal(got.tokens, want.tokens), f"B={B} round {seed}: replay drafted other tokens"
            rounds += 1
        entries = [e for e in graphed._runner.entries.values() if e.key.batch == B]
        assert entries and all(e.graph is not None for e in entries), \
            f"B={B}: no graph captured ({entries[0].eager_reason if entries else 'no entry'})"
        assert_graphs_captured(f"B={B}", {"draft (copied)": graphed._runner})
        return f"{rounds} rounds equal, buckets {sorted({(e.key.batch, e.key.context) for e in entries})}"

    def timing(B: int) -> tuple[str, dict]:
        x = _round_inputs(drafter, B, context, 99)
        kw = dict(topk=topk, temperature=x[4], seed=x[5])
        eager_ms = _median_ms(lambda: plain.draft(*x[:4], **kw))
        graph_ms = _median_ms(lambda: graphed.draft(*x[:4], **kw))
        row = {"kind": "eager_vs_graph", "batch": B, "context": context, "topk": topk, "layers": num_layers,
               "eager_ms": round(eager_ms, 3),
               "graph_ms": round(graph_ms, 3), "speedup": round(eager_ms / graph_ms, 2)}
        timings.append(row)
        return f"eager {eager_ms:.3f} ms, graph {graph_ms:.3f} ms = {eager_ms / graph_ms:.2f}x", row

    def bound_state(B: int, T: int, seed: int):
        """Round inputs, and a DrafterState of the batch bucket's rows holding the same context (what the
        decoder hands a padded backend: its buffers are bound to the graph, not copied)."""
        from ..runtime.drafter_state import DrafterState

        x = _round_inputs(drafter, B, T, seed)
        c = drafter.config
        state = DrafterState(c.num_hidden_layers, B, T, c.num_key_value_heads, c.head_dim, dtype=x[1].dtype,
                             device=x[1].device, rows=graphed.state_rows(B))
        state.append(x[1], x[2], x[3])
        return x, state

    def bound_tokens(B: int) -> str:
        for seed in range(3):
            x, state = bound_state(B, context - 17 * seed, seed)
            kw = dict(topk=topk, temperature=x[4], seed=x[5])
            want = padded_eager.draft(x[0], *state.context(), state.ctx_len, **kw)
            got = graphed.draft(x[0], *state.context(), state.ctx_len, **kw)
            assert torch.equal(got.tokens, want.tokens), f"B={B} round {seed}: the bound replay drafted other tokens"
        entries = list(graphed._bound_runner.entries.values())
        assert entries and all(e.graph is not None for e in entries), \
            f"B={B}: no bound graph captured ({entries[0].eager_reason if entries else 'no entry'})"
        # every capture since the first round, those of dropped (stale) entries included
        assert_graphs_captured(f"B={B}", {"draft (bound)": graphed._bound_runner})
        return f"3 rounds equal, bound bucket {sorted({(e.key.batch, e.key.context) for e in entries})}"

    def copied_vs_bound(B: int) -> tuple[str, dict]:
        x, state = bound_state(B, context, 99)
        kw = dict(topk=topk, temperature=x[4], seed=x[5])
        bound = (x[0], *state.context(), state.ctx_len)
        copied_ms, bound_ms = [], []
        for _ in range(5):  # interleaved: the copying bucket and the bound cache take turns
            copied_ms.append(_median_ms(lambda: graphed.draft(*x[:4], **kw), repeats=5, warmup=1))
            bound_ms.append(_median_ms(lambda: graphed.draft(*bound, **kw), repeats=5, warmup=1))
        c, b = statistics.median(copied_ms), statistics.median(bound_ms)
        row = {"kind": "copied_vs_bound", "batch": B, "context": context, "copied_ms": round(c, 3),
               "bound_ms": round(b, 3),
               "bound_over_copied": round(b / c, 3)}
        timings.append(row)
        return f"context copied {c:.3f} ms, bound {b:.3f} ms = {b / c:.2f}x", row

    for B in GRAPH_BUCKETS:
        checks.run(f"graph replay == eager B={B}", lambda B=B: same_tokens(B))
    for B in GRAPH_BUCKETS:
        checks.run(f"draft round eager vs graph B={B}", lambda B=B: timing(B))
    for B in GRAPH_BUCKETS:
        checks.run(f"bound DrafterState replay == eager B={B}", lambda B=B: bound_tokens(B))
    for B in GRAPH_BUCKETS:
        checks.run(f"draft round context copied vs bound B={B}", lambda B=B: copied_vs_bound(B))
    return timings


# ---------------------------------------------------------------------------------------------- 5 TensorRT
#: TensorRT vs the references: TensorRT may run fp32 GEMMs as TF32 (10-bit mantissa, as fp16), so the fp16
#: rules apply (tolerances, and a token may differ only at a near-tie)
TRT_TOLERANCE = "fp16"


def tensorrt_checks(checks: Checks, out: Path) -> dict:
    """The TensorRT steps (module docstring, 5); without full TensorRT one ``SKIP`` row and nothing else."""
    from ..runtime.tensorrt_engine import tensorrt_available

    why = tensorrt_available()
    if why is not None:
        checks.skip("tensorrt", f"TensorRT not importable: {why}")
        return {"available": False, "reason": why}
    import tensorrt

    section: dict = {"available": True, "version": tensorrt.__version__}
    export = checks.run("tensorrt export (tiny pair: context, draft + AOT plugin, target)",
                        lambda: _tensorrt_export(out / "tensorrt-export"))
    if export is None:
        return section
    section["export"] = export
    for mode in ("eager", "graph"):
        checks.run(f"tensorrt drafter {mode} vs reference", lambda m=mode: _tensorrt_drafter(export, m))
        checks.run(f"tensorrt target {mode} vs transformers", lambda m=mode: _tensorrt_target(export, m))
    section["generate"] = checks.run("tensorrt generate eager/graph == onnxruntime tokens",
                                     lambda: _tensorrt_generate(export))
    return section


def _tensorrt_export(out: Path) -> tuple[str, dict]:
    from ..export.pipeline import ExportOptions, export_model
    from ..synthetic import write_tiny_checkpoint

    pair = write_tiny_checkpoint(out / "pair", seed=0, force=True)
    t0 = time.perf_counter()
    result = export_model(pair.drafter, out / "export", ExportOptions(topk=16, dtype="fp32", engine="tensorrt",
                                                                      max_context=512, validate=False),
                          target_dir=pair.target, force=True)
    seconds = round(time.perf_counter() - t0, 1)
    engines = result.manifest["engines"]
    assert set(engines) == {"context.tensorrt", "draft.tensorrt", "target.tensorrt"}, f"engines: {sorted(engines)}"
    kernels = engines["draft.tensorrt"].get("plugin_kernels") or []
    assert kernels, "the draft engine records no embedded plugin kernel"
    profiles = len(engines["target.tensorrt"].get("profiles", [None]))
    detail = (f"3 engines in {seconds}s; draft embeds {kernels[0]['file']} (ISA {kernels[0]['ptx_isa']}); target "
              f"{profiles} profiles")
    return detail, {"dir": str(out / "export"), "drafter": str(pair.drafter), "target": str(pair.target),
                    "seconds": seconds, "bytes": {k: v["bytes"] for k, v in engines.items()},
                    "target_profiles": profiles}


class _OnCpu:
    """A graph whose outputs come back to the CPU, where the reference's are (``export.validate`` compares)."""

    def __init__(self, graph):
        self.graph = graph

    def run(self, feeds):
        return {k: v.cpu() for k, v in self.graph.run(feeds).items()}


def _tensorrt_drafter(export: dict, mode: str) -> tuple[str, dict]:
    from ..export.validate import validate_onnx
    from ..loader import load_drafter
    from ..runtime.drafters.tensorrt import TensorRTDrafterBackend

    backend = TensorRTDrafterBackend(export["dir"], graphs=mode)
    drafter = load_drafter(export["drafter"], target_dir=export["target"])
    report = validate_onnx(_OnCpu(backend._graphs["context"]), _OnCpu(backend._graphs["draft"]), drafter, topk=16,
                           dtype=TRT_TOLERANCE, raise_on_failure=False)
    bad = [c for c in report.checks if not c.ok]
    assert not bad, f"{len(bad)} of {len(report.checks)} checks: {bad[0].name}: {bad[0].detail}"
    runner = backend._graphs["draft"].runner
    if mode == "graph":  # the copied-context draft graph validate ran: captured, no bucket fell back to eager
        assert_graphs_captured("draft", {"draft (copied)": runner})
    memory = backend.reserved_device_memory()
    backend.deactivate()
    return f"{len(report.checks)} checks ok, {runner.captures} graphs captured", {"reserved": memory}


def _tensorrt_target(export: dict, mode: str) -> tuple[str, dict]:
    """Prefill (exact shapes), verify (a padded bucket: graph or eager), a rollback, verify again."""
    from ..export.target_onnx import load_target_model
    from ..export.validate import _close
    from ..export.validate_target import TARGET_TOLERANCES
    from ..runtime.targets.hf import HFTarget
    from ..runtime.targets.tensorrt import TensorRTTarget

    got = TensorRTTarget(export["dir"], graphs=mode)
    ref = HFTarget(load_target_model(export["target"], torch.float32))
    ref.set_taps(got.layer_ids)
    got.set_taps(got.layer_ids)
    tol = TARGET_TOLERANCES[TRT_TOLERANCE]
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, got.vocab_size, (n,), generator=gen) for n in (7, 3)]
    r, g = ref.prefill(prompts), got.prefill(prompts)
    checks = [_close("prefill logits", g.logits.cpu(), r.logits.float(), tol)]
    for step, (Q, keep) in enumerate(((4, (3, 1)), (3, (3, 3)))):
        tokens = torch.randint(0, got.vocab_size, (2, Q), generator=gen)
        r, g = ref.verify(tokens), got.verify(tokens)
        checks += [_close(f"verify {step + 1} logits", g.logits.cpu(), r.logits.float(), tol),
                   _close(f"verify {step + 1} taps", g.taps.cpu().float(), r.taps.float(), tol)]
        ref.commit(torch.tensor(keep))
        got.commit(torch.tensor(keep))
    bad = [c for c in checks if not c.ok]
    assert not bad, f"{bad[0].name}: {bad[0].detail}"
    assert got.lengths.tolist() == ref.lengths.tolist(), f"lengths {got.lengths.tolist()} vs {ref.lengths.tolist()}"
    captured = ""
    if mode == "graph":  # the verify rounds replayed captured graphs; none fell back to eager
        runners = _target_runners(got)
        captured = "; " + assert_graphs_captured("target", runners, need=[tuple(runners)])
    memory = got.reserved_device_memory()
    got.deactivate()
    return f"{len(checks)} comparisons ok ({tol.atol}/{tol.rtol}){captured}", {"reserved": memory}


def _target_runners(target) -> dict:
    """The graph runners of a ``TensorRTTarget``'s bucketed graphs (per Q; prefill's exact-shape one left out)."""
    return {f"target Q={q}": g.runner for q, g in target._graphs.items() if g.bucketed}


def _drafter_runners(backend) -> dict:
    """The draft graph runners of a ``TensorRTDrafterBackend``: context copied into a bucket, and bound."""
    return {f"draft ({'bound' if name == 'draft_bound' else 'copied'})": g.runner for name, g in backend._graphs.items()
            if name in ("draft", "draft_bound")}


def _tensorrt_generate(export: dict) -> tuple[str, dict]:
    from ..runtime import SpeculativeDecoder
    from ..runtime.device_memory import describe_reserved, reserved_device_memory

    prompts = [[1, 2, 3, 4], [5, 6], [7, 8, 9]]
    want = SpeculativeDecoder.from_export(export["dir"], backend="onnxruntime").generate(
        prompts, max_new_tokens=24, topk=16).tokens
    rows = {}
    for mode in ("eager", "graph"):
        dec = SpeculativeDecoder.from_export(export["dir"], backend="tensorrt", graphs=mode)
        got = dec.generate(prompts, max_new_tokens=24, topk=16).tokens  # warm-up: contexts, captures
        assert got == want, f"{mode}: tokens differ from onnxruntime's: {got} vs {want}"
        ms = _median_ms(lambda: dec.generate(prompts, max_new_tokens=24, topk=16), repeats=3, warmup=0)
        if mode == "graph":  # drafter (copied or bound context) and target: captured, nothing fell back to eager
            draft, target = _drafter_runners(dec.backend), _target_runners(dec.target)
            captured = assert_graphs_captured("generate", {**draft, **target}, need=[tuple(draft), tuple(target)])
        rows[mode] = {"ms": round(ms, 2), "tokens_per_s": round(3 * 24 / ms * 1e3, 1),
                      "reserved": reserved_device_memory(dec)}
        if mode == "graph":
            print(f"      device memory reserved (graph): {describe_reserved(rows[mode]['reserved'])}", flush=True)
        dec.backend.deactivate()
        dec.target.deactivate()
    detail = (f"eager {rows['eager']['ms']:.1f} ms, graph {rows['graph']['ms']:.1f} ms per batch of 3 x 24 tokens "
              f"({captured}); scratch: " + ", ".join(f"{k} {v}" for k, v in rows["graph"]["reserved"].items()
                                                      if "scratch" in k))
    return detail, rows


# ---------------------------------------------------------------------------------------------- 6 pytest
PYTEST_MARKERS = "tensorrt or gpu"
#: the tests pytest leaves out: this check itself (a whole ``gpu-check --quick``, TensorRT engine builds included,
#: repeated inside this run's budget; ``pytest -m gpu`` runs it, and its report assertions hold)
PYTEST_DESELECT = ("tests/tools/test_gpu_check.py::test_gpu_check_quick_passes",)
_SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)")


def pytest_command(paths, markers: str = PYTEST_MARKERS) -> list[str]:
    """``python -m pytest PATHS -m MARKERS``, self-contained: the project's addopts (xdist's ``--dist``) replaced,
    so a GPU host without pytest-xdist runs it too."""
    cmd = [sys.executable, "-m", "pytest", *map(str, paths), "-m", markers, "-q", "-p", "no:cacheprovider",
           "-o", "addopts=-ra --strict-markers"]
    for test in PYTEST_DESELECT:
        cmd += ["--deselect", test]
    return cmd


def parse_pytest_summary(output: str) -> dict[str, int]:
    """The counts of pytest's last summary line (``3 passed, 1 skipped in 2.0s`` → {"passed": 3, "skipped": 1})."""
    lines = [line for line in output.splitlines() if re.search(r"\b(passed|failed|skipped|error|deselected)", line)
             and " in " in line]
    counts: dict[str, int] = {}
    for n, what in _SUMMARY.findall(lines[-1] if lines else ""):
        counts["errors" if what.startswith("error") else what] = int(n)
    return counts


def pytest_check(root: Path | None = None, paths=None, timeout: float = 300) -> tuple[str, dict]:
    """Run ``pytest -m "tensorrt or gpu"`` in a child process from the checkout ``root``; fails on a failure,
    an error, or a non-zero exit other than "nothing collected"."""
    root = Path(root) if root is not None else Path(__file__).resolve().parents[2]
    paths = paths or [root / "tests"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(pytest_command(paths), cwd=root, capture_output=True, text=True, timeout=timeout, env=env)
    counts = parse_pytest_summary(proc.stdout)
    failing = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    detail = ", ".join(f"{n} {what}" for what, n in counts.items()) or "no summary"
    assert proc.returncode in (0, 5) and not counts.get("failed") and not counts.get("errors"), (
        f"pytest exit {proc.returncode}: {detail}; {failing[0] if failing else proc.stdout.strip()[-200:]}")
    return detail, {"returncode": proc.returncode, "counts": counts, "failing": failing}


# ---------------------------------------------------------------------------------------------- driver
def run_gpu_check(out: str | Path, *, ptx_dir: str | None = None, quick: bool = False, skip_bench: bool = False,
                  skip_graphs: bool = False, layers: int = 5, context: int = 1024, topk: int = 512,
                  skip_tensorrt: bool = False, skip_pytest: bool = False) -> int:
    if not torch.cuda.is_available():
        raise DSparkTrtError("no CUDA device is visible; dspark gpu-check runs on a GPU host")
    import triton

    from ..atomic import atomic_write_text
    from ..plugins.ptx_launch import driver_version

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cap = torch.cuda.get_device_capability()
    arch = cap[0] * 10 + cap[1]
    info = {"device": torch.cuda.get_device_name(), "capability": arch, "driver_cuda": driver_version(),
            "torch": torch.__version__, "triton": triton.__version__, "python": sys.version.split()[0]}
    print(" ".join(f"{k}={v}" for k, v in info.items()), flush=True)
    checks = Checks()
    union_timing = _kernel_checks(checks, arch, quick, ptx_dir)
    bench = None if skip_bench else checks.run("bench markov --device cuda (k=512)", lambda: _bench(quick))
    graphs = [] if skip_graphs else _graph_checks(checks, layers, context, topk)
    graph_reserved = torch.cuda.max_memory_reserved()  # the torch graphs' peak (bench and kernels included)
    trt = {"skipped": "--skip-tensorrt"} if skip_tensorrt else tensorrt_checks(checks, out)
    tests_dir = Path(__file__).resolve().parents[2] / "tests"
    if skip_pytest:
        checks.skip(f"pytest -m \"{PYTEST_MARKERS}\"", "--skip-pytest")
    elif not tests_dir.is_dir():
        checks.skip(f"pytest -m \"{PYTEST_MARKERS}\"", f"no tests/ beside the package ({tests_dir}): run gpu-check "
                    f"from a source checkout")
    else:
        checks.run(f"pytest -m \"{PYTEST_MARKERS}\"", pytest_check)
    generated = trt.get("generate") if isinstance(trt.get("generate"), dict) else None
    memory = {"torch_max_reserved": graph_reserved, "tensorrt": generated["graph"]["reserved"] if generated else None}
    rows512 = [r for r in (bench or {}).get("rows", []) if r["topk"] == 512 and "kernel_ms" in r]
    b1 = next((g for g in graphs if g["batch"] == 1 and g["kind"] == "eager_vs_graph"), None)
    goals = {
        "graph_vs_eager_b1 >= 3": None if b1 is None else b1["speedup"],
        "kernel_vs_cublas_dense_b<=8 >= 10": {r["batch"]: r["kernel_speedup"] for r in rows512 if r["batch"] <= 8},
        "kernel_vs_floor_b64 <= 1.5": next((r.get("kernel_vs_floor") for r in rows512 if r["batch"] == 64), None),
        f"union_vs_plain_k512_m{UNION_M} (recorded)": {r["batch"]: r["union_vs_plain"]
                                                      for r in (union_timing or {}).get("rows", [])},
        "draft_round_bound_over_copied_context (recorded)": {g["batch"]: g["bound_over_copied"] for g in graphs
                                                            if g["kind"] == "copied_vs_bound"},
    }
    report = {**info, "checks": checks.rows, "bench_markov": (bench or {}).get("rows"), "graphs": graphs,
              "union_timing": (union_timing or {}).get("rows"), "tensorrt": trt, "device_memory": memory,
              "goals": goals, "passed": checks.passed}
    atomic_write_text(out / OUT_FILE, json.dumps(report, indent=1) + "\n")
    from ..runtime.device_memory import describe_reserved, format_bytes

    print("\n" + checks.table())
    print(f"\ndevice memory: torch peak reserved {format_bytes(graph_reserved)}; TensorRT runtime: "
          f"{describe_reserved(memory['tensorrt']) if memory['tensorrt'] else 'not run'}")
    print(f"\ngoals: {json.dumps(goals)}\nwrote {out / OUT_FILE}")
    return 0 if checks.passed else 3


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="directory for gpu_check.json")
    p.add_argument("--ptx-dir", default=None, help="PTX built elsewhere by `python -m dspark_trt.plugins.aot`")
    p.add_argument("--quick", action="store_true", help="fewer kernel shapes and top-k values (about 2 minutes)")
    p.add_argument("--skip-bench", action="store_true", help="skip dspark bench markov")
    p.add_argument("--skip-graphs", action="store_true", help="skip the CUDA-graph checks and timings")
    p.add_argument("--layers", type=int, default=5, help="draft layers of the Qwen3-8B-shaped drafter (default 5)")
    p.add_argument("--context", type=int, default=1024, help="context length of the graph rounds (default 1024)")
    p.add_argument("--topk", type=int, default=512, help="top-k of the graph rounds (default 512)")
    p.add_argument("--skip-tensorrt", action="store_true", help="skip the TensorRT engine checks")
    p.add_argument("--skip-pytest", action="store_true", help=f"skip pytest -m \"{PYTEST_MARKERS}\"")


def run(args: argparse.Namespace) -> int:
    return run_gpu_check(args.out, ptx_dir=args.ptx_dir, quick=args.quick, skip_bench=args.skip_bench,
                         skip_graphs=args.skip_graphs, layers=args.layers, context=args.context, topk=args.topk,
                         skip_tensorrt=args.skip_tensorrt, skip_pytest=args.skip_pytest)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dspark_trt.tools.gpu_check", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    try:
        return run(p.parse_args(argv))
    except DSparkTrtError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
