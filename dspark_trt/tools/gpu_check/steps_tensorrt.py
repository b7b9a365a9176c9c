"""Step 5 of gpu-check: TensorRT. Whether it imports (``--require-tensorrt``: a FAIL row with the import error
where it does not), the tiny pair exported with engines through the ONNX parser (fp32 with TF32 cleared, and
bf16), the drafter engines (eager and graph) against the reference drafter, the target engine against
transformers, and generation with ``backend="tensorrt"`` against the onnxruntime backend's tokens.

Tolerances (``engine_tolerance``): an fp32 export whose engines were built without TF32 (``build.tf32`` false,
``export/engine_build.py``) is held to the fp32 rules — exact tokens; an fp32 engine built with TF32 (an older
export) to the fp16 rules (a token may differ only at a near-tie); bf16 to the bf16 rules.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from .common import assert_graphs_captured, median_ms

__all__ = ["engine_tolerance", "tensorrt_requirement", "export_step", "validate_step", "generate_step",
           "target_runners", "drafter_runners", "GENERATE_PROMPTS"]

GENERATE_PROMPTS = [[1, 2, 3, 4], [5, 6], [7, 8, 9]]


def engine_tolerance(dtype: str, build: dict | None) -> str:
    """The validation rules for engines of an export of ``dtype`` built with ``build`` (the manifest's
    ``engines[...]["build"]``): "fp32" only when TF32 was cleared (TensorRT's default runs fp32 GEMMs as TF32,
    a 10-bit mantissa like fp16's: then the fp16 rules, near-ties allowed)."""
    if dtype == "fp32":
        return "fp32" if (build or {}).get("tf32") is False else "fp16"
    return dtype


def tensorrt_requirement(checks, *, required: bool, skip: str | None = None) -> str | None:
    """The first TensorRT row: None when full TensorRT imports (and a GPU is visible), else why not — a FAIL row
    with the import error when ``required`` (``--require-tensorrt``, the default on a GPU host), a SKIP row
    otherwise. ``skip``: the reason the TensorRT steps are skipped (``--skip-tensorrt``)."""
    from ...runtime.tensorrt_engine import tensorrt_available

    name = "tensorrt importable"
    if skip:
        checks.skip(name, skip)
        return skip
    why = tensorrt_available()
    if why is None:
        import tensorrt

        checks.run(name, lambda: f"TensorRT {tensorrt.__version__}")
        return None
    if required:
        checks.fail(name, f"TensorRT not importable: {why} (--require-tensorrt; --no-require-tensorrt to skip "
                          f"the TensorRT steps)")
    else:
        checks.skip(name, f"TensorRT not importable: {why}")
    return why


def _export(out: Path, dtype: str) -> tuple[str, dict]:
    from ...export.pipeline import ExportOptions, export_model
    from ...synthetic import write_tiny_checkpoint

    pair = write_tiny_checkpoint(out / "pair", seed=0, force=True)
    t0 = time.perf_counter()
    result = export_model(pair.drafter, out / "export", ExportOptions(topk=16, dtype=dtype, engine="tensorrt",
                                                                      max_context=512, validate=False),
                          target_dir=pair.target, force=True)
    seconds = round(time.perf_counter() - t0, 1)
    engines = result.manifest["engines"]
    assert set(engines) == {"context.tensorrt", "draft.tensorrt", "target.tensorrt"}, f"engines: {sorted(engines)}"
    kernels = engines["draft.tensorrt"].get("plugin_kernels") or []
    assert kernels, "the draft engine records no embedded plugin kernel"
    builds = {name: e.get("build") or {} for name, e in engines.items()}
    if dtype == "fp32":
        tf32 = [name for name, b in builds.items() if b.get("tf32") is not False]
        assert not tf32, f"fp32 engines built with TF32 allowed: {tf32}"
    profiles = len(engines["target.tensorrt"].get("profiles", [None]))
    tolerance = engine_tolerance(dtype, builds["draft.tensorrt"])
    detail = (f"{dtype}: 3 engines in {seconds}s; draft embeds {kernels[0]['file']} (ISA {kernels[0]['ptx_isa']}); "
              f"target {profiles} profiles; {tolerance} rules")
    return detail, {"dir": str(out / "export"), "drafter": str(pair.drafter), "target": str(pair.target),
                    "dtype": dtype, "tolerance": tolerance, "seconds": seconds,
                    "bytes": {k: v["bytes"] for k, v in engines.items()}, "target_profiles": profiles}


def export_step(dtype: str):
    """The step that exports the tiny pair with TensorRT engines in ``dtype`` (``run.exports[dtype]``)."""
    def step(run) -> None:
        name = f"tensorrt export {dtype} (tiny pair: context, draft + AOT plugin, target)"
        export = run.checks.run(name, lambda: _export(run.out / f"tensorrt-export-{dtype}", dtype))
        if export is not None:
            run.exports[dtype] = export
            run.results.setdefault("tensorrt", {})[f"export_{dtype}"] = export
    return step


class _OnCpu:
    """A graph whose outputs come back to the CPU, where the reference's are (``export.validate`` compares)."""

    def __init__(self, graph):
        self.graph = graph

    def run(self, feeds):
        return {k: v.cpu() for k, v in self.graph.run(feeds).items()}


def _drafter(export: dict, mode: str) -> tuple[str, dict]:
    from ...export.validate import validate_onnx
    from ...loader import load_drafter
    from ...runtime.drafters.tensorrt import TensorRTDrafterBackend

    backend = TensorRTDrafterBackend(export["dir"], graphs=mode)
    drafter = load_drafter(export["drafter"], target_dir=export["target"])
    report = validate_onnx(_OnCpu(backend._graphs["context"]), _OnCpu(backend._graphs["draft"]), drafter, topk=16,
                           dtype=export["tolerance"], raise_on_failure=False)
    bad = [c for c in report.checks if not c.ok]
    assert not bad, f"{len(bad)} of {len(report.checks)} checks: {bad[0].name}: {bad[0].detail}"
    runner = backend._graphs["draft"].runner
    if mode == "graph":  # the copied-context draft graph validate ran: captured, no bucket fell back to eager
        assert_graphs_captured("draft", {"draft (copied)": runner})
    memory = backend.reserved_device_memory()
    backend.deactivate()
    return f"{len(report.checks)} checks ok ({export['tolerance']} rules), {runner.captures} graphs captured", \
        {"reserved": memory}


def reference_target(export: dict):
    """transformers on the CPU, in the export's precision (bf16 rules compare bf16 activations on both sides)."""
    from ...export.target_onnx import load_target_model
    from ...runtime.targets.hf import HFTarget

    dtype = torch.bfloat16 if export["dtype"] == "bf16" else torch.float32
    return HFTarget(load_target_model(export["target"], dtype))


def _target(export: dict, mode: str) -> tuple[str, dict]:
    """Prefill (exact shapes), verify (a padded bucket: graph or eager), a rollback, verify again."""
    from ...export.validate import _close
    from ...export.validate_target import TARGET_TOLERANCES
    from ...runtime.targets.tensorrt import TensorRTTarget

    got = TensorRTTarget(export["dir"], graphs=mode)
    ref = reference_target(export)
    ref.set_taps(got.layer_ids)
    got.set_taps(got.layer_ids)
    tol = TARGET_TOLERANCES[export["tolerance"]]
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
        runners = target_runners(got)
        captured = "; " + assert_graphs_captured("target", runners, need=[tuple(runners)])
    memory = got.reserved_device_memory()
    got.deactivate()
    detail = f"{len(checks)} comparisons ok ({export['tolerance']}: {tol.atol}/{tol.rtol}){captured}"
    return detail, {"reserved": memory}


def target_runners(target) -> dict:
    """The graph runners of a ``TensorRTTarget``'s bucketed graphs (per Q; prefill's exact-shape one left out)."""
    return {f"target Q={q}": g.runner for q, g in target._graphs.items() if g.bucketed}


def drafter_runners(backend) -> dict:
    """The draft graph runners of a ``TensorRTDrafterBackend``: context copied into a bucket, and bound."""
    return {f"draft ({'bound' if name == 'draft_bound' else 'copied'})": g.runner for name, g in backend._graphs.items()
            if name in ("draft", "draft_bound")}


def validate_step(dtype: str, modes=("eager", "graph")):
    def step(run) -> None:
        export = run.exports[dtype]
        for mode in modes:
            run.checks.run(f"tensorrt {dtype} drafter {mode} vs reference", lambda m=mode: _drafter(export, m))
            run.checks.run(f"tensorrt {dtype} target {mode} vs transformers", lambda m=mode: _target(export, m))
    return step


def onnxruntime_tokens(export: dict, prompts, max_new_tokens: int, *, prefill_chunk: int | None = None):
    from ...runtime import SpeculativeDecoder

    dec = SpeculativeDecoder.from_export(export["dir"], backend="onnxruntime")
    if prefill_chunk is not None:
        dec.target.prefill_chunk = prefill_chunk
    return dec.generate(prompts, max_new_tokens=max_new_tokens, topk=16).tokens


def agreement(got, want) -> float:
    """The fraction of generated positions where two runs' tokens agree (positions past the shorter: disagree)."""
    total = sum(max(len(a), len(b)) for a, b in zip(got, want))
    same = sum(sum(x == y for x, y in zip(a, b)) for a, b in zip(got, want))
    return same / total if total else 1.0


def _generate(export: dict, exact: bool) -> tuple[str, dict]:
    from ...runtime import SpeculativeDecoder
    from ...runtime.device_memory import describe_reserved, reserved_device_memory

    prompts = GENERATE_PROMPTS
    want = onnxruntime_tokens(export, prompts, 24)
    rows: dict = {"onnxruntime_tokens": want}
    captured = ""
    for mode in ("eager", "graph"):
        dec = SpeculativeDecoder.from_export(export["dir"], backend="tensorrt", graphs=mode)
        got = dec.generate(prompts, max_new_tokens=24, topk=16).tokens  # warm-up: contexts, captures
        share = agreement(got, want)
        if exact:
            assert got == want, f"{mode}: tokens differ from onnxruntime's: {got} vs {want}"
        else:  # bf16: both sides round differently; the tokens are recorded, their agreement reported
            assert all(len(t) > 0 for t in got), f"{mode}: a request generated nothing: {got}"
        ms = median_ms(lambda: dec.generate(prompts, max_new_tokens=24, topk=16), repeats=3, warmup=0)
        if mode == "graph":  # drafter (copied or bound context) and target: captured, nothing fell back to eager
            draft, target = drafter_runners(dec.backend), target_runners(dec.target)
            captured = assert_graphs_captured("generate", {**draft, **target}, need=[tuple(draft), tuple(target)])
        rows[mode] = {"ms": round(ms, 2), "tokens_per_s": round(3 * 24 / ms * 1e3, 1),
                      "reserved": reserved_device_memory(dec), "agreement": round(share, 3)}
        if mode == "graph":
            print(f"      device memory reserved (graph): {describe_reserved(rows[mode]['reserved'])}", flush=True)
        dec.backend.deactivate()
        dec.target.deactivate()
    same = "tokens == onnxruntime's" if exact else f"agreement with onnxruntime {rows['graph']['agreement']:.0%}"
    detail = (f"eager {rows['eager']['ms']:.1f} ms, graph {rows['graph']['ms']:.1f} ms per batch of 3 x 24 tokens, "
              f"{same} ({captured}); TensorRT: " + ", ".join(f"{k} {v}" for k, v in rows["graph"]["reserved"].items()
                                                             if "engine" in k))
    return detail, rows


def generate_step(dtype: str):
    def step(run) -> None:
        export = run.exports[dtype]
        exact = dtype == "fp32"  # bf16: both sides round differently, near-ties flip tokens
        name = (f"tensorrt {dtype} generate eager/graph " + ("== onnxruntime tokens" if exact else
                                                             "(agreement with onnxruntime recorded)"))
        data = run.checks.run(name, lambda: _generate(export, exact))
        if data is not None:
            run.results.setdefault("tensorrt", {})[f"generate_{dtype}"] = data
    return step
