"""``dspark distill``: train a DSpark drafter for a Hugging Face target (DeepSpec's recipe, small), on the CPU or a GPU.

    data      the target continues the training prompts (``prompts.TRAIN_PROMPTS`` and ``bank_prompts`` of the
              prompt bank through its chat template; random token prompts for a target without a tokenizer),
              one continuation per prompt: a ``greedy_share`` of them greedy, the rest sampled like a served
              request (T 0.7, top-p 0.8, top-k 20: ``sampling.py``); kept in the text store (``store.py``),
              shared between runs and appended to, never rewritten
    context   the target's taps at positions 0 … p-1 (``DSparkDrafter.context_kv``)
    anchors   positions of the target-written continuation only (from the prompt's last token on): the
              prompts share their chat template, which a drafter would otherwise learn by heart
    block     anchor x_p, then N - 1 mask slots (anchor-first layout); slot j predicts x_{p+j+1}
    Markov    teacher-forced: slot j's bias is W2 · W1[x_{p+j}], the true predecessor (vanilla), or W2 · u_j, the
              gated / RNN head's feature of it and of the slot's hidden state (``--markov-head-type``;
              ``blocks.py``)
    loss      per slot, weighted exp(-j / γ): cross-entropy against the target's T = 1 distribution (its top-K,
              renormalised on the draft vocabulary) + cross-entropy against the target's greedy token,
              + ``conf_weight`` · BCE of the confidence head toward 1 - ½‖q_j - p_j‖₁ (DSpark Eq. 8/11)
    frozen    ``embed_tokens`` and ``lm_head`` (copied from the target, rows ``d2t``-mapped)
    validate  every ``val_every`` steps, the simulated greedy acceptance length on held-out target text
              (``validate.py``); the weights written are the best step's (``distill.json``: the curve)
    warm      ``init_from``: start from an existing drafter's weights instead (its shape and draft vocabulary
              are kept), e.g. to train a drafter further on more text
    device    ``device``: the target writes (batched) and the drafter trains there; the checkpoint is fp32 on
              the CPU either way. ``presets.PRESETS["gpu"]`` sizes a run for one H200 (docs/smollm2.md)

Deterministic for a seed, a step count and the text: batch k is drawn from a generator seeded by (seed, k), so
a run that resumes from its last checkpoint (``OUT`` beside ``.OUT.work/``, written every ``checkpoint_every_s``)
ends with the same weights as one that never stopped. ``--minutes`` fixes the step count from the speed
of steps 1 … 3 (step 0's one-time costs are not timed; recorded in the checkpoint, so a resumed run keeps it).
The result is a DeepSeek-format checkpoint (``config.json`` + ``model.safetensors``) plus ``distill.json``
(settings, losses, the text's size and origin, the validation curve) and ``validation.png``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from torch.nn import functional as F

from ..atomic import atomic_output_dir, atomic_write_text
from ..errors import DSparkTrtError
from ..synthetic.drafter_config import deepseek_drafter_config
from .blocks import FROZEN
from .drafter_init import DrafterShape, drafter_config, init_drafter
from .presets import PRESETS  # noqa: F401 - re-exported
from .store import digest as _digest

__all__ = ["DistillSettings", "PRESETS", "distill", "work_dir", "training_prompts", "validation_prompts",
           "trained_prompts", "writing_jobs", "default_data_dir"]

log = logging.getLogger("dspark")

RESULT = "distill.json"
CURVE_PNG = "validation.png"
#: settings that do not change the drafter (left out of the finished run's key)
RUN_ONLY = ("threads", "checkpoint_every_s", "init_from", "data_dir", "device")
#: what a ``distill.json`` written before a setting existed means by its absence (``trained_prompts``)
LEGACY = {"val_prompts": 0}


@dataclass(frozen=True)
class DistillSettings:
    steps: int | None = None  # None: from --minutes (or 300)
    minutes: float | None = None
    seed: int = 0
    batch: int = 8  # sequences per step
    anchors: int = 16  # blocks per sequence per step
    lr: float = 1e-3  # peak (linear warm-up, cosine decay)
    warmup: int = 20
    new_tokens: int = 128  # continuation length per prompt
    top: int = 32  # target distribution kept per position
    position_decay: float = 4.0  # γ in exp(-j / γ)
    conf_weight: float = 0.2
    random_prompts: int = 32  # targets without a tokenizer
    bank_prompts: int = 0  # extra prompts from ``prompt_bank`` (forms × subjects) besides TRAIN_PROMPTS
    data_batch: int = 64  # prompts the target continues at once while writing the training text
    temperature: float = 0.7  # the sampled continuations (``sampling.py``), as served
    top_p: float = 0.8
    top_k: int = 20
    greedy_share: float = 0.5  # share of the prompts continued greedily (the rest sampled)
    val_prompts: int = 48  # held-out validation prompts (greedy continuations); 0: no validation
    val_every: int = 200  # steps between validations (0: none)
    val_anchors: int = 16  # rounds simulated per validation sequence
    threads: int | None = None
    checkpoint_every_s: float = 60.0
    init_from: str | None = None  # a drafter directory to start from (``warm`` in the module docstring)
    data_dir: str | None = None  # the text store (default: ``default_data_dir(out)``)
    device: str = "cpu"


def default_data_dir(out: str | Path) -> Path:
    """The text store when ``--data`` is not given: ``dspark-text`` beside the drafter's directory."""
    return Path(os.path.abspath(out)).parent / "dspark-text"


