"""The embedded demo pair: a byte-level tiny target that has read a short text, and a drafter distilled from it.

``dspark-export``, ``dspark generate``, ``dspark serve`` and ``dspark bench e2e`` run on it when no model is
given, so a new user sees real speculation offline: text in, text out, acceptance well above 1. Built once
(about a minute on 2 busy CPU cores, with a progress bar), then cached in ``cache_dir("demo")`` (the one cache
root, ``cache.py``) in a directory keyed by the package version, ``BUILD_VERSION`` and every build option,
written atomically under a file lock.

    tokenizer   bytes: ids 0…255 are the UTF-8 bytes, 256 is ``<|mask|>`` (the drafter's mask token)
    vocabulary  V = 2560 model rows: the text never uses ids ≥ 257, they leave room for ``--topk 512``
    target      tiny Qwen3 (``synthetic.write_tiny_checkpoint``), trained for a few hundred steps on
                ``EMBEDDED_TEXT``
    drafter     DeepSeek-format DSpark drafter, ``embed_tokens``/``lm_head`` copied from the trained target,
                then distilled from it (``training.quick.distill_drafter``)

The target's output is memorised, half-garbled text about speculative decoding — a toy, not a language model.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Callable

import torch

from ..atomic import atomic_output_dir
from ..cache import cache_dir, json_digest
from ..synthetic.byte_tokenizer import write_byte_tokenizer
from ..synthetic.tiny import TinyCheckpoint, write_tiny_checkpoint
from ..training.quick import single_thread

__all__ = ["EMBEDDED_TEXT", "BUILD_VERSION", "build_embedded_pair", "embedded_pair", "train_tiny_target"]

log = logging.getLogger("dspark")

BUILD_VERSION = 2  # bump when the recipe below changes (invalidates caches)
EMBEDDED_VOCAB = 2560  # model vocabulary; the byte tokenizer uses ids 0…256 only

EMBEDDED_TEXT = """\
Speculative decoding lets a small drafter guess several tokens ahead while a large target model checks
them all in one pass. When the guesses are right, many tokens are produced for the price of one target
step; when a guess is wrong, the target keeps the correct prefix and supplies the next token itself, so
the output is exactly what the target alone would have written. A DSpark drafter reads hidden states
tapped from a few target layers, looks at the anchor token, and fills a whole block of mask slots in a
single forward pass. A small Markov head then walks the block from left to right and nudges each slot
toward tokens that follow well after the previous one. A confidence head estimates how likely each slot
is to survive verification, and the runtime may stop the block early where confidence drops.
The verifier compares the target distribution with the draft distribution at every slot. It accepts a
draft token with probability equal to the smaller of one and the ratio of the two, and on the first
rejection it samples a replacement from the leftover mass. When every draft is accepted, the target adds
one bonus token of its own. The drafter keeps a cache of context keys and values that grows with each
accepted token, and the target rolls its own cache back to the accepted length after every round.
Greedy decoding is the simplest case: a draft token is kept while it equals the target's top choice.
Sampling at a temperature keeps the same guarantee as long as the verifier sees the very distribution
each draft token was drawn from, including the truncation to the top candidates of the base logits.
Noise for drafting and noise for verification come from separate streams, keyed by the request seed,
the position in the sequence and the token id, so a batch gives the same tokens as each request alone.
The acceptance length counts the accepted drafts plus the one token the target adds in every round.
A good drafter on an easy prompt accepts five or six tokens per round; a random drafter accepts almost
none, and speculation then only costs time. The tokens per second with and without a drafter, measured
in one run on the same machine, tell whether the drafter pays for itself.
"""

DEFAULTS = dict(seed=0, target_steps=250, distill_steps=200, block_size=7, sample_from_anchor=True)


@single_thread()
def train_tiny_target(target_dir: str | Path, text: str, *, steps: int, seed: int = 0, seq_len: int = 64,
                      batch: int = 16, lr: float = 3e-3, progress: Callable[[], object] | None = None) -> float:
    """Train the byte-level target at ``target_dir`` on ``text`` (next-byte cross-entropy); save in place.

    Returns the mean loss of the last 10 steps. ``progress`` is called after every step.
    """
    from torch.nn import functional as F
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32, local_files_only=True)
    data = torch.tensor(list(text.encode("utf-8")), dtype=torch.int64)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    losses = []
    for _ in range(steps):
        starts = torch.randint(0, len(data) - seq_len - 1, (batch,), generator=gen)
        x = torch.stack([data[s: s + seq_len + 1] for s in starts.tolist()])  # [b, seq_len + 1]
        logits = model(input_ids=x[:, :-1]).logits  # [b, seq_len, V]
        loss = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if progress is not None:
            progress()
    model.eval()
    model.save_pretrained(str(target_dir), safe_serialization=True)
    tail = losses[-10:]
    return sum(tail) / len(tail)


def build_embedded_pair(out_dir: str | Path, *, force: bool = False, progress: Callable[[], object] | None = None,
                        **options) -> TinyCheckpoint:
    """Build the demo pair into ``out_dir`` (atomically). Options: ``DEFAULTS`` keys. ``progress`` is called
    after every training step (``target_steps + distill_steps`` calls)."""
    from ..loader import load_drafter
    from ..training.quick import distill_drafter, save_drafter_like

    opts = {**DEFAULTS, **options}
    unknown = set(opts) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"unknown embedded-pair options {sorted(unknown)}")
    out = Path(out_dir)
    with atomic_output_dir(out, force=force, marker="build.json") as tmp:
        pair = write_tiny_checkpoint(tmp / "random", seed=opts["seed"], vocab_size=EMBEDDED_VOCAB, mask_token_id=256,
                                     block_size=opts["block_size"], sample_from_anchor=opts["sample_from_anchor"])
        log.info("demo pair: training the tiny target (%d steps)", opts["target_steps"])
        target_loss = train_tiny_target(pair.target, EMBEDDED_TEXT, steps=opts["target_steps"], seed=opts["seed"],
                                        progress=progress)
        write_byte_tokenizer(pair.target)
        from transformers import AutoModelForCausalLM

        target = AutoModelForCausalLM.from_pretrained(pair.target, dtype=torch.float32, local_files_only=True).eval()
        drafter = load_drafter(pair.drafter, target_dir=pair.target)
        corpus = torch.tensor(list(EMBEDDED_TEXT.encode("utf-8")), dtype=torch.int64)
        log.info("demo pair: distilling the drafter from it (%d steps)", opts["distill_steps"])
        distilled = distill_drafter(drafter, target, steps=opts["distill_steps"], seed=opts["seed"], corpus=corpus,
                                    length=48, progress=progress)
        save_drafter_like(drafter, pair.drafter, tmp / "drafter")
        os.rename(pair.target, tmp / "target")
        (tmp / "build.json").write_text(json.dumps({
            "build_version": BUILD_VERSION, "options": opts, "target_loss": target_loss, **distilled}, indent=2))
        import shutil

        shutil.rmtree(tmp / "random")
    return TinyCheckpoint(drafter=out / "drafter", target=out / "target")


def embedded_pair(root: str | Path | None = None, **options) -> TinyCheckpoint:
    """The cached demo pair (built on first use). ``root`` defaults to ``cache_dir("demo")``."""
    from filelock import FileLock

    from .. import __version__

    opts = {**DEFAULTS, **options}
    key = json_digest({"v": __version__, "b": BUILD_VERSION, "o": opts, "t": EMBEDDED_TEXT})[:12]
    root = Path(root) if root is not None else cache_dir("demo")
    out = root / f"embedded-{__version__}-{key}"
    done = out / "build.json"
    if not done.is_file():
        root.mkdir(parents=True, exist_ok=True)
        with FileLock(str(root / f".{out.name}.lock")):
            if not done.is_file():
                log.info("building the embedded demo pair in %s (one time, about a minute on 2 CPU cores)", out)
                import sys

                from tqdm import tqdm

                from ..hf import no_progress_bars

                with no_progress_bars(), tqdm(total=opts["target_steps"] + opts["distill_steps"], unit="step",
                                              desc="demo pair", file=sys.stderr, leave=False,
                                              disable=not sys.stderr.isatty()) as bar:
                    build_embedded_pair(out, force=out.exists(), progress=bar.update, **opts)
    return TinyCheckpoint(drafter=out / "drafter", target=out / "target")
