"""Shared fixtures and capability gates (markers are declared in pyproject.toml).

Tests marked ``gpu``, ``tensorrt``, ``rtx``, ``triton``, ``onnx`` or ``tritonserver`` are skipped automatically when the
capability is missing, so the CPU suite passes on a machine without a GPU or TensorRT.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import pytest
import torch

from dspark_trt.export import on_demand

on_demand.install()  # the onnxruntime drafter exports checkpoints on demand (what the CLI and serving install)

# Without CUDA, Triton kernels run in Triton's CPU interpreter. `triton.jit` reads TRITON_INTERPRET when a
# kernel module is imported, so it is set here, before any test module can import triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _worker_threads() -> int | None:
    """``pytest -n W`` on C cores: C // W intra-op threads per worker (at least 1); None outside xdist."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if not workers:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // workers)


# Each xdist worker's torch, and every process it starts (OMP_NUM_THREADS: the dspark CLI, the SmolLM2 walk-through,
# Triton's model stubs), gets its share of the cores: a second intra-op thread waiting for a core the other worker
# holds stalls every parallel op (dspark_trt/threads.py: 4-20x slower). A given OMP_NUM_THREADS is kept.
if _worker_threads() is not None and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(_worker_threads())
    torch.set_num_threads(_worker_threads())


@functools.cache
def have_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


@functools.cache
def have_tensorrt() -> bool:
    try:
        import tensorrt  # noqa: F401
    except Exception:  # the PyPI stub fails in many ways
        return False
    return True


GATES = {
    "gpu": (lambda: torch.cuda.is_available(), "no CUDA device"),
    "tensorrt": (have_tensorrt, "TensorRT not importable"),
    "rtx": (lambda: have_module("tensorrt_rtx"), "TensorRT-RTX not installed"),
    "triton": (lambda: have_module("triton"), "OpenAI Triton not installed"),
    "onnx": (lambda: have_module("onnx") and have_module("onnxruntime"), "onnx/onnxruntime not installed"),
    "speculators": (lambda: have_module("speculators"),
                    "speculators not installed (it pins an older transformers: .ci/run runs these in .venv-interop)"),
    "tritonserver": (lambda: have_module("tritonclient") and have_module("grpc"),
                     "tritonclient not installed (pip install -e '.[serve]')"),
}


#: the tritonserver group's first module: its first ``dspark serve`` start exports the demo pair into the run's serve
#: cache (``serve_cache_dir``), the export every later module of the group serves (``embedded_export``)
TRITONSERVER_GROUP_FIRST = "tests/serving/test_dspark_serve.py::"


def _group(item) -> str | None:
    marker = item.get_closest_marker("xdist_group")
    return (marker.args[0] if marker.args else marker.kwargs.get("name")) if marker is not None else None


def pytest_collection_modifyitems(config, items):
    for item in items:
        for marker, (available, reason) in GATES.items():
            # markers only: item.keywords also holds directory names (a checkout named "gpu" would match)
            if item.get_closest_marker(marker) is not None and not available():
                item.add_marker(pytest.mark.skip(reason=reason))
    # `--dist loadgroup` runs a group's tests in collection order: test_dspark_serve.py's go first within the
    # tritonserver group (the slots the group holds, everything else stays where it is), so the demo pair is exported
    # once per run, not once by the fixture and again by that module's first start
    slots = [i for i, item in enumerate(items) if _group(item) == "tritonserver"]
    grouped = sorted((items[i] for i in slots), key=lambda item: not item.nodeid.startswith(TRITONSERVER_GROUP_FIRST))
    for i, item in zip(slots, grouped):
        items[i] = item


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """The default tiny DeepSeek-format drafter + Qwen3 target (written once per session)."""
    from dspark_trt.synthetic import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "pair", seed=0)


