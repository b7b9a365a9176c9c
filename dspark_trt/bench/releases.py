"""The release matrix, end to end: each drafter preset's pair written, loaded, exported, validated, decoded greedily
(speculative == the target alone) and built into a TensorRT-RTX engine; pass/fail, peak memory and time per release.

  dspark bench releases                        every drafter preset with its target (the Gemma-4 drafter with
                                               the Gemma-4 target) at the tiny size (docs/checkpoints.md's table)
  dspark bench releases --size reduced         full widths and vocabulary, one draft layer, the least target depth
  dspark bench releases --preset speculators_glm5_block8 --json
  dspark bench releases --preset dspark_qwen3_4b_block7 --size full --target-layers fit --memory-gb 20

Each release runs in a subprocess of its own, so its peak resident memory is its own (``ru_maxrss``). A release
whose feature dspark-trt lacks is a one-line ``refused`` row naming the feature, never a traceback. Sizes:

  tiny      hidden 64, 4 / 2 heads of 16 (a Gemma-4 drafter's at global_head_dim 32, its target's window 8), one
            draft layer, the least target depth that keeps the taps, V 600
  reduced   the preset's widths and vocabulary, one draft layer, the same target depth
  full      the drafter preset itself (every layer, width and vocabulary) with its target at full width and
            vocabulary, cut to ``--target-layers`` (default: the least depth that keeps the taps; ``fit``: the
            largest whose row fits ``--memory-gb``, ``bench/release_fit.py``; a whole 8B-class target does not fit
            beside it on a 24 GB machine). Each step runs in a process of its own, so the row gives each step's
            peak: the export's and the engine build's are the drafter's with that target.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..process_memory import MemoryCgroup, evict_page_cache, memory_available, peak_rss_bytes

__all__ = ["SIZES", "STEPS", "release_depth", "run_release", "greedy_equal", "add_arguments", "run"]

TINY = dict(hidden_size=64, intermediate_size=96, head_dim=16, num_attention_heads=4, num_key_value_heads=2)
TINY_GEMMA4 = dict(TINY, global_head_dim=32, sliding_window=8)
SIZES = ("tiny", "reduced", "full")
STEPS = ("write", "load", "export+validate", "greedy == target", "drafter engines", "target engine")
ENGINE_STEPS = STEPS[4:]
#: what a step run in a memory cgroup adds to its row: the limit, the cgroup's peak, its out-of-memory kills
LIMIT_KEYS = ("memory_limit_mb", "cgroup_peak_mb", "cgroup_oom_kills")
PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [3, 4, 5]]


def release_depth(preset, size: str, *, target_layers: int | None = None) -> dict:
    """``write_preset`` options of ``size``: the draft layers, target depth, vocabulary and widths.

    ``target_layers`` overrides the target's depth (default: the least depth that keeps the drafter's taps);
    ``full`` keeps the drafter whole and cuts only the target."""
    taps = len(preset.target_layer_ids)
    out = {"target_layers": target_layers or taps + 1}
    if size == "full":
        return out
    out["layers"] = 1
    if size == "tiny":
        out["vocab"] = 600
        out.update(TINY_GEMMA4 if is_gemma4(preset) else TINY)
    return out


def is_gemma4(preset) -> bool:
    """A Gemma-4 pair (DeepSpec's Gemma4DSparkModel with its Gemma-4 target): tiny at its own head sizes."""
    from ..synthetic.gemma4_presets import Gemma4DrafterPreset

    return isinstance(preset, Gemma4DrafterPreset)


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def greedy_equal(export_dir: str | Path, *, low_memory: bool = False) -> tuple[bool, float]:
    """Greedy speculative decoding from an export (onnxruntime) == the target alone on ``PROMPTS``; accepted
    drafts per round. ``low_memory``: onnxruntime's low-memory sessions (weights memory-mapped, cast per run)."""
    from ..runtime import SpeculativeDecoder

    dec = SpeculativeDecoder.from_export(export_dir, low_memory=low_memory)
    spec = dec.generate(PROMPTS, 16, eos_token_id=[])
    alone = dec.generate(PROMPTS, 16, eos_token_id=[], draft=False)
    return spec.tokens == alone.tokens, round(spec.stats.accepted / max(1, spec.stats.rounds), 2)


def _pair_paths(work: Path):
    from types import SimpleNamespace

    return SimpleNamespace(drafter=work / "ckpt" / "drafter", target=work / "ckpt" / "target")


def _write(preset, name: str, work: Path, size: str, depth: dict, row: dict) -> None:
    from ..synthetic.preset_checkpoint import write_preset

    write_preset(name, work / "ckpt", with_target=True, dtype="fp32" if size == "tiny" else "bf16", force=True,
                 **depth)


def _load(preset, name: str, work: Path, size: str, depth: dict, row: dict) -> None:
    from ..loader import load_drafter

    out = _pair_paths(work)
    load_drafter(out.drafter, target_dir=out.target, dtype="fp32" if size == "tiny" else "bf16")  # as written


def _export(preset, name: str, work: Path, size: str, depth: dict, row: dict) -> None:
    from ..errors import DSparkTrtError, ValidationMismatch
    from ..export.pipeline import ExportOptions, export_model

    out = _pair_paths(work)
    dtype = "fp32" if size == "tiny" else "bf16"  # as written
    try:
        result = export_model(out.drafter, work / "export", ExportOptions(topk=8, dtype=dtype, engine="none",
                                                                          max_context=256),
                              target_dir=out.target, force=True)
    except ValidationMismatch as e:
        row["validation"] = {"failed": e.report}  # the whole report (each check, passed or not), in the JSON row
        raise
    row["export_phase_peak_rss_mb"] = {k: round(v / 2**20) for k, v in result.phase_peak_rss.items()}
    row["validation"] = {"drafter": result.manifest.get("validation") or [],
                         "target": result.manifest["target"].get("validation") or []}  # the reports, in the JSON row
    bad = [line for line in row["validation"]["drafter"] + row["validation"]["target"]
           if line.strip().startswith(("FAIL", "fail"))]
    if bad:
        raise DSparkTrtError(f"validation failed: {bad[0].strip()}")


def _greedy(preset, name: str, work: Path, size: str, depth: dict, row: dict) -> None:
    from ..errors import DSparkTrtError

    same, row["accepted_per_round"] = greedy_equal(work / "export", low_memory=size != "tiny")
    if not same:
        raise DSparkTrtError("greedy speculative decoding differs from the target alone")


def _engines(graphs: tuple[str, ...]):
    def build(preset, name: str, work: Path, size: str, depth: dict, row: dict, engine: str = "auto") -> None:
        from ..export.pipeline import ExportOptions, build_engines

        manifest = build_engines(work / "export", engine=engine, options=ExportOptions(max_context=256), graphs=graphs)
        row["engine"] = ", ".join(sorted(manifest.get("engines") or {})) or "none built"
    return build


STEP_FUNCTIONS = dict(zip(STEPS, (_write, _load, _export, _greedy, _engines(("context", "draft")),
                                  _engines(("target",)))))


def run_release(name: str, work: str | Path, size: str = "tiny", *, engine: str = "auto",
                steps: tuple[str, ...] | None = None, target_layers: int | None = None) -> dict:
    """One release in this process: the row of the table (status, the step reached, seconds, the depth run).

    ``steps``: a subset of ``STEPS`` to run, in order, on what earlier steps left in ``work`` (the per-step
    processes of ``--size full``); default: all of them (the engine step unless ``engine`` is ``"none"``)."""
    import torch

    from ..errors import DSparkTrtError
    from ..synthetic.presets import get_preset

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    preset = get_preset(name)
    depth = release_depth(preset, size, target_layers=target_layers)
    work = Path(work)
    row = {"preset": name, "size": size, "depth": depth, "status": "pass", "step": None, "detail": "", "steps": {}}
    if steps is None:
        steps = STEPS if engine != "none" else STEPS[:-len(ENGINE_STEPS)]
    start = time.perf_counter()
    step = steps[0]
    try:
        for step in steps:
            t = time.perf_counter()
            if step in ENGINE_STEPS:
                STEP_FUNCTIONS[step](preset, name, work, size, depth, row, engine=engine)
            else:
                STEP_FUNCTIONS[step](preset, name, work, size, depth, row)
            row["steps"][step] = round(time.perf_counter() - t, 1)
    except DSparkTrtError as e:
        detail = str(e).splitlines()[0]
        row.update(status="refused" if step in STEPS[:2] else "fail", step=step,
                   detail=detail.split("config.json: ", 1)[-1])  # the temporary path says nothing
    except Exception as e:  # noqa: BLE001 — a row, never a traceback
        row.update(status="fail", step=step, detail=_one_line(e))
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def _child(name: str, size: str, engine: str, *, work: str | None = None, step: str | None = None,
           target_layers: int | None = None) -> dict:
    if work is not None:  # one step of a --size full row, on the row's work directory
        row = run_release(name, work, size, engine=engine, steps=(step,), target_layers=target_layers)
    else:
        with tempfile.TemporaryDirectory(prefix=f"release-{name}-") as tmp:
            row = run_release(name, tmp, size, engine=engine, target_layers=target_layers)
    row["peak_rss_mb"] = round(peak_rss_bytes() / 2**20)
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
        if r.get("step_peak_rss_mb"):
            note += "; peak MB per step: " + ", ".join(f"{k} {v}" for k, v in r["step_peak_rss_mb"].items())
        lines.append(f"| `{r['preset']}` | {depth} | {result} | {r.get('peak_rss_mb', '?')} MB | {r['seconds']} s | "
                     f"{note} |")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", action="append", default=None, help="a drafter preset (repeatable; default: all)")
    p.add_argument("--size", choices=SIZES, default="tiny", help="tiny (default), reduced or full (see above)")
    p.add_argument("--target-layers", type=_target_layers, default=None, metavar="N|fit",
                   help="the target's depth (default: the least that keeps the drafter's taps); 'fit': the largest "
                        "whose row fits --memory-gb (bench/release_fit.py)")
    p.add_argument("--memory-gb", type=float, default=None,
                   help="the memory budget of --target-layers fit (default: 90%% of what the kernel reports available)")
    p.add_argument("--engine", default="auto", help="engine flavor for the build step: auto | tensorrt-rtx | none")
    p.add_argument("--per-step", action="store_true",
                   help="each step in a process of its own: each step's peak memory (always with --size full)")
    p.add_argument("--memory-limit-gb", type=float, default=None, metavar="G",
                   help="run every step in a memory cgroup of G GB, as on a G GB host (Linux; needs a writable memory "
                        "cgroup); --target-layers fit then sizes for G unless --memory-gb says otherwise")
    p.add_argument("--drafter-memory-limit-gb", type=float, default=None, metavar="G",
                   help="build the drafter's engines (its own step) in a memory cgroup of G GB: anonymous memory and "
                        "page cache together, as on a G GB host (Linux; needs a writable memory cgroup)")
    p.add_argument("--json", action="store_true", help="one JSON object per release")
    p.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_step", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_work", default=None, help=argparse.SUPPRESS)


