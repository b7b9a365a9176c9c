"""gpu-check's fresh-process row: the export's engines deserialized in a new Python process, the way they are
loaded outside this check.

1. **bare**: a process that imports only ``tensorrt`` (no ``dspark_trt`` module, no plugin registration: what
   Triton's ``tensorrt_plan`` backend does) deserializes every engine of the manifest and creates a context —
   the AOT plugin's kernel is inside the draft engine, so nothing needs registering;
2. **generate**: a process that runs ``SpeculativeDecoder.from_export(..., backend="tensorrt")`` (what ``dspark
   generate --backend tensorrt`` runs) and prints its tokens, which must equal the onnxruntime backend's; it
   must not have imported the plugin registration (``dspark_trt.plugins.tensorrt_plugin``).

Each child prints one ``RESULT {json}`` line (``parse_result``); ``check_bare`` turns the bare child's result
into a verdict. Both are pure and CPU-tested (the bare script against a stand-in ``tensorrt`` module that
answers like the binding: ``deserialize_cuda_engine`` returns None for a plan it cannot read).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["BARE_SCRIPT", "GENERATE_SCRIPT", "PLUGIN_MODULE", "parse_result", "check_bare", "child_command",
           "fresh_process_step"]

PLUGIN_MODULE = "dspark_trt.plugins.tensorrt_plugin"

BARE_SCRIPT = r"""
import json, sys
from pathlib import Path
export = Path(sys.argv[1])
manifest = json.loads((export / "manifest.json").read_text())
import tensorrt as trt
runtime = trt.Runtime(trt.Logger(trt.Logger.ERROR))
out = {"tensorrt": str(trt.__version__), "engines": {}}
for name, entry in sorted((manifest.get("engines") or {}).items()):
    if entry.get("flavor", "tensorrt") != "tensorrt":
        continue
    engine = runtime.deserialize_cuda_engine((export / entry["file"]).read_bytes())
    row = {"deserialized": engine is not None}
    if engine is not None:
        context = engine.create_execution_context()
        row.update(context=context is not None, io_tensors=int(engine.num_io_tensors),
                   profiles=int(engine.num_optimization_profiles))
        del context
    out["engines"][name] = row
    del engine
out["dspark_modules"] = sorted(m for m in sys.modules if m.split(".")[0] == "dspark_trt")
print("RESULT " + json.dumps(out))
"""

GENERATE_SCRIPT = r"""
import json, sys
from dspark_trt.runtime import SpeculativeDecoder
export, prompts, new = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
dec = SpeculativeDecoder.from_export(export, backend="tensorrt", graphs="graph")
tokens = dec.generate(prompts, max_new_tokens=new, topk=16).tokens
print("RESULT " + json.dumps({"tokens": tokens, "plugin_registration": "%s" in sys.modules}))
""" % PLUGIN_MODULE


def child_command(script: str, *args) -> list[str]:
    return [sys.executable, "-c", script, *map(str, args)]


def parse_result(stdout: str) -> dict:
    """The child's ``RESULT {json}`` line (the last one); AssertionError when there is none."""
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"the child printed no result: {stdout.strip()[-200:] or '(nothing)'}"
    return json.loads(lines[-1][len("RESULT "):])


def check_bare(result: dict) -> str:
    """A verdict on the bare child's result: every engine deserialized with a context, no dspark_trt module."""
    engines = result.get("engines") or {}
    assert engines, "the manifest lists no TensorRT engine"
    bad = [name for name, row in engines.items() if not row.get("deserialized")]
    assert not bad, (f"a fresh process with TensorRT alone could not deserialize {', '.join(bad)} (the plugin is "
                     f"not self-contained in the engine?)")
    bad = [name for name, row in engines.items() if not row.get("context")]
    assert not bad, f"no execution context for {', '.join(bad)} in a fresh process"
    assert not result.get("dspark_modules"), f"the bare child imported {result['dspark_modules']}"
    return f"{len(engines)} engines deserialized by TensorRT {result.get('tensorrt')} alone"


def _run_child(script: str, *args, timeout: float, pythonpath: str | None = None) -> dict:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    proc = subprocess.run(child_command(script, *args), capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, (f"child exit {proc.returncode}: "
                                  f"{(proc.stderr.strip().splitlines() or ['no output'])[-1][:180]}")
    return parse_result(proc.stdout)


def _fresh_process(export: dict, timeout: float) -> tuple[str, dict]:
    from .steps_tensorrt import GENERATE_PROMPTS, onnxruntime_tokens

    root = str(Path(__file__).resolve().parents[3])  # the checkout: the generate child imports the package
    bare = _run_child(BARE_SCRIPT, export["dir"], timeout=timeout, pythonpath="")
    verdict = check_bare(bare)
    want = onnxruntime_tokens(export, GENERATE_PROMPTS, 24)
    gen = _run_child(GENERATE_SCRIPT, export["dir"], json.dumps(GENERATE_PROMPTS), 24, timeout=timeout,
                     pythonpath=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p))
    assert gen["tokens"] == want, f"a fresh process generated other tokens: {gen['tokens']} vs {want}"
    assert not gen["plugin_registration"], f"dspark generate's path imported {PLUGIN_MODULE} (registration)"
    return f"{verdict}; a fresh generate process: tokens == onnxruntime's, no plugin registration", \
        {"bare": bare, "generate_tokens": gen["tokens"]}


def fresh_process_step(run) -> None:
    run.checks.run("tensorrt fp32 engines in a fresh process (TensorRT alone; dspark generate's path)",
                   lambda: _fresh_process(run.exports["fp32"], timeout=max(60.0, min(180.0, run.budget_left))))
