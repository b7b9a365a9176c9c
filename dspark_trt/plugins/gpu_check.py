"""GPU check for the fused top-k Markov walk (one command, a few minutes on one H200; prints a table last).

    # on the CPU machine (Triton 3.9): the PTX a TensorRT engine would embed, ISA 9.0 for CUDA 13.0 drivers
    python -m dspark_trt.plugins.aot --out ptx --n 7 --k 512 --rank 256 --dtypes bf16,fp32 --validate
    # on the GPU host (its own torch/Triton; installs nothing), from the repository root
    PYTHONPATH=. python -m dspark_trt.plugins.gpu_check --ptx-dir ptx [--quick] [--bench-json bench.json]

1. **JIT kernel vs reference** at real shapes (V = 151936, r = 256, N = 7; k ∈ {512, 3840}; B ∈ {1, 8, 64};
   bf16 and fp32; greedy and mixed temperatures; a reduced-vocabulary case): the Triton kernel on CUDA
   against ``contract.reference_op`` on CPU, tie-robust (``testing.walk.compare_walks``).
2. **AOT PTX through the driver API**: PTX compiled here (this Triton, ISA capped at 9.0) and, with
   ``--ptx-dir``, the files built on the CPU machine — loaded with ``cuModuleLoadDataEx`` (the driver's JIT)
   and launched with ``cuLaunchKernel`` in TensorRT's AOT order (inputs, int32 extras, outputs: Triton's
   scratch pointers are stripped from the PTX), grid (B, 1, 1), block = warps × 32, the recorded shared
   memory; compared likewise.
3. **``dspark bench markov --device cuda``** (skipped with ``--skip-bench``).

Exit status 0 when every check passes, 3 when one disagrees with the reference, 1 on a setup error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch

from ..errors import DSparkTrtError

__all__ = ["main"]

QWEN3_8B = dict(vocab=151936, rank=256, steps=7)


class Checks:
    def __init__(self):
        self.rows: list[tuple[str, str, str]] = []

    def run(self, name: str, fn) -> None:
        t0 = time.perf_counter()
        try:
            detail = fn() or ""
            status = "PASS"
        except AssertionError as e:
            status, detail = "FAIL", str(e).splitlines()[0][:160]
        except Exception as e:  # a check that cannot run is a failure of the check, not a crash of the script
            status, detail = "ERROR", f"{type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''}"
            traceback.print_exc()
        self.rows.append((name, status, f"{detail} [{time.perf_counter() - t0:.1f}s]"))
        print(f"{status:5} {name}: {detail}", flush=True)

    def table(self) -> str:
        w = max(len(r[0]) for r in self.rows)
        lines = [f"{'check'.ljust(w)}  status  detail", "-" * (w + 40)]
        lines += [f"{n.ljust(w)}  {s:6}  {d}" for n, s, d in self.rows]
        return "\n".join(lines)


def _jit_case(case, tolerances) -> str:
    from ..testing.walk import compare_walks, make_walk_inputs
    from .contract import reference_op
    from .kernel import topk_markov_walk

    inputs = make_walk_inputs(case, "cuda")
    B, N, k = inputs[0].shape
    out = (torch.full((B, N), -1, dtype=torch.int32, device="cuda"), torch.full((B, N, k), float("nan"), device="cuda"),
           torch.full((B, N), float("nan"), device="cuda"))
    topk_markov_walk(*inputs, logit_scale=case.logit_scale, out=out)
    torch.cuda.synchronize()
    want = reference_op(*(t.cpu() for t in inputs), logit_scale=case.logit_scale)
    report = compare_walks(out, want, inputs, **tolerances)
    return f"{report['steps']} steps, {report['near_ties']} near-ties"


def _aot_case(ptx: str, entry: dict, kernel_name: str, case) -> str:
    from ..testing.walk import compare_walks, make_walk_inputs
    from .aot import extra_arg_values
    from .contract import INPUTS, reference_op
    from .ptx_launch import PtxModule, aot_kernel_params

    inputs = make_walk_inputs(case, "cuda")
    B, N, k = inputs[0].shape
    outs = (torch.full((B, N), -1, dtype=torch.int32, device="cuda"), torch.full((B, N, k), float("nan"), device="cuda"),
            torch.full((B, N), float("nan"), device="cuda"))
    shapes = {c.name: tuple(t.shape) for c, t in zip(INPUTS, inputs)}
    params = aot_kernel_params([t.data_ptr() for t in inputs], extra_arg_values(shapes), [t.data_ptr() for t in outs],
                               entry["trailing_params"])
    launch = entry["launch"]
    stream = torch.cuda.current_stream()
    with PtxModule(ptx, kernel_name) as module:
        module.launch((B, 1, 1), tuple(launch["block"]), launch["shared_mem"], stream.cuda_stream, params)
        stream.synchronize()
    want = reference_op(*(t.cpu() for t in inputs), logit_scale=case.logit_scale)
    report = compare_walks(outs, want, inputs, atol=2e-5, rtol=1e-5)
    return f"ISA {entry['ptx_isa']} {entry.get('arch', '')}: {report['steps']} steps, {report['near_ties']} near-ties"


def _dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dspark_trt.plugins.gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--ptx-dir", default=None, help="PTX built on the CPU machine by `python -m dspark_trt.plugins.aot`")
    p.add_argument("--quick", action="store_true", help="fewer shapes (about a minute)")
    p.add_argument("--skip-bench", action="store_true")
    p.add_argument("--bench-json", default=None, help="also write the benchmark rows here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: no CUDA device visible; this check runs on a GPU host", file=sys.stderr)
        return 1
    import triton

    from ..testing.walk import WalkCase
    from .ptx_launch import driver_version

    cap = torch.cuda.get_device_capability()
    arch = cap[0] * 10 + cap[1]
    print(f"device {torch.cuda.get_device_name()} (sm_{arch}), driver CUDA {driver_version()}, torch {torch.__version__}, "
          f"triton {triton.__version__}", flush=True)
    checks = Checks()
    tol = dict(atol=2e-5, rtol=1e-5)  # both sides upcast the same inputs exactly; summation order differs only
    bf16, fp32 = torch.bfloat16, torch.float32

    # 1. the JIT kernel on CUDA vs the reference on CPU
    cases = [(64, 512, bf16, "mixed", None), (1, 512, bf16, "greedy", None), (8, 3840, bf16, "mixed", None),
             (8, 512, fp32, "sampled", None), (8, 512, bf16, "mixed", 32000)]
    if args.quick:
        cases = cases[:2]
    for B, k, dt, mode, vd in cases:
        case = WalkCase(batch=B, topk=k, logits_dtype=dt, weights_dtype=dt, mode=mode, draft_vocab=vd,
                        logit_scale=1.0, seed=B + k, **QWEN3_8B)
        name = f"jit B={B} k={k} {str(dt)[6:]} {mode}" + (f" V_d={vd}" if vd else "")
        checks.run(name, lambda case=case: _jit_case(case, tol))

    # 2. AOT PTX through the driver, TensorRT's calling convention
    def local_aot(dt):
        from .aot import WalkKernelSpec, compile_walk_kernel, ptx_param_count

        spec = WalkKernelSpec(7, 512, 256, 1.0, dt, dt, arch if arch in (80, 86, 89, 90) else 80)
        ck = compile_walk_kernel(spec)
        entry = {"ptx_isa": ck.ptx_isa, "arch": spec.sm, "launch": ck.launch, "trailing_params": ck.trailing_params,
                 "params": ptx_param_count(ck.ptx, ck.name)}
        case = WalkCase(batch=8, topk=512, logits_dtype=_dtype(dt), weights_dtype=_dtype(dt), mode="mixed", seed=3,
                        **QWEN3_8B)
        return _aot_case(ck.ptx, entry, ck.name, case)

    checks.run("aot (built here) bf16 k=512", lambda: local_aot("bfloat16"))
    if args.ptx_dir:
        from .aot import DESCRIPTION_FILE

        desc_path = Path(args.ptx_dir) / DESCRIPTION_FILE
        if not desc_path.is_file():
            checks.run(f"aot ({args.ptx_dir})", lambda: (_ for _ in ()).throw(
                AssertionError(f"{desc_path} missing: build with python -m dspark_trt.plugins.aot --out {args.ptx_dir}")))
        else:
            desc = json.loads(desc_path.read_text())
            c = desc["constexprs"]
            for entry in desc["kernels"]:
                if entry["compute_capability"] > arch:
                    continue
                case = WalkCase(batch=8, steps=c["N"], topk=c["K"], rank=c["R"], vocab=QWEN3_8B["vocab"],
                                logits_dtype=_dtype(entry["logits_dtype"]), weights_dtype=_dtype(entry["weights_dtype"]),
                                logit_scale=c["LOGIT_SCALE"], mode="mixed", seed=5)
                ptx = (Path(args.ptx_dir) / entry["file"]).read_text()
                checks.run(f"aot (triton {desc['triton_version']}) {entry['file']}",
                           lambda ptx=ptx, entry=entry, case=case: _aot_case(ptx, entry, desc["kernel_name"], case))

    # 3. the benchmark
    if not args.skip_bench:
        from ..bench.markov import MarkovBenchConfig, format_table, run_markov_bench

        def bench():
            cfg = MarkovBenchConfig(device="cuda", repeats=20, warmup=3,
                                    topks=(64, 512, 3840) if args.quick else (64, 128, 256, 512, 1024, 2048, 3840, 4096))
            rows = run_markov_bench(cfg)
            print(format_table(rows), flush=True)
            if args.bench_json:
                Path(args.bench_json).write_text(json.dumps(rows, indent=1) + "\n")
            k512 = {r["batch"]: r for r in rows if r["topk"] == 512 and "kernel_ms" in r}
            return "; ".join(f"B={b}: kernel {r['kernel_ms']:.3f} ms = {r['kernel_speedup']}x dense, "
                             f"{r['kernel_ms'] / r['kernel_floor_ms']:.1f}x its floor" for b, r in sorted(k512.items()))

        checks.run("bench markov --device cuda (k=512)", bench)

    print("\n" + checks.table())
    return 0 if all(s == "PASS" for _, s, _ in checks.rows) else 3


if __name__ == "__main__":
    try:
        sys.exit(main())
    except DSparkTrtError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