def _target_layers(text: str) -> int | str:
    if text == "fit":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a depth >= 1 or 'fit', got {text!r}")
    return value


def _depth_of(name: str, args: argparse.Namespace) -> tuple[int | None, str]:
    """The target depth a row runs at (None: the default) and, for ``fit``, the line saying why."""
    if args.target_layers != "fit":
        return args.target_layers, ""
    from ..synthetic.presets import get_preset
    from .release_fit import fit_target_layers

    gb = args.memory_gb or args.memory_limit_gb
    budget = int(gb * 1e9) if gb else int(0.9 * memory_available())
    return fit_target_layers(get_preset(name), budget)


def _run_child(name: str, args: argparse.Namespace, depth: int | None, *extra: str,
               limit_bytes: int | None = None) -> dict:
    """One child process's row; with ``limit_bytes`` the child runs in a memory cgroup of that size, the work
    directory's files evicted from the page cache first so that its reads are charged to it (the row then says its
    limit, the cgroup's peak, and whether the limit killed it)."""
    cmd = [sys.executable, "-m", "dspark_trt.cli.main", "bench", "releases", "--_child", name, "--size", args.size,
           "--engine", args.engine, *extra]
    if depth:
        cmd += ["--target-layers", str(depth)]
    if limit_bytes and "--_work" in extra:
        evict_page_cache(extra[extra.index("--_work") + 1])
    with MemoryCgroup(limit_bytes) if limit_bytes else contextlib.nullcontext() as cgroup:
        proc = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=cgroup.join if cgroup else None)
        limit = dict(zip(LIMIT_KEYS, (round(limit_bytes / 2**20), _mb(cgroup.peak_bytes()), cgroup.oom_kills()))) \
            if cgroup else {}
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    try:
        return {**json.loads(last), **limit}
    except json.JSONDecodeError:
        detail = exit_detail(proc.returncode, proc.stderr, limit_bytes if limit.get("cgroup_oom_kills") else None)
        return {"preset": name, "size": args.size, "depth": {}, "status": "fail", "step": extra[1] if extra else "?",
                "seconds": 0, "steps": {}, "detail": detail, **limit}


