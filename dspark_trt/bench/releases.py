"""The release matrix, end to end: each drafter preset's pair written, loaded, exported, validated, decoded greedily
(speculative == the target alone) and built into a TensorRT-RTX engine; pass/fail, peak memory and time per release.

  dspark bench releases                        every drafter preset with its target (the Gemma-4 drafter with
                                               the Gemma-4 target) at the tiny size (docs/checkpoints.md's table)
  dspark bench releases --size reduced         full widths and vocabulary, one draft layer, the least target depth
  dspark bench releases --preset speculators_glm5_block8 --json

Each release runs in a subprocess of its own, so its peak resident memory is its own (``ru_maxrss``). A release
whose feature dspark-trt lacks is a one-line ``refused`` row naming the feature, never a traceback. Sizes:

  tiny      hidden 64, 4 / 2 heads of 16 (a Gemma-4 drafter's at global_head_dim 32, its target's window 8), one
            draft layer, the least target depth that keeps the taps, V 600
  reduced   the preset's widths and vocabulary, one draft layer, the same target depth
  full      the preset itself (a Qwen3-8B pair needs ~21 GB on disk and more in memory: not on a 24 GB machine)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["SIZES", "release_depth", "run_release", "greedy_equal", "add_arguments", "run"]

TINY = dict(hidden_size=64, intermediate_size=96, head_dim=16, num_attention_heads=4, num_key_value_heads=2)
TINY_GEMMA4 = dict(TINY, global_head_dim=32, sliding_window=8)
SIZES = ("tiny", "reduced", "full")
STEPS = ("write", "load", "export+validate", "greedy == target", "engine")
PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [3, 4, 5]]


def release_depth(preset, size: str) -> dict:
    """``write_preset`` options of ``size``: the draft layers, target depth, vocabulary and widths."""
    if size == "full":
        return {}
    taps = len(preset.target_layer_ids)
    out = {"layers": 1, "target_layers": taps + 1}
    if size == "tiny":
        out["vocab"] = 600
        out.update(TINY_GEMMA4 if is_gemma4(preset) else TINY)
    return out


def is_gemma4(preset) -> bool:
    """A Gemma-4 pair (DeepSpec's Gemma4DSparkModel with its Gemma-4 target): exported in fp32 (the target's)."""
    return type(preset).__name__.startswith("Gemma4")


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def greedy_equal(export_dir: str | Path) -> tuple[bool, float]:
    """Greedy speculative decoding from an export (onnxruntime) == the target alone on ``PROMPTS``; accepted
    drafts per round."""
    from ..runtime import SpeculativeDecoder

    dec = SpeculativeDecoder.from_export(export_dir)
    spec = dec.generate(PROMPTS, 16, eos_token_id=[])
    alone = dec.generate(PROMPTS, 16, eos_token_id=[], draft=False)
    return spec.tokens == alone.tokens, round(spec.stats.accepted / max(1, spec.stats.rounds), 2)


def run_release(name: str, work: str | Path, size: str = "tiny", *, engine: str = "auto") -> dict:
    """One release in this process: the row of the table (status, the step reached, seconds, the depth run)."""
    import torch

    from ..errors import DSparkTrtError
    from ..export.pipeline import ExportOptions, export_model
    from ..loader import load_drafter
    from ..synthetic.preset_checkpoint import write_preset
    from ..synthetic.presets import get_preset

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    preset = get_preset(name)
    depth = release_depth(preset, size)
    work = Path(work)
    row = {"preset": name, "size": size, "depth": depth, "status": "pass", "step": None, "detail": "", "steps": {}}
    start = time.perf_counter()
    step = STEPS[0]
    try:
        t = time.perf_counter()
        out = write_preset(name, work / "ckpt", with_target=True, dtype="fp32" if size == "tiny" else "bf16",
                           force=True, **depth)
        row["steps"][step] = round(time.perf_counter() - t, 1)
        step, t = STEPS[1], time.perf_counter()
        load_drafter(out.drafter, target_dir=out.target, dtype="fp32")
        row["steps"][step] = round(time.perf_counter() - t, 1)
        step, t = STEPS[2], time.perf_counter()
        dtype = "fp32" if size == "tiny" or is_gemma4(preset) else "bf16"  # Gemma-4 targets export in fp32 only
        result = export_model(out.drafter, work / "export", ExportOptions(topk=8, dtype=dtype, engine="none",
                                                                          max_context=256),
                              target_dir=out.target, force=True)
        bad = [line for line in (result.manifest.get("validation") or []) + (result.manifest["target"].get(
            "validation") or []) if line.strip().startswith(("FAIL", "fail"))]
        if bad:
            raise DSparkTrtError(f"validation failed: {bad[0].strip()}")
        row["steps"][step] = round(time.perf_counter() - t, 1)
        step, t = STEPS[3], time.perf_counter()
        same, row["accepted_per_round"] = greedy_equal(work / "export")
        if not same:
            raise DSparkTrtError("greedy speculative decoding differs from the target alone")
        row["steps"][step] = round(time.perf_counter() - t, 1)
        if engine != "none":
            step, t = STEPS[4], time.perf_counter()
            from ..export.pipeline import build_engines

            manifest = build_engines(work / "export", engine=engine, options=ExportOptions(max_context=256))
            row["engine"] = ", ".join(sorted(manifest.get("engines") or {})) or "none built"
            row["steps"][step] = round(time.perf_counter() - t, 1)
    except DSparkTrtError as e:
        detail = str(e).splitlines()[0]
        row.update(status="refused" if step in STEPS[:2] else "fail", step=step,
                   detail=detail.split("config.json: ", 1)[-1])  # the temporary path says nothing
    except Exception as e:  # noqa: BLE001 — a row, never a traceback
        row.update(status="fail", step=step, detail=_one_line(e))
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def _child(name: str, size: str, engine: str) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"release-{name}-") as work:
        row = run_release(name, work, size, engine=engine)
    row["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return row


def drafter_presets() -> list[str]:
    from ..synthetic.presets import PRESETS

    return [n for n, p in PRESETS.items() if p.kind == "drafter"]


def table(rows: list[dict]) -> str:
    """The markdown table of docs/checkpoints.md."""
    lines = ["| release preset | size (draft layers / target layers) | result | peak RSS | time | note |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        d = r["depth"]
        depth = f"{r['size']} ({d.get('layers', 'all')} / {d.get('target_layers', 'all')})"
        result = r["status"] if r["status"] == "pass" else f"{r['status']} at {r['step']}"
        note = r["detail"] or (f"accepted/round {r.get('accepted_per_round')}; engine: {r.get('engine', '-')}")
        lines.append(f"| `{r['preset']}` | {depth} | {result} | {r.get('peak_rss_mb', '?')} MB | {r['seconds']} s | "
                     f"{note} |")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", action="append", default=None, help="a drafter preset (repeatable; default: all)")
    p.add_argument("--size", choices=SIZES, default="tiny", help="tiny (default), reduced or full (see above)")
    p.add_argument("--engine", default="auto", help="engine flavor for the build step: auto | tensorrt-rtx | none")
    p.add_argument("--json", action="store_true", help="one JSON object per release")
    p.add_argument("--_child", default=None, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    if args._child:
        print(json.dumps(_child(args._child, args.size, args.engine)))
        return 0
    from ..errors import DSparkTrtError
    from ..synthetic.presets import get_preset

    targets = [n for n in args.preset or () if get_preset(n).kind != "drafter"]
    if targets:
        raise DSparkTrtError(f"{targets[0]} is a target preset: bench releases runs drafter presets, each with its "
                             f"target (the Gemma-4 target: --preset dspark_gemma4_12b_block7)")
    rows = []
    for name in args.preset or drafter_presets():
        cmd = [sys.executable, "-m", "dspark_trt.cli.main", "bench", "releases", "--_child", name, "--size", args.size,
               "--engine", args.engine]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        last = (proc.stdout.strip().splitlines() or [""])[-1]
        try:
            row = json.loads(last)
        except json.JSONDecodeError:
            err = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            row = {"preset": name, "size": args.size, "depth": {}, "status": "fail", "step": "?", "seconds": 0,
                   "detail": f"exit {proc.returncode}: {err}"}
        rows.append(row)
        print(json.dumps(row) if args.json else f"{name}: {row['status']} ({row['seconds']} s) {row['detail']}",
              flush=True)
    if not args.json:
        print(table(rows))
    return 0 if all(r["status"] in ("pass", "refused") for r in rows) else 1
