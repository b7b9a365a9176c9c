"""Distilled tiny pairs for tests: a drafter that is often right, so acceptance paths are really taken.

Built on the training package's quick distiller (``training.quick.distill_drafter``), the one the embedded
demo pair uses too.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..atomic import atomic_output_dir, write_marker
from ..synthetic.tiny import TinyCheckpoint, write_tiny_checkpoint
from ..training.quick import distill_drafter, save_drafter_like

__all__ = ["distill_tiny_drafter", "write_distilled_pair"]


def distill_tiny_drafter(drafter_dir: str | Path, target_dir: str | Path, out_dir: str | Path, *,
                         force: bool = False, **options) -> Path:
    """Distil the drafter at ``drafter_dir`` from the target at ``target_dir``; write it to ``out_dir``
    (atomically, same checkpoint format and tensor names, config copied). Returns ``out_dir``.

    Example:
        >>> pair = write_tiny_checkpoint("/tmp/tiny")
        >>> distill_tiny_drafter(pair.drafter, pair.target, "/tmp/tiny-distilled")
    """
    from transformers import AutoModelForCausalLM

    from ..loader import load_drafter

    drafter = load_drafter(drafter_dir, target_dir=target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32, local_files_only=True).eval()
    distill_drafter(drafter, target, **options)
    return save_drafter_like(drafter, drafter_dir, out_dir, force=force)


def write_distilled_pair(out_dir: str | Path, *, seed: int = 0, vocab_size: int = 257, embed_scale: float = 10.0,
                         head_scale: float = 3.0, steps: int = 150, markov_head_type: str = "vanilla",
                         force: bool = False, **tiny_options):
    """A tiny pair whose drafter is often right: ``write_tiny_checkpoint``, then a *bigram-like* target, then
    a distilled drafter (≈ 10 s on 2 CPU cores). Returns ``TinyCheckpoint``.

    A random tiny target is close to uniform and its argmax hangs on tiny margins no brief distillation can
    copy. Scaling its token embeddings by ``embed_scale`` makes the residual stream follow the current token
    (next token ≈ f(current), with context still mattering), and scaling ``lm_head`` by ``head_scale``
    sharpens the distribution at T = 1. The drafter's shared ``embed_tokens`` / ``lm_head`` are copied from
    the scaled target before distillation. ``markov_head_type`` (vanilla, gated, rnn) picks the drafter's Markov
    head; the quick distiller trains each as ``dspark distill`` does (``training/blocks.py``).

    Example:
        >>> pair = write_distilled_pair("/tmp/distilled", sample_from_anchor=False)
        >>> rnn = write_distilled_pair("/tmp/distilled-rnn", markov_head_type="rnn")
    """
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    from ..loader import load_drafter

    out = Path(out_dir)
    if markov_head_type != "vanilla":  # the marker of a vanilla pair stays as it was
        tiny_options = {**tiny_options, "markov_head_type": markov_head_type}
    with atomic_output_dir(out, force=force) as tmp:
        pair = write_tiny_checkpoint(tmp / "random", seed=seed, vocab_size=vocab_size, **tiny_options)
        weights = pair.target / "model.safetensors"
        tensors = load_file(str(weights))
        tensors["model.embed_tokens.weight"] *= embed_scale
        tensors["lm_head.weight"] *= head_scale
        save_file(tensors, str(weights), metadata={"format": "pt"})
        target = AutoModelForCausalLM.from_pretrained(pair.target, dtype=torch.float32, local_files_only=True).eval()
        drafter = load_drafter(pair.drafter, target_dir=pair.target)
        distill_drafter(drafter, target, steps=steps, seed=seed)
        save_drafter_like(drafter, pair.drafter, tmp / "drafter")
        (pair.target).rename(tmp / "target")
        import shutil

        shutil.rmtree(tmp / "random")
        write_marker(tmp, "write_distilled_pair", seed=seed, vocab_size=vocab_size, steps=steps, options=tiny_options)
    return TinyCheckpoint(drafter=out / "drafter", target=out / "target")
