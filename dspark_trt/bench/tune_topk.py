"""Tune the drafter's top-k and candidate-union width on real prompts: acceptance vs draft cost.

For every (k, M) of a grid it decodes the prompts with the pair (greedy by default), reading from the run's
statistics the **acceptance length** L (tokens emitted per request-round, accepted drafts + 1) and the
**draft-round time** t_d per request-round on this host; the verify time t_v per request-round does not
depend on (k, M) and is taken as the median over the sweep. Tokens/s is modelled as

    tokens/s(k, M) = L(k, M) / (t_d(k, M) + t_v)

and the recommendation is the (k, M) with the largest modelled tokens/s (so it is the sweep's best by
construction; the measured end-to-end tokens/s of each run is reported beside it). ``write_default``
records the choice as the drafter's defaults (``draft_topk``, ``draft_markov_topm`` in its config.json),
which ``dspark generate`` and ``dspark-export`` use when no ``--topk`` / ``--markov-topm`` is given.

The candidate union is defined for the vanilla Markov head only: for a gated or RNN drafter the sweep is over k
alone (M = 0; ``union_widths``), and a union width asked for explicitly is refused with the reason.
"""

from __future__ import annotations

import json
import logging
import statistics
from pathlib import Path

from ..errors import DSparkTrtError

__all__ = ["DEFAULT_TOPKS", "DEFAULT_TOPMS", "load_prompts", "union_widths", "sweep", "recommend", "format_table",
           "plot_sweep", "write_default"]

log = logging.getLogger("dspark.bench")

DEFAULT_TOPKS = (1, 2, 4, 8, 16, 64, 256)
DEFAULT_TOPMS = (0, 2, 8, 32)


def load_prompts(path: str | Path) -> list:
    """Prompts from a file: JSON (a list of strings / id lists, or ``{"heldout": [{"text"|"input_ids"}]}`` as
    ``dspark smollm2`` writes), else one text prompt per non-empty line."""
    p = Path(path)
    if not p.is_file():
        raise DSparkTrtError(f"--prompts {path}: no such file (JSON list of prompts, or one prompt per line)")
    text = p.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        prompts = [line for line in text.splitlines() if line.strip()]
    else:
        items = data.get("heldout", data.get("prompts")) if isinstance(data, dict) else data
        if not isinstance(items, list):
            raise DSparkTrtError(f"--prompts {path}: JSON must be a list of prompts or {{\"heldout\": [...]}}")
        prompts = [it.get("input_ids", it.get("text")) if isinstance(it, dict) else it for it in items]
    prompts = [q for q in prompts if q]
    if not prompts:
        raise DSparkTrtError(f"--prompts {path} holds no prompts")
    return prompts


def _union_refusal(head: str, topms) -> str:
    return (f"--markov-topm {','.join(map(str, topms))}: the candidate union is defined for the vanilla Markov head "
            f"only, and this drafter's is {head} (its bias depends on the context, so no static table can rank it); "
            f"use --markov-topm 0")


def union_widths(markov_head_type: str, requested=None) -> tuple[int, ...]:
    """The union widths M to sweep: ``requested`` (None: ``DEFAULT_TOPMS``) for a vanilla head; for a gated or RNN
    head (0,) when none was requested (logged), and a one-line error for a requested M > 0."""
    if markov_head_type == "vanilla":
        return tuple(DEFAULT_TOPMS if requested is None else requested)
    if requested is None:
        log.info("%s Markov head: sweeping top-k alone (the candidate union is defined for the vanilla head only)",
                 markov_head_type)
        return (0,)
    if any(requested):
        raise DSparkTrtError(_union_refusal(markov_head_type, requested))
    return tuple(requested)