def work_dir(out: str | Path) -> Path:
    out = Path(out)
    return out.parent / f".{out.name}.work"


def _shape_key(shape: DrafterShape) -> dict:
    """The shape's part of a run's key; a vanilla head is left out, so runs finished before the head was a
    choice keep their key."""
    key = asdict(shape)
    if key.get("markov_head_type") == "vanilla":
        del key["markov_head_type"]
    return key


def _weights_digest(model_dir: Path) -> str:
    from .store import target_identity

    return target_identity(model_dir, {}).get("weights", "")


def _load_init(init_from: str, target_dir: Path, config):
    """The drafter to start from (fp32), refused in one line when its shapes differ from ``config``'s."""
    from ..loader import load_drafter
    from .drafter_init import shape_mismatches

    init_dir = Path(init_from)
    if not (init_dir / "config.json").is_file():
        raise DSparkTrtError(f"--init-from {init_dir} is not a drafter directory (no config.json)")
    init = load_drafter(init_dir, target_dir=target_dir)
    bad = shape_mismatches(init.config, config)
    if bad:
        raise DSparkTrtError(f"--init-from {init_dir} has another shape than the drafter to train ({', '.join(bad)}); "
                             f"drop the shape options (they come from --init-from) or start without it")
    return init


def _save(obj, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def training_prompts(tokenizer, settings: DistillSettings, vocab_size: int, mask_id: int) -> list[list[int]]:
    """Token ids of the prompts the target continues for the training text: ``TRAIN_PROMPTS`` +
    ``settings.bank_prompts`` of the prompt bank through the tokenizer (chat template; without the validation
    subjects when validation is on), or random token prompts for a target without a tokenizer. A budget past the
    whole bank repeats it (``writing_jobs`` samples the repeats with other seeds)."""
    from .data import random_prompts
    from .prompt_bank import prompt_bank
    from .prompts import TRAIN_PROMPTS, render_prompts

    if tokenizer is None:
        return random_prompts(vocab_size, settings.random_prompts, 6, seed=settings.seed, avoid=(mask_id,))
    bank = prompt_bank(settings.bank_prompts, seed=settings.seed, holdout=settings.val_prompts > 0)
    prompts = render_prompts(TRAIN_PROMPTS + bank, tokenizer)
    want = len(TRAIN_PROMPTS) + settings.bank_prompts
    return [prompts[i % len(prompts)] for i in range(want)] if want > len(prompts) else prompts


def validation_prompts(tokenizer, settings: DistillSettings, vocab_size: int, mask_id: int,
                       train: list[list[int]]) -> list[list[int]]:
    """Token ids of the held-out validation prompts (``prompt_bank.validation_bank``; random prompts of another
    seed for a target without a tokenizer), none of them a training prompt."""
    from .data import random_prompts
    from .prompt_bank import validation_bank
    from .prompts import render_prompts

    if settings.val_prompts <= 0:
        return []
    if tokenizer is None:
        pool = random_prompts(vocab_size, settings.val_prompts, 6, seed=settings.seed + 1_000_003, avoid=(mask_id,))
    else:
        pool = render_prompts(validation_bank(settings.val_prompts, seed=settings.seed), tokenizer)
    seen = {tuple(p) for p in train}
    return [p for p in pool if tuple(p) not in seen]


def writing_jobs(prompts: list[list[int]], settings: DistillSettings, *, greedy_share: float | None = None) -> list:
    """One ``data.Job`` per prompt: prompt i greedy when ⌊(i+1)·share⌋ > ⌊i·share⌋ (evenly spread, stable as the
    list grows), else sampled with a seed from (seed, prompt, repeat); a repeated prompt is always sampled."""
    from .data import Job
    from .sampling import row_seed

    share = settings.greedy_share if greedy_share is None else greedy_share
    seen: Counter = Counter()
    jobs = []
    for i, p in enumerate(prompts):
        r = seen[tuple(p)]
        seen[tuple(p)] += 1
        greedy = r == 0 and math.floor((i + 1) * share) > math.floor(i * share)
        jobs.append(Job(tuple(p), greedy, 0 if greedy else row_seed(settings.seed, p, r)))
    return jobs


def trained_prompts(drafter_dir: str | Path, target_dir: str | Path) -> list[list[int]] | None:
    """Token ids of the prompts a ``dspark distill`` drafter was trained on (their continuations are its training
    text), rebuilt from its ``distill.json``; None for a drafter without one. Refused in one line when the rebuild
    does not match the digest recorded at training time (the prompt lists changed since)."""
    from dataclasses import fields

    from ..jsonfile import read_json
    from ..loader import read_target_config
    from ..runtime.decoder import load_tokenizer

    result = Path(drafter_dir) / RESULT
    if not result.is_file():
        return None
    summary = read_json(result, missing=f"{result} is missing",
                        fix=f"retrain the drafter with 'dspark distill' or delete {result}")
    names = {f.name for f in fields(DistillSettings)}
    settings = DistillSettings(**{**LEGACY, **{k: v for k, v in summary["key"]["settings"].items() if k in names}})
    config = read_json(Path(drafter_dir) / "config.json", missing=f"{drafter_dir} has no config.json",
                       fix="pass a drafter directory")
    V = int(read_target_config(target_dir)["vocab_size"])
    prompts = training_prompts(load_tokenizer(target_dir), settings, V, int(config["mask_token_id"]))
    recorded = summary.get("prompts_digest")
    if recorded is not None and recorded != _digest(prompts):
        raise DSparkTrtError(f"{result}: the prompts this drafter trained on cannot be rebuilt by this dspark-trt "
                             f"(the prompt lists in dspark_trt/training/ changed since); use the dspark-trt that "
                             f"trained it, or skip this part")
    return prompts


def _text(target, tokenizer, config_raw: dict, settings: DistillSettings, mask_id: int, hf_indices: list[int],
          identity: dict, store_root: Path) -> tuple[list[dict], list[dict], dict]:
    """(training rows, validation rows, origin): the rows the store holds, the missing ones written by the target
    (batched on its device) and appended to the store first."""
    from tqdm.auto import tqdm

    from .data import write_rows
    from .sampling import WritingSettings
    from .store import TextStore, row_key

    V = int(config_raw["vocab_size"])
    train_prompts = training_prompts(tokenizer, settings, V, mask_id)
    val_prompts = validation_prompts(tokenizer, settings, V, mask_id, train_prompts)
    train_jobs = writing_jobs(train_prompts, settings)
    val_jobs = writing_jobs(val_prompts, settings, greedy_share=1.0)  # greedy: the acceptance is exact on it
    eos = tuple(_eos_ids(tokenizer, config_raw)) if tokenizer is not None else ()
    sampling = WritingSettings(temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k)
    store = TextStore(store_root, {"target": identity, "taps": list(hf_indices), "top": settings.top,
                                   "new_tokens": settings.new_tokens, "sampling": asdict(sampling),
                                   "eos": list(eos), "avoid": [mask_id]})
    jobs = train_jobs + val_jobs
    keys = [row_key(j) for j in jobs]
    written, new_entries = 0, []
    start = time.perf_counter()
    with store.lock():
        found, used = store.load(keys)
        missing = list({k: j for k, j in zip(keys, jobs) if k not in found}.items())
        if missing:
            log.info("text store %s: %d of %d rows held, %d to write", store.dir, len(found), len(set(keys)),
                     len(missing))

            def keep(batch_jobs, rows):
                nonlocal written
                names = [k for k, _ in missing[written: written + len(rows)]]
                new_entries.append(store.append(names, rows))
                found.update(zip(names, rows))
                written += len(rows)

            batches = math.ceil(len(missing) / settings.data_batch)
            with tqdm(total=batches, desc="target writes training text", unit="batch", mininterval=5) as bar:
                write_rows(target, [j for _, j in missing], new_tokens=settings.new_tokens, sampling=sampling,
                           batch=settings.data_batch, eos=eos, avoid=(mask_id,), hf_indices=hf_indices,
                           top=settings.top, progress=bar.update, on_batch=keep)
            log.info("%d rows, %d tokens written in %.0f s", written,
                     sum(len(found[k]["ids"]) for k, _ in missing), time.perf_counter() - start)
        else:
            log.info("text store %s: all %d rows held, nothing to write", store.dir, len(set(keys)))
    train = [found[k] for k in keys[: len(train_jobs)]]
    val = [found[k] for k in keys[len(train_jobs):]]
    origin = {"store": str(store.dir), "key": store.name, "target": identity, "writing": asdict(sampling),
              "new_tokens": settings.new_tokens, "greedy_share": settings.greedy_share,
              "entries": sorted(set(used) | set(new_entries)), "entries_written": new_entries,
              "rows_written": written, "sequences": len(train), "tokens": sum(len(r["ids"]) for r in train),
              "greedy_sequences": sum(j.greedy for j in train_jobs),
              "validation_sequences": len(val), "validation_tokens": sum(len(r["ids"]) for r in val),
              "prompts_digest": _digest(train_prompts)}
    return train, val, origin


def _eos_ids(tokenizer, config_raw: dict) -> list[int]:
    ids = config_raw.get("eos_token_id")
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tokenizer is not None and tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(int(tokenizer.eos_token_id))
    return ids


def _mask_token(tokenizer, V: int) -> int:
    """A special token the target never writes in its chat turns, else the last vocabulary id."""
    if tokenizer is not None:
        for name in ("<empty_output>", "<|mask|>", "<mask>"):
            tid = tokenizer.convert_tokens_to_ids(name)
            if isinstance(tid, int) and 0 <= tid < V and tid != tokenizer.unk_token_id:
                return tid
    return V - 1


def _draft_vocab(data: dict, V: int, size: int | None, keep: tuple[int, ...]) -> torch.Tensor:
    """[V_d] sorted target ids: the most frequent tokens of the training text and of the target's top choices."""
    if not size or size >= V:
        return torch.arange(V)
    counts = torch.bincount(data["ids"].flatten(), minlength=V).to(torch.float64)
    counts += torch.bincount(data["top_ids"][..., 0].flatten(), minlength=V).to(torch.float64)
    counts[list(keep)] += 1e12
    counts += torch.arange(V, 0, -1, dtype=torch.float64) * 1e-9  # ties → lower ids, deterministic
    return counts.topk(size).indices.sort().values


def _lr(step: int, total: int, s: DistillSettings) -> float:
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    t = (step - s.warmup) / max(1, total - s.warmup)
    return s.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def sample_anchors(lengths: torch.Tensor, starts: torch.Tensor, N: int, batch: int, anchors: int,
                   gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """rows [batch] and anchor positions [batch, anchors] with start ≤ p ≤ len - N (p ≥ 1): every slot's
    predecessor x_{p+j} and label position lie in the sequence, and the anchors lie in the written text."""
    starts = starts.clamp_min(1)  # [S] first anchor: the prompt's last token
    usable = torch.nonzero(lengths - N >= starts).flatten()  # rows with room for a block after the prompt
    if len(usable) == 0:
        raise DSparkTrtError(f"no training sequence has room for a block of {N} after its prompt; write longer "
                             f"continuations (--new-tokens)")
    rows = usable[torch.randint(0, len(usable), (batch,), generator=gen)]  # [b]
    lo, hi = starts[rows].view(-1, 1), (lengths[rows] - N).view(-1, 1)
    u = torch.rand(batch, anchors, generator=gen, dtype=torch.float64)
    return rows, torch.minimum(lo + (u * (hi - lo + 1).to(torch.float64)).long(), hi)


def distill_step(drafter, data: dict, t2d: torch.Tensor, step: int, s: DistillSettings) -> tuple[torch.Tensor, dict]:
    """The loss of training step ``step`` (its batch depends only on (seed, step)); ``data`` and ``t2d`` on the
    drafter's device, the anchors drawn on the CPU."""
    from .blocks import block_logits

    c = drafter.config
    N = c.num_draft_tokens
    gen = torch.Generator().manual_seed(s.seed * 1_000_003 + step)
    dev = data["ids"].device
    lengths = data["lengths"].cpu()  # [S]
    starts = data.get("starts", torch.ones_like(data["lengths"])).cpu()
    rows, p = sample_anchors(lengths, starts, N, s.batch, s.anchors, gen)  # [b], [b, a]
    blk = block_logits(drafter, data, rows.to(dev), p.to(dev))
    m, slot_pos = blk.m, blk.slot_pos  # [M], [M, N]
    logq = F.log_softmax(blk.z.to(torch.float32), dim=-1)  # [M, N, V_d]
    top_ids = data["top_ids"][m.view(-1, 1), slot_pos]  # [M, N, K] target ids
    top_p = data["top_logp"][m.view(-1, 1), slot_pos].exp()  # [M, N, K]
    d_idx = t2d[top_ids]  # [M, N, K] draft ids, -1 outside the draft vocabulary
    inside = d_idx >= 0
    p_in = top_p * inside
    p_norm = p_in / p_in.sum(-1, keepdim=True).clamp_min(1e-12)
    logq_top = logq.gather(-1, d_idx.clamp_min(0))  # [M, N, K]
    soft = -(p_norm * logq_top).sum(-1)  # [M, N]
    hard = -logq_top[..., 0] * inside[..., 0]  # greedy token (top-1), when drafted at all
    weight = torch.exp(-torch.arange(N, dtype=torch.float32, device=dev) / s.position_decay)
    weight = weight / weight.sum()
    loss_tok = ((soft + hard) * weight).sum(-1).mean()
    stats = {"ce": float(loss_tok.detach())}
    loss = loss_tok
    if drafter.confidence_head is not None:
        feats = torch.cat((blk.hidden, blk.e), dim=-1) if c.confidence_head_with_markov else blk.hidden
        conf_logit = drafter.confidence_head.proj(feats.to(torch.float32)).squeeze(-1)  # [M, N]
        with torch.no_grad():
            q_top = logq_top.exp() * inside
            tv = 0.5 * ((q_top - p_in).abs().sum(-1) + (1 - q_top.sum(-1)).clamp_min(0) + (1 - p_in.sum(-1)).clamp_min(0))
            conf_target = (1 - tv).clamp(0, 1)  # [M, N] ≈ acceptance probability of slot j
        bce = F.binary_cross_entropy_with_logits(conf_logit, conf_target)
        loss = loss + s.conf_weight * bce
        stats["bce"] = float(bce.detach())
    with torch.no_grad():
        stats["top1"] = float((logq.argmax(-1) == d_idx[..., 0]).float().mean())
    return loss, stats


def _write_checkpoint(drafter, config, target_config_raw: dict, out_tmp: Path) -> None:
    from safetensors.torch import save_file

    state = {k: v.detach().to("cpu", torch.float32 if v.is_floating_point() else v.dtype).contiguous()
             for k, v in drafter.state_dict().items()}
    if not config.has_reduced_vocab:
        state.pop("d2t", None)
    save_file(state, str(out_tmp / "model.safetensors"), metadata={"format": "pt"})
    raw = deepseek_drafter_config(config, target_config_raw)
    atomic_write_text(out_tmp / "config.json", json.dumps(raw, indent=2, sort_keys=True) + "\n")


def _device(name: str) -> torch.device:
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise DSparkTrtError(f"--device {name}: not a torch device; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DSparkTrtError(f"--device {name}: no CUDA device here; use --device cpu (the CPU recipe) or run on a "
                             f"machine with a GPU")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise DSparkTrtError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                             f"cuda:0 … cuda:{torch.cuda.device_count() - 1}")
    return dev


def distill(target_dir: str | Path, out: str | Path, *, shape: DrafterShape = DrafterShape(),
            settings: DistillSettings = DistillSettings(), force: bool = False, progress: bool = True) -> Path:
    """Train a drafter for the target at ``target_dir`` into ``out`` (see the module docstring).

    Idempotent: a finished ``out`` with the same settings is returned as is; an interrupted run resumes.

    Example:
        >>> distill("pair/target", "pair/drafter", settings=DistillSettings(steps=400, seed=0))
    """
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM

    from ..config import hf_hidden_state_indices
    from ..hf import no_progress_bars
    from ..loader import read_target_config
    from ..runtime.decoder import load_tokenizer
    from .data import stack_rows
    from .store import target_identity
    from .validate import greedy_acceptance, plot_curve

    out, work = Path(out), work_dir(out)
    target_dir = Path(target_dir)
    if not (target_dir / "config.json").is_file():
        raise DSparkTrtError(f"--target {target_dir} is not a Hugging Face model directory (no config.json)")
    if settings.top_k < 0 or not 0 < settings.top_p <= 1 or not settings.temperature > 0:
        raise DSparkTrtError(f"sampling T {settings.temperature}, top-p {settings.top_p}, top-k {settings.top_k}: use "
                             f"T > 0, 0 < top-p <= 1, top-k >= 0 (0 = off); greedy rows come from --greedy-share")
    if not 0 <= settings.greedy_share <= 1:
        raise DSparkTrtError(f"--greedy-share {settings.greedy_share}: use a share in [0, 1]")
    dev = _device(settings.device)
    raw = read_target_config(target_dir)
    key = {"settings": {k: v for k, v in asdict(settings).items() if k not in RUN_ONLY},
           "shape": _shape_key(shape), "target": _digest(raw)}
    if settings.init_from:
        key["init"] = _weights_digest(Path(settings.init_from))
    done = out / RESULT
    if done.is_file() and not force:
        try:
            if json.loads(done.read_text()).get("key") == key:
                log.info("drafter already distilled in %s", out)
                return out
        except ValueError:
            pass
        raise DSparkTrtError(f"{out} holds a drafter distilled with other settings; pass --force to replace it")
    if out.exists() and any(out.iterdir()) and not force and not done.is_file():
        raise DSparkTrtError(f"output directory {out} is not empty; pass --force to replace it (or choose another)")
    store_root = Path(settings.data_dir) if settings.data_dir else default_data_dir(out)
    threads_before = torch.get_num_threads()
    if settings.threads:
        torch.set_num_threads(settings.threads)
    try:
        with no_progress_bars():
            target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32, local_files_only=True)
        target.eval().requires_grad_(False).to(dev)
        tokenizer = load_tokenizer(target_dir)
        V = int(raw["vocab_size"])
        mask_id = shape.mask_token_id if shape.mask_token_id is not None else _mask_token(tokenizer, V)
        shape = replace(shape, mask_token_id=mask_id)
        config = drafter_config(raw, shape)
        config.check_target_layers(int(raw["num_hidden_layers"]))
        init = _load_init(settings.init_from, target_dir, config) if settings.init_from else None
        torch.manual_seed(settings.seed)
        train_rows, val_rows, origin = _text(target, tokenizer, raw, settings, mask_id,
                                             hf_hidden_state_indices(config.target_layer_ids),
                                             target_identity(target_dir, raw), store_root)
        data = stack_rows(train_rows)  # CPU tensors, moved to the device below
        val = {k: v.to(dev) for k, v in stack_rows(val_rows).items()} if val_rows else None
        del train_rows, val_rows
        keep = tuple(_eos_ids(tokenizer, raw)) + (mask_id,)
        if init is None:
            draft_ids = _draft_vocab(data, V, shape.draft_vocab_size, keep)
        else:  # the init's draft vocabulary: its lm_head rows and Markov columns refer to it
            draft_ids = torch.arange(config.draft_vocab_size) + (init.d2t if config.has_reduced_vocab else 0)
        t2d = torch.full((V,), -1, dtype=torch.int64)
        t2d[draft_ids] = torch.arange(len(draft_ids))
        t2d = t2d.to(dev)
        data = {k: v.to(dev) for k, v in data.items()}
        drafter = init_drafter(config, target.cpu(), draft_ids, seed=settings.seed)
        del target
        if init is not None:
            missing, unexpected = drafter.load_state_dict(init.state_dict(), strict=False)
            if unexpected or any(not k.startswith("confidence_head.") for k in missing):
                raise DSparkTrtError(f"--init-from {settings.init_from}: tensors do not match the drafter to train "
                                     f"(missing {missing}, unexpected {unexpected})")
            del init  # a drafter without a confidence head starts with a fresh one
        drafter.to(dev)
        for n, p in drafter.named_parameters():
            p.requires_grad_(n not in FROZEN)
        params = [p for n, p in drafter.named_parameters() if n not in FROZEN]
        opt = torch.optim.AdamW(params, lr=settings.lr, weight_decay=0.0)
        step, total, history = 0, settings.steps, []
        curve, best = [], None  # validation points; (step, acceptance length, {name: trainable tensor on CPU})
        work.mkdir(parents=True, exist_ok=True)
        state_path = work / "state.pt"
        if state_path.is_file():
            st = torch.load(state_path, weights_only=False, map_location=dev)
            if st.get("key") == key:
                drafter.load_state_dict(st["drafter"])
                opt.load_state_dict(st["opt"])
                step, total, history = st["step"], st["total"], st["history"]
                curve, best = st.get("curve", []), st.get("best")
                log.info("resuming from step %d of %d (%s)", step, total, state_path)

        def checkpoint():
            _save({"key": key, "drafter": drafter.state_dict(), "opt": opt.state_dict(), "step": step,
                   "total": total, "history": history, "curve": curve, "best": best}, state_path)

        def validate():
            nonlocal best
            point = {"step": step, **greedy_acceptance(drafter, val, t2d, anchors=settings.val_anchors)}
            point["loss"] = (sum(h["loss"] for h in history[-20:]) / len(history[-20:])) if history else None
            curve.append(point)
            log.info("step %d: held-out greedy acceptance length %.3f (slots %s)", step, point["acceptance_length"],
                     point["slots"][:3])
            if best is None or point["acceptance_length"] > best[1]:
                best = (step, point["acceptance_length"],
                        {n: p.detach().to("cpu", copy=True) for n, p in drafter.named_parameters() if n not in FROZEN})

        validating = val is not None and settings.val_every > 0
        drafter.train()
        # the step count is fixed from the training time of steps 1 … 3: step 0 pays one-time costs (on a GPU the
        # first backward loads its kernels, the optimizer allocates its state), far more than a GPU step
        started = timed_from = None  # set after this process's first step
        last_ck = time.perf_counter()
        bar = tqdm(total=total, initial=step, desc="distil drafter", unit="step", mininterval=5, disable=not progress)
        while total is None or step < total:
            if validating and step % settings.val_every == 0 and not (curve and curve[-1]["step"] == step):
                t0 = time.perf_counter()
                validate()
                if started is not None:
                    started += time.perf_counter() - t0  # the step count is fixed from training time only
            if total is None and (settings.minutes is None or (started is not None and step >= timed_from + 3)):
                if settings.minutes is None:
                    total = 300
                else:
                    per_step = (time.perf_counter() - started) / (step - timed_from)
                    total = max(step + 1, int(settings.minutes * 60 / per_step))
                    log.info("%.2f s/step: %d steps fit in %.1f minutes", per_step, total, settings.minutes)
                bar.total = total
                bar.refresh()
                if step >= total:
                    break
            for g in opt.param_groups:
                g["lr"] = _lr(step, total or 10**9, settings)
            loss, stats = distill_step(drafter, data, t2d, step, settings)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            history.append({"step": step, "loss": float(loss.detach()), **stats})  # float(): the step has run
            step += 1
            if started is None:  # the clock starts after this process's first step (a resumed run's too)
                started, timed_from = time.perf_counter(), step
            bar.update(1)
            bar.set_postfix(loss=f"{history[-1]['loss']:.3f}", top1=f"{stats['top1']:.2f}", refresh=False)
            if time.perf_counter() - last_ck > settings.checkpoint_every_s and step < (total or 0):
                checkpoint()
                last_ck = time.perf_counter()
        bar.close()
        if validating and not (curve and curve[-1]["step"] == step):
            validate()
        drafter.eval().requires_grad_(False)
        if best is not None:
            with torch.no_grad():
                named = dict(drafter.named_parameters())
                for n, t in best[2].items():
                    named[n].copy_(t)
        origin["store"] = os.path.relpath(origin["store"], os.path.abspath(out))  # portable: from the drafter
        with atomic_output_dir(out, force=True) as tmp:
            _write_checkpoint(drafter, config, raw, tmp)
            head, tail = history[: min(20, len(history))], history[-min(20, len(history)):]
            summary = {
                "key": key, "steps": step, "tokens": origin["tokens"], "sequences": origin["sequences"],
                "loss_first": sum(h["loss"] for h in head) / max(1, len(head)),
                "loss_last": sum(h["loss"] for h in tail) / max(1, len(tail)),
                "top1_last": sum(h["top1"] for h in tail) / max(1, len(tail)),
                "prompts_digest": origin.pop("prompts_digest"),
                "data": origin,
                "validation": ({"every": settings.val_every, "anchors": settings.val_anchors,
                                "sequences": origin["validation_sequences"], "best_step": best[0],
                                "best_acceptance_length": best[1], "curve": curve} if best is not None else None),
                "history": history,
            }
            atomic_write_text(tmp / RESULT, json.dumps(summary) + "\n")
            if best is not None:
                plot_curve(curve, tmp / CURVE_PNG, best_step=best[0])
        shutil.rmtree(work, ignore_errors=True)
        return out
    finally:
        torch.set_num_threads(threads_before)


