"""``dspark bench export SOURCE``: what ``dspark-export`` costs — wall time, peak resident memory and bytes written,
per phase (trace, weights, validation, target, plugin, engines, manifest) and in total.

SOURCE is a checkpoint directory, or a preset name (``dspark make-checkpoint --list``) written first into the
work directory. The export runs as a child process (``dspark-export SOURCE -o WORK/export --force`` plus the
arguments after ``--``); this process samples the resident memory of the child's whole process tree (the PTX
compiler included) every 0.1 s from ``/proc`` — anonymous and file-backed pages apart — and reads the export's
``[i/n] phase`` log lines to attribute each sample to its phase. Bytes written: the export's directory (its
hidden temporary directory while it runs) at the end of each phase. The kernel's own peak of the exporting
process (``ru_maxrss``) is reported beside the samples. Ratios are to the checkpoint's bytes (its ``.safetensors``
files, the target's included when ``--target`` exports it).

    dspark bench export -o bench/ /ckpt/dspark_qwen3_8b_block7 --topk 512 --skip-target --engine none
    dspark bench export --work /big/tmp dspark_qwen3_8b_block7 --topk 512 --no-validate

(this benchmark's options before SOURCE; everything after it goes to ``dspark-export``). ``--max-rss GB`` stops
an export that would take the machine's memory (default: 90 % of what is available at the start) and reports
the phase it reached.

Writes ``OUT/export.json`` and ``OUT/export.md`` (the table in docs/export.md) with ``-o OUT``; prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

__all__ = ["add_arguments", "run", "measure_export", "tree_rss", "table"]

PHASE = re.compile(r"\[(\d+)/(\d+)\] (.+?) (\.\.\.|done in [0-9.]+s)(?: \(peak resident memory so far [0-9.]+ GB\))?$")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", metavar="SOURCE", help="a drafter checkpoint directory, or a preset name")
    p.add_argument("export_args", nargs=argparse.REMAINDER, metavar="EXPORT_ARGS",
                   help="everything after SOURCE goes to dspark-export (e.g. --topk 512 --skip-target --engine none); "
                        "put this benchmark's own options before SOURCE")
    p.add_argument("--work", default=None, help="where the export (and a preset) are written (default: a temporary "
                   "directory, removed afterwards)")
    p.add_argument("--keep", action="store_true", help="keep the export in --work")
    p.add_argument("-o", "--out", default=None, help="write export.json and export.md here")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--interval", type=float, default=0.1, help="seconds between memory samples (default 0.1)")
    p.add_argument("--max-rss", type=float, default=None, metavar="GB",
                   help="stop the export when its process tree holds more than this (default: 90%% of the memory "
                        "available at the start), and report the phase it reached")


# -- memory of a process tree ------------------------------------------------------------------------------
def _children(pid: int) -> list[int]:
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            text = Path(f"/proc/{pid}/task/{task}/children").read_text()
            out += [int(c) for c in text.split()]
    except OSError:
        pass
    return out


def tree_rss(pid: int) -> tuple[int, int]:
    """(anonymous, file-backed) resident bytes of ``pid`` and its descendants (``/proc/*/status``)."""
    anon = file = 0
    stack = [pid]
    while stack:
        p = stack.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("RssAnon:"):
                    anon += int(line.split()[1]) * 1024
                elif line.startswith(("RssFile:", "RssShmem:")):
                    file += int(line.split()[1]) * 1024
        except OSError:
            continue
        stack += _children(p)
    return anon, file


def _dir_bytes(*dirs: Path) -> int:
    total = 0
    for d in dirs:
        for root, _, files in os.walk(d):
            for f in files:
                try:
                    total += os.lstat(os.path.join(root, f)).st_blocks * 512
                except OSError:
                    pass
    return total


def _checkpoint_bytes(*dirs) -> int:
    return sum(f.stat().st_size for d in dirs if d for f in Path(d).glob("*.safetensors"))


# -- one measured export -----------------------------------------------------------------------------------
def measure_export(source: Path, out: Path, export_args: list[str], *, interval: float = 0.1,
                   max_rss: int | None = None) -> dict:
    """Run ``dspark-export source -o out --force export_args`` in a child process; per-phase figures."""
    cmd = [sys.executable, "-m", "dspark_trt.cli.export_entry", str(source), "-o", str(out), "--force", *export_args]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    phases: list[dict] = []
    current = {"name": "start-up", "start": 0.0, "peak": 0, "peak_anon": 0, "peak_file": 0}
    lock = threading.Lock()
    done = threading.Event()
    lines: list[str] = []
    stopped: list[str] = []

    def sample():
        while not done.is_set():
            anon, file = tree_rss(proc.pid)
            if max_rss and anon > max_rss and not stopped:  # file-backed pages can be reclaimed; anonymous cannot
                stopped.append(f"stopped in phase {current.get('name')!r} at {anon / 1e9:.1f} GB anonymous "
                               f"(--max-rss {max_rss / 1e9:.1f} GB)")
                _kill_tree(proc.pid)
            with lock:
                if anon + file > current["peak"]:
                    current.update(peak=anon + file)
                current["peak_anon"] = max(current["peak_anon"], anon)
                current["peak_file"] = max(current["peak_file"], file)
            done.wait(interval)

    def written() -> int:
        return _dir_bytes(*[p for p in out.parent.glob(f".{out.name}.tmp-*")], *([out] if out.exists() else []))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip("\n")
        lines.append(line)
        m = PHASE.search(line)
        if m and m.group(4) == "...":
            now = time.perf_counter() - start
            with lock:
                current.update(seconds=now - current["start"], bytes_written=written())
                phases.append(dict(current))
                current.clear()
                current.update(name=m.group(3), start=now, peak=0, peak_anon=0, peak_file=0)
    rc = proc.wait()
    done.set()
    sampler.join()
    total = time.perf_counter() - start
    with lock:
        current.update(seconds=total - current["start"], bytes_written=written())
        phases.append(dict(current))
    import resource

    maxrss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # the largest child's own peak
    for p in phases:
        p.pop("start", None)
    return {"command": cmd, "returncode": rc, "seconds": total, "phases": phases,
            "peak_rss": max(p["peak"] for p in phases), "ru_maxrss": maxrss,
            "bytes_written": _dir_bytes(out) if out.exists() else phases[-1]["bytes_written"],
            "last_lines": lines[-8:], "stopped": stopped[0] if stopped else None}


def validation_titles(export_dir: Path) -> list[str]:
    """What the export validated: the first line of each validation report in its manifest (the drafter's, the
    target's; each says full graphs or which layer subset, and why); [] without a manifest or validation."""
    from ..artifact.export_dir import ExportDir
    from ..errors import DSparkTrtError

    try:
        manifest = ExportDir(export_dir).manifest
    except DSparkTrtError:  # the export failed before its manifest
        return []
    reports = [manifest.get("validation"), (manifest.get("target") or {}).get("validation")]
    return [r[0] for r in reports if isinstance(r, list) and r]


def _kill_tree(pid: int) -> None:
    import signal

    stack, seen = [pid], []
    while stack:
        p = stack.pop()
        seen.append(p)
        stack += _children(p)
    for p in reversed(seen):  # children first, then the export
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


# -- the command ------------------------------------------------------------------------------------------
def _source(args, work: Path) -> tuple[Path, Path | None]:
    source = Path(args.source)
    if source.is_dir():
        return source, None
    from ..errors import DSparkTrtError
    from ..synthetic import preset_checkpoint as presets
    from ..synthetic.presets import PRESETS

    if args.source not in PRESETS:
        raise DSparkTrtError(f"{args.source} is neither a checkpoint directory nor a preset ({', '.join(PRESETS)}): "
                             f"pass a checkpoint directory or a preset name")
    dest = work / args.source
    if not (dest / "config.json").is_file():
        presets.write_preset(args.source, dest, progress=sys.stderr.isatty())
    return dest, dest


def run(args: argparse.Namespace) -> int:
    import shutil
    import tempfile

    from ..atomic import atomic_write_text

    export_args = list(args.export_args or [])
    if export_args[:1] == ["--"]:
        export_args = export_args[1:]
    max_rss = int(args.max_rss * 1e9) if args.max_rss else int(0.9 * (_mem_available() or 0)) or None
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="dspark-bench-export-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        source, _ = _source(args, work)
        exported_target = "--target" in export_args and "--skip-target" not in export_args
        target = export_args[export_args.index("--target") + 1] if exported_target else None
        result = measure_export(source, work / "export", export_args, interval=args.interval, max_rss=max_rss)
        result["validation"] = validation_titles(work / "export")
    finally:
        if not args.keep:
            shutil.rmtree(work / "export", ignore_errors=True)
            if not args.work:
                shutil.rmtree(work, ignore_errors=True)
    ck = _checkpoint_bytes(source, target)
    report = {"source": str(args.source), "export_args": export_args, "checkpoint_bytes": ck, **result,
              "peak_rss_over_checkpoint": result["peak_rss"] / ck if ck else None,
              "machine": {"cpus": os.cpu_count(), "memory_bytes": _mem_total()}}
    text = table(report)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "export.json", json.dumps(report, indent=1) + "\n")
        atomic_write_text(out / "export.md", text + "\n")
    print(json.dumps(report) if args.json else text)
    return 0 if result["returncode"] == 0 else 1


def _meminfo(key: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _mem_total() -> int | None:
    return _meminfo("MemTotal")


def _mem_available() -> int | None:
    return _meminfo("MemAvailable")


def table(r: dict) -> str:
    gb = 1e9
    ck = r["checkpoint_bytes"] or 0
    head = (f"dspark-export {r['source']} {' '.join(r['export_args'])} — checkpoint {ck / gb:.2f} GB, exit "
            f"{r['returncode']}, {r['seconds']:.0f} s, peak RSS {r['peak_rss'] / gb:.2f} GB"
            + (f" ({r['peak_rss'] / ck:.2f}× the checkpoint)" if ck else "")
            + f", ru_maxrss {r['ru_maxrss'] / gb:.2f} GB, written {r['bytes_written'] / gb:.2f} GB"
            + (f"; {r['stopped']}" if r.get("stopped") else ""))
    rows = ["| phase | wall s | peak RSS GB (anon + file) | × checkpoint | written GB (cumulative) |",
            "|---|---|---|---|---|"]
    for p in r["phases"]:
        ratio = f"{p['peak'] / ck:.2f}" if ck else "—"
        rows.append(f"| {p['name']} | {p['seconds']:.1f} | {p['peak'] / gb:.2f} ({p['peak_anon'] / gb:.2f} + "
                    f"{p['peak_file'] / gb:.2f}) | {ratio} | {p['bytes_written'] / gb:.2f} |")
    checked = [f"- {line}" for line in r.get("validation") or []]
    return head + "\n\n" + "\n".join(rows) + ("\n\nValidated:\n" + "\n".join(checked) if checked else "")