def sweep(decoder, prompts: list, topks, topms, *, max_new_tokens: int = 64, temperature: float = 0.0,
          seed: int = 0) -> list[dict]:
    """One row per (k, M): acceptance length, draft/verify ms per request-round, modelled and measured tok/s.
    A gated or RNN drafter takes M = 0 only (``union_widths``)."""
    vd = decoder.config.draft_vocab_size
    head = getattr(decoder.config, "markov_head_type", "vanilla")
    if head != "vanilla" and any(topms):
        raise DSparkTrtError(_union_refusal(head, topms))
    bad = [k for k in topks if not 1 <= k <= vd] + [m for m in topms if not 0 <= m <= vd]
    if bad:
        raise DSparkTrtError(f"--topk / --markov-topm values {bad} must be in [1, {vd}] / [0, {vd}]")
    if any(topms) and not getattr(decoder.backend, "supports_markov_topm", False):
        raise DSparkTrtError(f"the {decoder.backend.name} backend has no candidate union; tune with --backend torch "
                             f"or --markov-topm 0")
    seeds = [seed + i for i in range(len(prompts))]
    rows = []
    for k in topks:
        for m in topms:
            opts = dict(temperature=temperature, seed=seeds, topk=k, markov_topm=m)
            decoder.generate(prompts[:1], 4, **{**opts, "seed": seeds[:1]})  # warm-up: kernels, the union table
            s = decoder.generate(prompts, max_new_tokens, **opts).stats
            rows.append({"topk": k, "markov_topm": m, "acceptance_length": round(s.mean_acceptance_length, 4),
                         "draft_ms": 1e3 * s.draft_seconds / max(s.rounds, 1),
                         "verify_ms": 1e3 * s.verify_seconds / max(s.rounds, 1),
                         "measured_tokens_per_second": round(s.tokens_per_second, 2)})
            log.info("k=%d M=%d: acceptance length %.3f, draft %.3f ms/round", k, m, s.mean_acceptance_length,
                     rows[-1]["draft_ms"])
    t_v = statistics.median(r["verify_ms"] for r in rows)
    for r in rows:
        r["modelled_tokens_per_second"] = round(1e3 * r["acceptance_length"] / (r["draft_ms"] + t_v), 2)
        r["draft_ms"], r["verify_ms"] = round(r["draft_ms"], 4), round(r["verify_ms"], 4)
        r["verify_ms_model"] = round(t_v, 4)
    return rows


def recommend(rows: list[dict]) -> dict:
    """The row with the largest modelled tokens/s (the smaller k + M on a tie)."""
    return max(rows, key=lambda r: (r["modelled_tokens_per_second"], -(r["topk"] + r["markov_topm"])))


def format_table(rows: list[dict], best: dict | None = None) -> str:
    cols = ["topk", "markov_topm", "acceptance_length", "draft_ms", "verify_ms", "modelled_tokens_per_second",
            "measured_tokens_per_second"]
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in cols]
    lines = ["  ".join(c.rjust(w) for c, w in zip(cols, widths))]
    for r in rows:
        mark = "  <- recommended" if r is best else ""
        lines.append("  ".join(str(r[c]).rjust(w) for c, w in zip(cols, widths)) + mark)
    return "\n".join(lines)


def plot_sweep(rows: list[dict], path: str | Path) -> None:
    """Acceptance length and modelled tokens/s vs k, one line per M (PNG, written atomically)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from ..optional import pip_install

        raise DSparkTrtError(f"--plot needs matplotlib: {pip_install('bench')}") from None
    import io

    from ..atomic import atomic_write_bytes

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for m in sorted({r["markov_topm"] for r in rows}):
        rs = sorted((r for r in rows if r["markov_topm"] == m), key=lambda r: r["topk"])
        label = "top-k only" if m == 0 else f"union, M={m}"
        ax1.plot([r["topk"] for r in rs], [r["acceptance_length"] for r in rs], marker="o", label=label)
        ax2.plot([r["topk"] for r in rs], [r["modelled_tokens_per_second"] for r in rs], marker="o", label=label)
    best = recommend(rows)
    ax2.scatter([best["topk"]], [best["modelled_tokens_per_second"]], s=160, facecolors="none", edgecolors="red",
                label="recommended")
    for ax, ylabel in ((ax1, "acceptance length (tokens / round)"), (ax2, "modelled tokens/s")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("top-k candidates per slot")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("dspark tune-topk")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def write_default(drafter_dir: str | Path, best: dict) -> Path:
    """Record ``draft_topk`` / ``draft_markov_topm`` in the drafter's config.json (atomically; every other key
    kept, the previous values saved under ``dspark_tune_topk.previous``)."""
    from ..atomic import atomic_write_text

    path = Path(drafter_dir) / "config.json"
    if not path.is_file():
        raise DSparkTrtError(f"--write: {path} not found; --write needs a drafter directory with its config.json")
    cfg = json.loads(path.read_text(encoding="utf-8"))
    previous = {key: cfg.get(key) for key in ("draft_topk", "draft_markov_topm")}
    cfg["draft_topk"], cfg["draft_markov_topm"] = int(best["topk"]), int(best["markov_topm"])
    cfg["dspark_tune_topk"] = {"previous": previous, "modelled_tokens_per_second": best["modelled_tokens_per_second"],
                               "acceptance_length": best["acceptance_length"]}
    atomic_write_text(path, json.dumps(cfg, indent=2) + "\n")
    return path