@pytest.fixture
def one_thread():
    """Tiny models under ``pytest -n 2`` on 2 cores: a second torch thread mostly waits on a busy core."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def build_once(tmp_path_factory, name: str, build):
    """Build a checkpoint pair ``name`` once per test run, shared by all xdist workers (file lock)."""
    from filelock import FileLock

    from dspark_trt.synthetic import TinyCheckpoint

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # this run's workers, never older runs
    out = root / name
    with FileLock(str(root / f"{name}.lock")):
        if not (out / "drafter" / "config.json").is_file():
            before = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                build(out)
            finally:
                torch.set_num_threads(before)
    return TinyCheckpoint(drafter=out / "drafter", target=out / "target")


@pytest.fixture(scope="session")
def random_pair(tmp_path_factory):
    """The default tiny pair (vocabulary 2500, random drafter), shared by xdist workers."""
    from dspark_trt.synthetic import write_tiny_checkpoint

    return build_once(tmp_path_factory, "random-qwen3", lambda out: write_tiny_checkpoint(out, seed=0))


@pytest.fixture(scope="session")
def distilled_pair(tmp_path_factory):
    """Anchor-first drafter distilled from a bigram-like tiny target, vocabulary 257 (``write_distilled_pair``)."""
    from dspark_trt.testing import write_distilled_pair

    return build_once(tmp_path_factory, "distilled-anchor-first", lambda out: write_distilled_pair(out, seed=0))


@pytest.fixture(scope="session")
def distilled_bonus_pair(tmp_path_factory):
    """The same recipe in the bonus-anchor layout (sample_from_anchor=false, N = block_size - 1)."""
    from dspark_trt.testing import write_distilled_pair

    return build_once(tmp_path_factory, "distilled-bonus-anchor",
                      lambda out: write_distilled_pair(out, seed=1, sample_from_anchor=False))


@pytest.fixture(scope="session")
def small_vocab_pair(tmp_path_factory):
    """Vocabulary 37 (mask 36), a peaky target at T = 1, block 4, distilled drafter: for chi-square tests."""
    from dspark_trt.testing import write_distilled_pair

    return build_once(tmp_path_factory, "distilled-vocab37", lambda out: write_distilled_pair(
        out, seed=2, vocab_size=37, head_scale=6.0, block_size=4))


@pytest.fixture(scope="session")
def small_vocab_gated_pair(tmp_path_factory):
    """As ``small_vocab_pair`` with a gated Markov head (anchor-first)."""
    from dspark_trt.testing import write_distilled_pair

    return build_once(tmp_path_factory, "distilled-vocab37-gated", lambda out: write_distilled_pair(
        out, seed=4, vocab_size=37, head_scale=6.0, block_size=4, markov_head_type="gated"))


@pytest.fixture(scope="session")
def small_vocab_rnn_pair(tmp_path_factory):
    """As ``small_vocab_pair`` with an RNN Markov head, in the bonus-anchor layout (its state starts from the
    anchor slot's; N = block_size - 1 = 4)."""
    from dspark_trt.testing import write_distilled_pair

    return build_once(tmp_path_factory, "distilled-vocab37-rnn", lambda out: write_distilled_pair(
        out, seed=5, vocab_size=37, head_scale=6.0, block_size=5, markov_head_type="rnn", sample_from_anchor=False))


@pytest.fixture(scope="session")
def small_vocab_reduced_pair(tmp_path_factory):
    """As ``small_vocab_pair`` with a reduced draft vocabulary (29 of 37 ids, d2t table)."""
    from dspark_trt.testing import write_distilled_pair

    return build_once(tmp_path_factory, "distilled-vocab37-reduced", lambda out: write_distilled_pair(
        out, seed=3, vocab_size=37, draft_vocab_size=29, head_scale=6.0, block_size=4))


# -- ONNX exports of tiny checkpoints, shared by tests/export, tests/plugins and tests/runtime -------------
@pytest.fixture(scope="session")
def onnx_cache_dir(tmp_path_factory, request):
    """One export cache per pytest run, shared by xdist workers (entries are content-addressed and locked)."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if hasattr(request.config, "workerinput") else base) / "dspark-onnx-cache"


@pytest.fixture(scope="session")
def tiny_odd_pair(tmp_path_factory):
    """A speculators-format pair with the awkward options: reduced vocab (d2t), logit_scale 0.5, bonus-anchor
    layout (N = block_size - 1 = 4), no confidence head."""
    from dspark_trt.synthetic import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-odd") / "pair", seed=3, format="speculators",
                                 draft_vocab_size=1111, logit_scale=0.5, sample_from_anchor=False, block_size=5,
                                 confidence_head=False)


@pytest.fixture(scope="session")
def tiny_causal_pair(tmp_path_factory):
    """A speculators-format pair trained the speculators way: layer 0 ``sliding_attention`` with window 4
    (causal inside the block, context rows p-4 … p-1), layer 1 ``full_attention`` (bidirectional)."""
    from dspark_trt.synthetic import write_tiny_checkpoint

    return build_once(tmp_path_factory, "tiny-causal-windowed", lambda out: write_tiny_checkpoint(
        out, seed=4, format="speculators", layer_types=("sliding_attention", "full_attention"), sliding_window=4))


@pytest.fixture(scope="session")
def tiny_windowed_pair(tmp_path_factory):
    """The recipe's pattern (``dspark distill --context-window``): both layers ``sliding_attention`` with window
    4 over the context and bidirectional in the block (DeepSeek format)."""
    from dspark_trt.synthetic import write_tiny_checkpoint

    return build_once(tmp_path_factory, "tiny-windowed", lambda out: write_tiny_checkpoint(
        out, seed=6, layer_types=("sliding_attention",) * 2, sliding_window=4, sliding_window_non_causal=True))


@pytest.fixture(scope="session")
def gated_pair(tmp_path_factory):
    """A gated-Markov-head pair (issue 42): vocabulary 257, rank 8, block 5, anchor-first (N = 5), DeepSeek format."""
    from dspark_trt.synthetic import write_tiny_checkpoint

    return build_once(tmp_path_factory, "tiny-gated", lambda out: write_tiny_checkpoint(
        out, seed=11, markov_head_type="gated", vocab_size=257, markov_rank=8, block_size=5))


@pytest.fixture(scope="session")
def rnn_pair(tmp_path_factory):
    """An RNN-Markov-head pair with the awkward options: bonus-anchor layout (N = 4, the state starts after the anchor
    slot), reduced draft vocabulary 199 of 257 (d2t), logit_scale 0.5, rank 8, speculators format."""
    from dspark_trt.synthetic import write_tiny_checkpoint

    return build_once(tmp_path_factory, "tiny-rnn", lambda out: write_tiny_checkpoint(
        out, seed=12, format="speculators", markov_head_type="rnn", vocab_size=257, draft_vocab_size=199,
        markov_rank=8, block_size=5, sample_from_anchor=False, logit_scale=0.5))


#: exports the ONNX tests use: (pair fixture, dtype, topk), split between xdist workers up front (below)
STANDARD_ONNX_EXPORTS = [("tiny_pair", "fp32", 16), ("tiny_pair", "fp32", "off"), ("tiny_pair", "fp16", 16),
                         ("tiny_pair", "bf16", 16), ("tiny_pair", "fp32", 2500), ("tiny_odd_pair", "fp32", 1)]


@pytest.fixture(scope="session")
def onnx_export(onnx_cache_dir, request):
    """``onnx_export(pair, dtype, topk, markov_topm=0)`` → export directory (exported and validated once per run).

    Under xdist, each worker first builds its share of ``STANDARD_ONNX_EXPORTS`` (entry i on worker
    i mod n), so the workers export in parallel instead of queueing on the same entry's lock.
    """
    from dspark_trt.export.onnx import cached_onnx_export

    def export(pair, dtype: str = "fp32", topk="off", markov_topm: int = 0):
        return cached_onnx_export(pair.drafter, onnx_cache_dir, target_dir=pair.target, dtype=dtype, topk=topk,
                                  target="onnxruntime", markov_topm=markov_topm)

    worker = getattr(request.config, "workerinput", None)
    if worker is not None:
        index, count = int(worker["workerid"].removeprefix("gw")), worker["workercount"]
        for pair, dtype, topk in STANDARD_ONNX_EXPORTS[index::count]:
            export(request.getfixturevalue(pair), dtype, topk)
    return export


# -- dspark-export directories with the target graph (runtime from_export, CLI --export) ---------------------
def export_once(tmp_path_factory, name: str, pair, **options):
    """``export_model(pair.drafter, ..., target_dir=pair.target)`` once per run (shared by xdist workers, file
    lock), no engine; ~30-60 s on 2 cores (the target graph export dominates)."""
    from filelock import FileLock

    from dspark_trt.export.pipeline import ExportOptions, export_model

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out = root / name
    with FileLock(str(root / f"{name}.lock")):
        if not (out / "manifest.json").is_file():
            before = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                export_model(pair.drafter, out, ExportOptions(engine="none", **options), target_dir=pair.target,
                             force=True)
            finally:
                torch.set_num_threads(before)
    return out


@pytest.fixture(scope="session")
def qwen3_topk_export(tmp_path_factory, random_pair):
    """DeepSeek-format drafter + Qwen3 target, top-k 16, fp32, target exported."""
    return export_once(tmp_path_factory, "export-qwen3-topk16-fp32", random_pair, topk=16, dtype="fp32")


@pytest.fixture(scope="session")
def gated_topk_export(tmp_path_factory, gated_pair):
    """The gated-head pair, top-k 16, fp32, target exported (DSparkTopKMarkovGated through its local function)."""
    return export_once(tmp_path_factory, "export-gated-topk16-fp32", gated_pair, topk=16, dtype="fp32")


@pytest.fixture(scope="session")
def rnn_topk_export(tmp_path_factory, rnn_pair):
    """The RNN-head pair (bonus-anchor, reduced vocabulary), top-k 16, fp32, target exported."""
    return export_once(tmp_path_factory, "export-rnn-topk16-fp32", rnn_pair, topk=16, dtype="fp32")


@pytest.fixture(scope="session")
def speculators_llama_pair(tmp_path_factory):
    """A speculators-format drafter with a Llama target that taps its last layer (id 5 of 6: pre-norm)."""
    from dspark_trt.synthetic import write_tiny_checkpoint

    return build_once(tmp_path_factory, "speculators-llama", lambda out: write_tiny_checkpoint(
        out, seed=5, format="speculators", target_family="llama", target_layer_ids=(0, 3, 5)))


@pytest.fixture(scope="session")
def llama_dense_export(tmp_path_factory, speculators_llama_pair):
    """The speculators/Llama pair, dense walk, fp32, target exported."""
    return export_once(tmp_path_factory, "export-llama-dense-fp32", speculators_llama_pair, topk="off", dtype="fp32")


# -- a tiny Gemma-4 target (6 layers: 5 sliding of window 8, 1 global) with a Qwen3-layer drafter of its width -----
#: the Gemma-4 widths of the tests: hidden 64, head_dim 16 (sliding), global_head_dim 32, window 8
GEMMA4_WIDTHS = dict(hidden_size=64, intermediate_size=96, head_dim=16, global_head_dim=32, num_attention_heads=4,
                     num_key_value_heads=2, sliding_window=8)
#: the stand-in drafter's taps of the 6-layer target
GEMMA4_TAPS = (1, 3, 4)


def write_gemma4_pair(out) -> None:
    """``out/target``: the ``gemma4_12b`` preset at ``GEMMA4_WIDTHS`` (vocabulary 600); ``out/drafter``: a 1-layer
    Qwen3-layer DeepSeek drafter of its width tapping ``GEMMA4_TAPS`` (DeepSpec's Gemma-4 drafter has Gemma-4 layers,
    another worktree's job; ``bench/releases.py`` pairs the target the same way)."""
    import dataclasses

    from dspark_trt.synthetic.preset_checkpoint import write_preset
    from dspark_trt.synthetic.presets import get_preset, scaled

    write_preset("gemma4_12b", out / "target", layers=6, vocab=600, dtype="fp32", **GEMMA4_WIDTHS)
    drafter = scaled(get_preset("dspark_qwen3_8b_block7"), layers=1, target_layers=6, vocab=600,
                     **{k: v for k, v in GEMMA4_WIDTHS.items() if k not in ("global_head_dim", "sliding_window")})
    write_preset(dataclasses.replace(drafter, target_layer_ids=GEMMA4_TAPS), out / "drafter", dtype="fp32")


@pytest.fixture(scope="session")
def gemma4_pair(tmp_path_factory):
    """The tiny Gemma-4 target and its stand-in drafter (``write_gemma4_pair``), shared by xdist workers."""
    return build_once(tmp_path_factory, "gemma4-pair", write_gemma4_pair)


@pytest.fixture(scope="session")
def gemma4_export(tmp_path_factory, gemma4_pair):
    """The Gemma-4 pair through dspark-export: top-k 8, fp32, max context 256, the target validated."""
    return export_once(tmp_path_factory, "export-gemma4-topk8-fp32", gemma4_pair, topk=8, dtype="fp32",
                       max_context=256)


# -- the SmolLM2 walk-through, run once: tests/test_example_smollm2.py reads its output, tests/models its export ---
#: the path, not the quality: a 3-step drafter on 8 tokens per prompt, no prompt bank, 2 held-out prompts benchmarked
WALKTHROUGH_ARGS = ("--steps", "3", "--new-tokens", "8", "--bank-prompts", "0", "--heldout", "2")


@pytest.fixture(scope="session")
def smollm2_walkthrough(tmp_path_factory):
    """``examples/smollm2_walkthrough.py OUT`` (``WALKTHROUGH_ARGS``) once per run, shared by xdist workers (file
    lock) → SimpleNamespace(returncode, stdout, stderr, out). Its export (SmolLM2 + the 3-step drafter, top-k 512,
    fp32, both graphs validated) is also the SmolLM2 export of tests/models/test_smollm2.py."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out, record = root / "smollm2-walkthrough", root / "smollm2-walkthrough.json"
    with FileLock(str(root / "smollm2-walkthrough.lock")):
        if not record.is_file():
            script = Path(__file__).resolve().parents[1] / "examples" / "smollm2_walkthrough.py"
            proc = subprocess.run([sys.executable, str(script), str(out), *WALKTHROUGH_ARGS], capture_output=True,
                                  text=True, timeout=1800)
            record.write_text(json.dumps({"returncode": proc.returncode, "stdout": proc.stdout,
                                          "stderr": proc.stderr}))
    return SimpleNamespace(**json.loads(record.read_text()), out=out)


# -- the demo pair's export as `dspark serve CHECKPOINT` makes it on a CPU host, shared by the tritonserver tests -----
@pytest.fixture(scope="session")
def serve_cache_dir(tmp_path_factory):
    """The export cache of this run's ``dspark serve`` starts (tests/serving/test_dspark_serve.py), shared by xdist
    workers."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    (root / "serve-cache").mkdir(exist_ok=True)
    return root / "serve-cache"


@pytest.fixture(scope="session")
def embedded_export(serve_cache_dir):
    """The embedded demo pair exported (fp32, no engine, target graph validated) into ``serve_cache_dir`` as ``dspark
    serve`` exports it on a CPU host: the first start of test_dspark_serve.py, first of the tritonserver group
    (``pytest_collection_modifyitems`` puts it there), has exported it already, and the other tritonserver modules
    serve that export instead of making their own."""
    from dspark_trt.export.pipeline import ExportOptions
    from dspark_trt.serving.export_cache import cached_export
    from dspark_trt.demo.pair import embedded_pair

    drafter, target = embedded_pair()
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return cached_export(drafter, target_dir=target, options=ExportOptions(dtype="fp32", engine="none"),
                             cache_dir=serve_cache_dir).path
    finally:
        torch.set_num_threads(before)
