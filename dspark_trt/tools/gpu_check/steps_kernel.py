"""Steps 1–2 of gpu-check: the fused kernel (JIT) and its AOT PTX launched through the driver, against the
reference; the candidate-union kernel the same way, and its time against the plain kernel's."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .common import QWEN3_8B, UNION_M, median_ms, sync, torch_dtype, union_outputs, walk_outputs

__all__ = ["jit_step", "aot_step", "union_timing_step", "jit_case", "jit_union_case", "union_timing"]


def jit_case(case) -> str:
    from ...plugins.contract import reference_op
    from ...plugins.kernel import topk_markov_walk
    from ...plugins.walk_compare import compare_walks, make_walk_inputs

    inputs = make_walk_inputs(case, "cuda")
    out = walk_outputs(*inputs[0].shape)
    topk_markov_walk(*inputs, logit_scale=case.logit_scale, out=out)
    torch.cuda.synchronize()
    want = reference_op(*(t.cpu() for t in inputs), logit_scale=case.logit_scale)
    report = compare_walks(out, want, inputs, atol=2e-5, rtol=1e-5)
    return f"{report['steps']} steps, {report['near_ties']} near-ties"


def jit_union_case(case, M: int, device: str = "cuda") -> str:
    """The union kernel against ``reference_union_op`` (``device`` cpu: Triton's interpreter, for the tests)."""
    from ...plugins.contract import reference_union_op
    from ...plugins.union_kernel import union_markov_walk
    from ...plugins.walk_compare import compare_union_walks, make_union_inputs

    inputs = make_union_inputs(case, M, device)
    out = union_outputs(*inputs[0].shape, M, device)
    union_markov_walk(*inputs, logit_scale=case.logit_scale, out=out)
    sync(device)
    want = reference_union_op(*(t.cpu() for t in inputs), logit_scale=case.logit_scale)
    report = compare_union_walks(out, want, inputs, atol=2e-5, rtol=1e-5)
    assert report["duplicates"] > 0, "no masked duplicate reached the comparison"
    return f"{report['steps']} steps, {report['near_ties']} near-ties, {report['duplicates']} masked duplicates"


def _aot_case(ptx: str, entry: dict, kernel_name: str, case, markov_topm: int = 0) -> str:
    from ...plugins.aot import extra_arg_values
    from ...plugins.contract import INPUTS, UNION_INPUTS, reference_op, reference_union_op
    from ...plugins.ptx_launch import PtxModule, aot_kernel_params
    from ...plugins.walk_compare import compare_union_walks, compare_walks, make_union_inputs, make_walk_inputs

    union = markov_topm > 0
    inputs = make_union_inputs(case, markov_topm, "cuda") if union else make_walk_inputs(case, "cuda")
    B = inputs[0].shape[0]
    outs = union_outputs(*inputs[0].shape, markov_topm) if union else walk_outputs(*inputs[0].shape)
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


def union_timing(batches=(1, 8, 64), k: int = 512, M: int = UNION_M, *, shapes: dict = QWEN3_8B,
                 device: str = "cuda", repeats: int = 50) -> tuple[str, dict]:
    """The union kernel's time against the plain kernel's on the same requests (Qwen3-8B shapes, bf16)."""
    from ...plugins.kernel import topk_markov_walk
    from ...plugins.union_kernel import union_markov_walk
    from ...plugins.walk_compare import WalkCase, make_union_inputs

    rows = []
    for B in batches:
        case = WalkCase(batch=B, topk=k, logits_dtype=torch.bfloat16, weights_dtype=torch.bfloat16, mode="mixed",
                        seed=B, **shapes)
        inputs = make_union_inputs(case, M, device)
        plain_out, union_out = walk_outputs(B, case.steps, k, device), union_outputs(B, case.steps, k, M, device)
        plain_ms = median_ms(lambda: topk_markov_walk(*inputs[:11], logit_scale=1.0, out=plain_out), repeats,
                             device=device)
        union_ms = median_ms(lambda: union_markov_walk(*inputs, logit_scale=1.0, out=union_out), repeats,
                             device=device)
        rows.append({"batch": B, "topk": k, "markov_topm": M, "plain_ms": round(plain_ms, 4),
                     "union_ms": round(union_ms, 4), "union_vs_plain": round(union_ms / plain_ms, 3)})
    detail = "; ".join(f"B={r['batch']}: {r['union_ms']:.3f} ms = {r['union_vs_plain']}x plain" for r in rows)
    return detail, {"rows": rows}


def jit_step(run) -> None:
    """JIT kernel and union kernel vs the references (``--quick``: the first two shapes of each)."""
    from ...plugins.walk_compare import WalkCase

    checks, quick = run.checks, run.options.quick
    bf16, fp32 = torch.bfloat16, torch.float32
    cases = [(64, 512, bf16, "mixed", None), (1, 512, bf16, "greedy", None), (8, 3840, bf16, "mixed", None),
             (8, 512, fp32, "sampled", None), (8, 512, bf16, "mixed", 32000)]
    for B, k, dt, mode, vd in cases[:2] if quick else cases:
        case = WalkCase(batch=B, topk=k, logits_dtype=dt, weights_dtype=dt, mode=mode, draft_vocab=vd,
                        logit_scale=1.0, seed=B + k, **QWEN3_8B)
        checks.run(f"jit B={B} k={k} {str(dt)[6:]} {mode}" + (f" V_d={vd}" if vd else ""), lambda c=case: jit_case(c))
    union_cases = [(64, 512, bf16, "mixed"), (8, 512, fp32, "sampled"), (1, 512, bf16, "greedy")]
    for B, k, dt, mode in union_cases[:2] if quick else union_cases:
        case = WalkCase(batch=B, topk=k, logits_dtype=dt, weights_dtype=dt, mode=mode, logit_scale=1.0, seed=B + k + 1,
                        **QWEN3_8B)
        checks.run(f"jit union B={B} k={k} M={UNION_M} {str(dt)[6:]} {mode}",
                   lambda c=case: jit_union_case(c, UNION_M))


def aot_step(run) -> None:
    """PTX compiled here (ISA capped by this driver), plain and union, and the ``--ptx-dir`` files that load on
    this GPU, launched through the driver API in TensorRT's AOT order."""
    from ...plugins.aot import (DESCRIPTION_FILE, UNION_DESCRIPTION_FILE, WalkKernelSpec, compile_walk_kernel,
                                plugin_arch, ptx_param_count, ptx_runs_on)
    from ...plugins.walk_compare import WalkCase

    checks, arch, ptx_dir = run.checks, run.info["capability"], run.options.ptx_dir

    def local_aot(dt: str, markov_topm: int = 0) -> str:
        spec = WalkKernelSpec(7, 512, 256, 1.0, dt, dt, plugin_arch("none", arch), markov_topm=markov_topm)
        ck = compile_walk_kernel(spec)  # ISA capped by this host's driver too
        entry = {"ptx_isa": ck.ptx_isa, "arch": spec.sm, "launch": ck.launch, "trailing_params": ck.trailing_params,
                 "params": ptx_param_count(ck.ptx, ck.name)}
        case = WalkCase(batch=8, topk=512, logits_dtype=torch_dtype(dt), weights_dtype=torch_dtype(dt), mode="mixed",
                        seed=3, **QWEN3_8B)
        return _aot_case(ck.ptx, entry, ck.name, case, markov_topm)

    from ...plugins.walk_compare import head_kernel_checks  # the gated / RNN kernels: JIT and AOT rows

    for name, fn in head_kernel_checks(run.options.quick, plugin_arch("none", arch)):
        checks.run(name, fn)
    checks.run("aot (built here) bf16 k=512", lambda: local_aot("bfloat16"))
    checks.run(f"aot union (built here) bf16 k=512 M={UNION_M}", lambda: local_aot("bfloat16", UNION_M))
    if not ptx_dir:
        return
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
                            logits_dtype=torch_dtype(entry["logits_dtype"]),
                            weights_dtype=torch_dtype(entry["weights_dtype"]),
                            logit_scale=c["LOGIT_SCALE"], mode="mixed", seed=5)
            ptx = (Path(ptx_dir) / entry["file"]).read_text()
            checks.run(f"aot (triton {desc['triton_version']}) {entry['file']}",
                       lambda ptx=ptx, entry=entry, case=case, desc=desc: _aot_case(
                           ptx, entry, desc["kernel_name"], case, desc.get("markov_topm", 0)))


def union_timing_step(run) -> None:
    timing = run.checks.run(f"union vs plain kernel time k=512 M={UNION_M}", union_timing)
    run.results["union_timing"] = (timing or {}).get("rows")