def _mb(value: int | None) -> int | None:
    return None if value is None else round(value / 2**20)


def exit_detail(returncode: int, stderr: str, limit_bytes: int | None = None) -> str:
    """One line for a step's process that printed no row: the signal that ended it (SIGKILL: most likely the kernel's
    out-of-memory killer; ``limit_bytes``: its memory cgroup's limit killed it), else its exit status and last line
    of stderr."""
    import signal

    if limit_bytes is not None:
        return (f"killed by its memory limit of {limit_bytes / 1e9:.2f} GB (the memory cgroup's out-of-memory killer: "
                f"the step needs more than that, page cache reclaimed)")
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:  # a number without a name here
            name = str(-returncode)
        oom = " (most likely the kernel's out-of-memory killer: the step needs more memory than is free)" \
            if returncode == -signal.SIGKILL else ""
        return f"killed by {name}{oom}"
    err = (stderr.strip().splitlines() or ["no output"])[-1]
    return f"exit {returncode}: {err}"


def step_memory_limits(args: argparse.Namespace) -> dict[str, int]:
    """The steps that run in a memory cgroup → its limit in bytes: every step with ``--memory-limit-gb``; the
    drafter's engines, the one step that holds the drafter alone, with ``--drafter-memory-limit-gb`` (over the
    other)."""
    every, drafter = getattr(args, "memory_limit_gb", None), getattr(args, "drafter_memory_limit_gb", None)
    limits = {step: int(every * 1e9) for step in STEPS} if every else {}
    if drafter:
        limits["drafter engines"] = int(drafter * 1e9)
    return limits


