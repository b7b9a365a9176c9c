"""``dspark bench report PAIR``: the SmolLM2 benchmark matrix, JSON + PNG plots + the tables of docs/benchmarks.md.

    dspark bench report out/smollm2 --export out/smollm2-export -o docs/benchmarks

On the held-out prompts of ``PAIR/prompts.json`` (never trained on), in one run on this machine:

- end to end, speculative vs target-only tokens/s, for greedy and T = 1, batch 1 and 4, on the torch path
  (transformers target + torch drafter) and, with ``--export``, on the export path (ONNX target + ONNX
  drafter in onnxruntime), with the acceptance length, per-slot acceptance and the time split;
- a top-k sweep (greedy, batch 1, torch path): k ∈ {32, 64, …, 1024, dense} → acceptance length, per-slot
  acceptance, tokens/s, and the probability mass the top-k head drops (``topk_mass``);
- verifying fewer drafts (greedy, batch 1, both paths): ``verify_drafts`` L ∈ {1, 2, 3, all, auto} → speed-up
  and acceptance length (identical output);
- the same verify lengths on prompts the drafter **trained on** (its ``distill.json`` names them; their greedy
  continuations are its training text): an upper bound for this drafter, not a held-out result — what the
  runtime delivers where the acceptance length is high (``seen``);
- the verification cost (torch path, batch 1): one verify of n = 1 … N + 1 tokens against a target-only step,
  and the acceptance length that breaks even / reaches 1.5× on this machine (``verify_cost``).

Writes ``OUT/benchmarks.json``, ``OUT/*.png`` and ``OUT/tables.md`` (the Markdown tables quoted in
docs/benchmarks.md). Ratios matter, not absolute figures: the machines are shared.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from ..topk import DEFAULT_TOPK

log = logging.getLogger("dspark")

SWEEP = (32, 64, 128, 256, 512, 1024, None)  # None = dense
PARTS = {"matrix", "sweep", "verify", "seen", "export", "cost"}  # what --skip can leave out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("pair", metavar="PAIR", help="directory with drafter/, target/ and prompts.json (dspark smollm2)")
    p.add_argument("--export", metavar="OUT", default=None, help="dspark-export directory of the pair (export path)")
    p.add_argument("-o", "--out", default="docs/benchmarks", help="output directory (JSON, PNGs, tables.md)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--prompts", type=int, default=None, help="use N of the held-out prompts, spread over the list")
    p.add_argument("--threads", type=int, default=None, help="torch / onnxruntime CPU threads")
    p.add_argument("--sweep", default=",".join(str(k) if k else "dense" for k in SWEEP),
                   help="top-k values of the sweep (comma-separated; 'dense' = no top-k)")
    p.add_argument("--temperatures", default="0,1", help="matrix temperatures (comma-separated)")
    p.add_argument("--batches", default="1,4", help="matrix batch sizes (comma-separated)")
    p.add_argument("--verify-sweep", default="1,2,3,all,auto", metavar="L,…",
                   help="drafts verified per round to compare (greedy, batch 1, each path; 'all' = N, 'auto' = "
                        "chosen each round: runtime/verify_policy.py)")
    p.add_argument("--skip", default="", help=f"comma-separated parts to skip: {', '.join(sorted(PARTS))}")


def _run_modes(decoder, prompts, *, batch: int, temperature: float, max_new: int, topk=DEFAULT_TOPK, both=True,
               verify_drafts=None) -> dict:
    """Speculative (and target-only, batch by batch: ``paired_runs``) over all prompts in batches of ``batch``."""
    from .e2e import paired_runs

    opts = dict(max_new_tokens=max_new, temperature=temperature, topk=topk)
    if verify_drafts is not None:
        opts["verify_drafts"] = verify_drafts
    decoder.generate(prompts[:batch], **{**opts, "max_new_tokens": 4, "seed": list(range(batch))})  # warm-up
    spec, base = paired_runs(decoder, [prompts[i: i + batch] for i in range(0, len(prompts), batch)], opts, both=both)
    return {"speculative": spec, **({"target_only": base} if both else {})}


def _row(res: dict) -> dict:
    s = res["speculative"].stats
    row = {"speculative_tokens_per_second": s.tokens_per_second,
           "mean_acceptance_length": s.mean_acceptance_length,
           "per_position_acceptance": s.per_position_acceptance,
           "time_split": {k: getattr(s, f"{k}_seconds") / s.total_seconds for k in ("prefill", "draft", "verify", "other")}
           if s.total_seconds else {},
           "seconds_per_round": {k: getattr(s, f"{k}_seconds") / s.rounds for k in ("draft", "verify", "other")}
           if s.rounds else {}}
    if "target_only" in res:
        b = res["target_only"].stats
        row.update(target_only_tokens_per_second=b.tokens_per_second,
                   speedup=s.tokens_per_second / b.tokens_per_second if b.tokens_per_second else None,
                   same_tokens=res["speculative"].tokens == res["target_only"].tokens,
                   target_only_time_split={k: getattr(b, f"{k}_seconds") / b.total_seconds
                                           for k in ("prefill", "verify", "other")} if b.total_seconds else {})
    return row


def run(args: argparse.Namespace) -> int:
    import torch

    from ..threads import set_cpu_threads
    from ..errors import DSparkTrtError
    from ..runtime import SpeculativeDecoder
    from .heldout import read_heldout

    pair = Path(args.pair)
    prompts = read_heldout(pair)
    if not prompts or not (pair / "drafter" / "config.json").is_file():
        raise DSparkTrtError(f"{pair} needs drafter/, target/ and prompts.json: build it with "
                             f"'dspark smollm2 {pair} --train-drafter'")
    if args.prompts and args.prompts < len(prompts):  # spread over the list (chat turns, then prose and code)
        prompts = [prompts[round(i * (len(prompts) - 1) / max(1, args.prompts - 1))] for i in range(args.prompts)]
    prompts = prompts[: max(4, len(prompts) - len(prompts) % 4)]
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if skip - PARTS:
        raise DSparkTrtError(f"--skip {args.skip!r}: unknown part(s) {', '.join(sorted(skip - PARTS))}; the parts are "
                             f"{', '.join(sorted(PARTS))}")
    temperatures = _values(args.temperatures, "--temperatures", cast=float)  # checked before any model loads
    batches = _values(args.batches, "--batches")
    verify_caps = _values(args.verify_sweep, "--verify-sweep", ("all", "auto"))
    ks = [None if k in ("dense", "off") else k for k in _values(args.sweep, "--sweep", ("dense", "off"))]  # dense
    if args.threads:
        set_cpu_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"pair": portable_path(pair), "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
              "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "matrix": [], "sweep": [], "verify_sweep": [], "seen": [], "verify_cost": {}}
    torch_dec = SpeculativeDecoder.from_pretrained(pair / "drafter", pair / "target", device="cpu")
    report["num_draft_tokens"] = torch_dec.config.num_draft_tokens
    paths = {"torch": torch_dec}
    if args.export and "export" not in skip:
        opts = {"threads": args.threads} if args.threads else {}
        paths["export"] = SpeculativeDecoder.from_export(args.export, backend="onnxruntime", device="cpu", **opts)
        report["export_topk"] = paths["export"].default_topk
    if "matrix" not in skip:
        for path, dec in paths.items():
            for temperature in temperatures:
                for batch in batches:
                    log.info("matrix: %s path, T=%g, batch %d", path, temperature, batch)
                    row = _row(_run_modes(dec, prompts, batch=batch, temperature=temperature, max_new=args.max_new_tokens))
                    report["matrix"].append({"path": path, "temperature": temperature, "batch": batch, **row})
                    _save(report, out)
    N = report["num_draft_tokens"]
    caps = sorted({N if c == "all" else min(c, N) for c in verify_caps if c != "auto"}) + (
        ["auto"] if "auto" in verify_caps else [])
    seen = None if "seen" in skip else _seen_prompts(pair, len(prompts))
    for part, part_prompts in (("verify_sweep", None if "verify" in skip else prompts), ("seen", seen)):
        for path, dec in paths.items() if part_prompts else ():
            for cap in caps:
                log.info("%s: %s path, %s of %d drafts verified", part, path, cap, N)
                row = _row(_run_modes(dec, part_prompts, batch=1, temperature=0.0, max_new=args.max_new_tokens,
                                      verify_drafts=cap))
                report[part].append({"path": path, "verify_drafts": cap, **row})
                _save(report, out)
    if "sweep" not in skip:
        greedy_tokens = None
        for k in ks:
            log.info("sweep: top-k %s", k or "dense")
            res = _run_modes(torch_dec, prompts, batch=1, temperature=0.0, max_new=args.max_new_tokens, topk=k, both=False)
            if greedy_tokens is None:
                greedy_tokens = res["speculative"].tokens
            report["sweep"].append({"topk": k or None, **_row(res),
                                    "same_tokens_as_first": res["speculative"].tokens == greedy_tokens})
            _save(report, out)
        from .topk_mass import topk_dropped_mass

        seqs = [p + t for p, t in zip(prompts, greedy_tokens)]
        V_d = torch_dec.config.draft_vocab_size
        mass = topk_dropped_mass(torch_dec.backend.drafter if hasattr(torch_dec.backend, "drafter") else _reference(pair),
                                 torch_dec.target.model, seqs, [k or V_d for k in ks], starts=[len(p) for p in prompts])
        for row, k in zip(report["sweep"], ks):
            row["dropped_mass"] = mass[k or V_d]
        _save(report, out)
    if "cost" not in skip:
        from .verify_cost import verify_cost

        log.info("verify cost: 1 … %d tokens", report["num_draft_tokens"] + 1)
        cost = verify_cost(torch_dec.target, prompts[0], range(1, report["num_draft_tokens"] + 2))
        report["verify_cost"] = {str(n): sec for n, sec in cost.items()}  # JSON keys: tokens verified
        _save(report, out)
    plot(report, out)
    (out / "tables.md").write_text(tables(report))
    print(tables(report))
    return 0


def _values(text: str, option: str, words: tuple[str, ...] = (), cast=int) -> list:
    """The comma-separated values of ``option``: numbers > 0 (≥ 0 for floats) or one of ``words`` (kept as
    lower-case strings); a one-line error otherwise."""
    from ..errors import DSparkTrtError

    out = []
    for item in (t.strip().lower() for t in text.split(",") if t.strip()):
        if item in words:
            out.append(item)
            continue
        try:
            value = cast(item)
        except ValueError:
            names = ", ".join(["numbers", *words])
            raise DSparkTrtError(f"{option} {text!r}: {item!r} is not a value ({names}, comma-separated)") from None
        if value < 0 or (cast is int and value == 0):
            raise DSparkTrtError(f"{option} {text!r}: {item!r} must be > 0")
        out.append(value)
    if not out:
        raise DSparkTrtError(f"{option} is empty; give comma-separated values")
    return out


def _seen_prompts(pair: Path, n: int) -> list[list[int]] | None:
    """``n`` of the prompts the pair's drafter trained on, spread over its list (None: not a distilled drafter)."""
    from ..training.distill import trained_prompts

    seen = trained_prompts(pair / "drafter", pair / "target")
    if not seen:
        log.info("seen: %s/drafter has no distill.json, so its training prompts are unknown; part skipped", pair)
        return None
    return [seen[round(i * (len(seen) - 1) / max(1, n - 1))] for i in range(min(n, len(seen)))]