def write_initial_drafter(target_dir: str | Path, out: str | Path, *, shape: DrafterShape = DrafterShape(),
                          seed: int = 0, force: bool = False) -> Path:
    """An untrained drafter with the right shapes for the target at ``target_dir`` (``init_drafter``: shared
    embeddings/head and the last layer copied from the target), written as a DeepSeek checkpoint. For tests and
    exports that need a real target's shapes, not a good drafter."""
    from transformers import AutoModelForCausalLM

    from ..hf import no_progress_bars
    from ..loader import read_target_config
    from ..runtime.decoder import load_tokenizer

    raw = read_target_config(target_dir)
    V = int(raw["vocab_size"])
    if shape.mask_token_id is None:
        shape = replace(shape, mask_token_id=_mask_token(load_tokenizer(target_dir), V))
    config = drafter_config(raw, shape)
    with no_progress_bars():
        target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32, local_files_only=True).eval()
    draft_ids = torch.arange(config.draft_vocab_size)  # the first V_d ids (a real run keeps the frequent ones)
    drafter = init_drafter(config, target, draft_ids, seed=seed)
    with torch.no_grad():  # a random Markov head, so that the walk's bias is exercised
        gen = torch.Generator().manual_seed(seed + 1)
        w2 = drafter.markov_head.markov_w2.weight
        w2.copy_(0.5 * torch.randn(w2.shape, generator=gen))
    with atomic_output_dir(out, force=force) as tmp:
        _write_checkpoint(drafter, config, raw, tmp)
    return Path(out)