def _stepwise_row(name: str, args: argparse.Namespace, depth: int | None) -> dict:
    """A row whose steps each run in a child process of their own, on one work directory: each step's peak."""
    steps = STEPS if args.engine != "none" else STEPS[:-len(ENGINE_STEPS)]
    limits = step_memory_limits(args)
    row: dict = {}
    with tempfile.TemporaryDirectory(prefix=f"release-{name}-") as work:
        for step in steps:
            part = _run_child(name, args, depth, "--_step", step, "--_work", work, limit_bytes=limits.get(step))
            limit = {key: part.pop(key) for key in LIMIT_KEYS if key in part}
            if not row:
                row = {**part, "steps": {}, "step_peak_rss_mb": {}, "seconds": 0.0}
            if limit:
                row.setdefault("step_memory_limit", {})[step] = limit
            row["steps"].update(part.get("steps", {}))
            row["step_peak_rss_mb"][step] = part.get("peak_rss_mb")
            row["seconds"] = round(row["seconds"] + part.get("seconds", 0), 1)
            row["peak_rss_mb"] = max(v or 0 for v in row["step_peak_rss_mb"].values())
            for key in ("accepted_per_round", "engine", "validation", "export_phase_peak_rss_mb"):
                if key in part:
                    row[key] = part[key]
            if part["status"] != "pass":
                row.update(status=part["status"], step=part.get("step", step), detail=part.get("detail", ""))
                break
    return row


def run(args: argparse.Namespace) -> int:
    if args._child:
        print(json.dumps(_child(args._child, args.size, args.engine, work=args._work, step=args._step,
                                target_layers=args.target_layers)))
        return 0
    from ..errors import DSparkTrtError
    from ..synthetic.presets import get_preset

    targets = [n for n in args.preset or () if get_preset(n).kind != "drafter"]
    if targets:
        raise DSparkTrtError(f"{targets[0]} is a target preset: bench releases runs drafter presets, each with its "
                             f"target (the Gemma-4 target: --preset dspark_gemma4_12b_block7)")
    if args.target_layers == "fit" and args.size != "full":
        raise DSparkTrtError("--target-layers fit sizes the full-shape target (--size full); at --size "
                             f"{args.size} pass a depth, or leave it out")
    if args.drafter_memory_limit_gb is not None and (args.drafter_memory_limit_gb <= 0 or args.engine == "none"):
        raise DSparkTrtError("--drafter-memory-limit-gb G limits the drafter engines step: give G > 0 and an "
                             "engine flavor (not --engine none)")
    if args.memory_limit_gb is not None and args.memory_limit_gb <= 0:
        raise DSparkTrtError(f"--memory-limit-gb {args.memory_limit_gb:g}: give the limit in GB (> 0)")
    limits = step_memory_limits(args)
    for limit in set(limits.values()):
        MemoryCgroup(limit).remove()  # no memory cgroup here: one line now, not mid-row
    rows = []
    for name in args.preset or drafter_presets():
        depth, why = _depth_of(name, args)  # once per row: every step runs at that depth
        stepwise = args.size == "full" or args.per_step or limits
        row = _stepwise_row(name, args, depth) if stepwise else _run_child(name, args, depth)
        if why:
            row["depth_fit"] = why
        rows.append(row)
        print(json.dumps(row) if args.json else f"{name}: {row['status']} ({row['seconds']} s) {row['detail']}"
              f"{'; ' + why if why else ''}", flush=True)
    if not args.json:
        print(table(rows))
    return 0 if all(r["status"] in ("pass", "refused") for r in rows) else 1