def _reference(pair: Path):
    from ..loader import load_drafter

    return load_drafter(pair / "drafter", target_dir=pair / "target")


def portable_path(path: str | Path) -> str:
    """A path as it reads on another machine, for the report: as given when relative, else relative to the working
    directory, else ``~/…`` under the home directory, else ``…/NAME`` (never a machine's absolute path)."""
    p = Path(path)
    if not p.is_absolute():
        return p.as_posix()
    resolved = p.resolve()
    for base, prefix in ((Path.cwd().resolve(), ""), (Path.home().resolve(), "~/")):
        try:
            return prefix + resolved.relative_to(base).as_posix()
        except ValueError:
            continue
    return f".../{p.name}"


def _save(report: dict, out: Path) -> None:
    from ..atomic import atomic_write_text

    atomic_write_text(out / "benchmarks.json", json.dumps(report, indent=1) + "\n")


def tables(r: dict) -> str:
    lines = [f"Measured {r['date']}, {r['prompts']} held-out prompts × {r['max_new_tokens']} new tokens, "
             f"N = {r.get('num_draft_tokens')}, {r['threads']} torch thread(s).", ""]
    if r["matrix"]:
        lines += ["| path | T | batch | speculative tok/s | target-only tok/s | speed-up | acceptance length | "
                  "identical (greedy) | time split draft / verify / other |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for m in r["matrix"]:
            ts = m["time_split"]
            same = ("yes" if m.get("same_tokens") else "**no**") if m["temperature"] == 0 else "n/a (T = 1)"
            lines.append(f"| {m['path']} | {m['temperature']:g} | {m['batch']} | {m['speculative_tokens_per_second']:.1f} | "
                         f"{m['target_only_tokens_per_second']:.1f} | {m['speedup']:.2f}× | "
                         f"{m['mean_acceptance_length']:.2f} | {same} | "
                         f"{ts.get('draft', 0):.0%} / {ts.get('verify', 0):.0%} / "
                         f"{ts.get('other', 0) + ts.get('prefill', 0):.0%} |")
        lines.append("")
    if r["sweep"]:
        lines += ["| top-k | acceptance length | per-slot acceptance | dropped mass (mean / p99) | tok/s |",
                  "|---|---|---|---|---|"]
        for s in r["sweep"]:
            dm = s.get("dropped_mass", {})
            lines.append(f"| {s['topk'] or 'dense'} | {s['mean_acceptance_length']:.3f} | "
                         f"{' '.join(f'{a:.2f}' for a in s['per_position_acceptance'])} | "
                         f"{dm.get('mean', float('nan')):.2e} / {dm.get('p99', float('nan')):.2e} | "
                         f"{s['speculative_tokens_per_second']:.1f} |")
        lines.append("")
    for part in ("verify_sweep", "seen"):
        if not r.get(part):
            continue
        if part == "seen":
            lines += ["On prompts the drafter **trained on** (as many as the held-out ones, spread over its training "
                      "prompts; their greedy continuations are its training text — an upper bound for this drafter, "
                      "not a held-out result):", ""]
        lines += ["| path | drafts verified per round | speculative tok/s | target-only tok/s | speed-up | "
                  "acceptance length | identical |", "|---|---|---|---|---|---|---|"]
        for v in r[part]:
            lines.append(f"| {v['path']} | {v['verify_drafts']} | {v['speculative_tokens_per_second']:.1f} | "
                         f"{v['target_only_tokens_per_second']:.1f} | {v['speedup']:.2f}× | "
                         f"{v['mean_acceptance_length']:.2f} | {'yes' if v['same_tokens'] else '**no**'} |")
        lines.append("")
    if r.get("verify_cost"):
        lines += _cost_table(r)
    return "\n".join(lines)


def _torch_greedy_batch1(r: dict) -> list[dict]:
    """The matrix row of the torch path, T = 0, batch 1 (empty without a matrix)."""
    return [m for m in r["matrix"] if m["path"] == "torch" and m["temperature"] == 0 and m["batch"] == 1]


def _verify_cost(r: dict) -> dict[int, float]:
    """{tokens verified: seconds} (JSON keeps the keys as strings)."""
    return {int(n): sec for n, sec in r["verify_cost"].items()}


def _cost_table(r: dict) -> list[str]:
    from .verify_cost import needed_acceptance

    cost = _verify_cost(r)
    base = _torch_greedy_batch1(r)
    per_round = base[0].get("seconds_per_round", {}) if base else {}
    extra = per_round.get("draft", 0.0) + per_round.get("other", 0.0)  # drafting and bookkeeping per round
    lines = [f"Verification cost (torch path, batch 1; a round also spends {1000 * extra:.1f} ms drafting and on "
             f"bookkeeping{' (torch T = 0, batch 1 above)' if base else ' (not measured: no matrix)'}):", "",
             "| tokens verified | ms | × one target step | acceptance length for 1× | for 1.5× |", "|---|---|---|---|---|"]
    for n, sec in cost.items():
        lines.append(f"| {n} | {1000 * sec:.1f} | {sec / cost[1]:.2f} | "
                     + (f"{needed_acceptance(cost, n, extra):.2f} | {needed_acceptance(cost, n, extra, 1.5):.2f} |"
                        if n > 1 else "— | — |"))
    lines.append("")
    return lines


def plot(r: dict, out: Path) -> list[Path]:
    """acceptance vs k, tokens/s vs k, per-position acceptance, speed-ups of the matrix (PNG)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from ..optional import pip_install

        log.warning("matplotlib missing (%s): no plots", pip_install("bench"))
        return []
    files = []
    sweep = r["sweep"]
    if sweep:
        labels = [str(s["topk"] or "dense") for s in sweep]
        x = range(len(sweep))
        fig, ax = plt.subplots(figsize=(6.4, 4))
        ax.plot(x, [s["mean_acceptance_length"] for s in sweep], "o-", label="acceptance length (tokens/round)")
        ax.set_xticks(list(x), labels)
        ax.set_xlabel("top-k candidates per draft slot")
        ax.set_ylabel("mean acceptance length")
        ax2 = ax.twinx()
        ax2.semilogy(x, [max(s.get("dropped_mass", {}).get("mean", 0), 1e-12) for s in sweep], "s--", color="tab:red",
                     label="probability mass dropped by top-k (mean)")
        ax2.set_ylabel("dropped mass (log)")
        fig.legend(loc="lower right", fontsize=8)
        ax.set_title(f"SmolLM2-135M drafter: acceptance vs top-k (greedy, batch 1, N = {r.get('num_draft_tokens')})")
        files.append(_savefig(fig, out / "acceptance_vs_topk.png"))
        fig, ax = plt.subplots(figsize=(6.4, 4))
        ax.plot(x, [s["speculative_tokens_per_second"] for s in sweep], "o-", label="speculative")
        base = _torch_greedy_batch1(r)
        if base:
            ax.axhline(base[0]["target_only_tokens_per_second"], color="gray", ls="--", label="target only")
        ax.set_xticks(list(x), labels)
        ax.set_xlabel("top-k candidates per draft slot")
        ax.set_ylabel("tokens / s (CPU, shared machine)")
        ax.set_ylim(bottom=0)
        ax.legend()
        ax.set_title("tokens/s vs top-k (greedy, batch 1, torch path)")
        files.append(_savefig(fig, out / "tokens_per_second_vs_topk.png"))
    rows = [(f"{m['path']} T={m['temperature']:g} B={m['batch']}", m["per_position_acceptance"]) for m in r["matrix"]]
    rows += [(f"sweep k={s['topk'] or 'dense'}", s["per_position_acceptance"]) for s in sweep
             if s["topk"] in (None, 512, 32)]
    if rows:
        fig, ax = plt.subplots(figsize=(6.4, 4))
        for name, acc in rows:
            ax.plot(range(1, len(acc) + 1), acc, "o-", label=name)
        ax.set_xlabel("draft slot j")
        ax.set_ylabel("fraction of rounds with slot j accepted")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7)
        ax.set_title("per-position acceptance (held-out prompts)")
        files.append(_savefig(fig, out / "per_position_acceptance.png"))
    if r.get("verify_cost"):
        cost = _verify_cost(r)
        fig, ax = plt.subplots(figsize=(6.4, 4))
        ax.plot(list(cost), [sec / cost[1] for sec in cost.values()], "o-", label="measured")
        ax.plot(list(cost), list(cost), ":", color="gray", label="proportional to tokens")
        ax.set_xlabel("tokens verified in one target forward (batch 1)")
        ax.set_ylabel("cost / one target-only step")
        ax.set_ylim(bottom=0)
        ax.legend()
        ax.set_title("what a verification round costs on this machine")
        files.append(_savefig(fig, out / "verify_cost.png"))
    points = [(part, v) for part in ("verify_sweep", "seen") for v in r.get(part, [])]
    if points:
        fig, ax = plt.subplots(figsize=(6.4, 4))
        for (part, path), marker in zip([(p, q) for p in ("verify_sweep", "seen") for q in ("torch", "export")],
                                        ("o", "s", "^", "D")):
            vs = [v for pt, v in points if pt == part and v["path"] == path]
            if vs:
                ax.plot([v["mean_acceptance_length"] for v in vs], [v["speedup"] for v in vs], marker, ls="",
                        label=f"{path}, {'held-out' if part == 'verify_sweep' else 'trained-on'} prompts")
                for v in vs:
                    ax.annotate(f"L={v['verify_drafts']}", (v["mean_acceptance_length"], v["speedup"]), fontsize=6,
                                xytext=(3, 3), textcoords="offset points")
        ax.axhline(1.0, color="gray", ls="--")
        ax.axhline(1.5, color="tab:green", ls=":", label="goal 1.5×")
        ax.set_xlabel("acceptance length (tokens per verification round)")
        ax.set_ylabel("speculative / target-only tokens/s")
        ax.legend(fontsize=7)
        ax.set_title("speed-up vs acceptance length (greedy, batch 1; L = drafts verified)")
        files.append(_savefig(fig, out / "speedup_vs_acceptance.png"))
    if r["matrix"]:
        fig, ax = plt.subplots(figsize=(6.4, 4))
        names = [f"{m['path']}\nT={m['temperature']:g} B={m['batch']}" for m in r["matrix"]]
        ax.bar(range(len(names)), [m["speedup"] for m in r["matrix"]])
        ax.axhline(1.0, color="gray", ls="--")
        ax.axhline(1.5, color="tab:green", ls=":", label="goal 1.5× (greedy, batch 1)")
        ax.set_xticks(range(len(names)), names, fontsize=7)
        ax.set_ylabel("speculative / target-only tokens/s")
        ax.legend()
        ax.set_title("speed-up, measured in one run")
        files.append(_savefig(fig, out / "speedup.png"))
    return files


def _savefig(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
