"""``dspark bench context``: what a long context costs, the exported target next to transformers, in one run.

    dspark bench context --export OUT
    dspark bench context --export OUT --contexts 128,512,1024,2048,4096,8192 -o docs/benchmarks --threads 2

At each context length S (default 128, 512, 1k, 2k, 4k, 8k) one prompt of S tokens: a filler of unrelated
prompt-bank text, then the same final request (the pair's first held-out prompt, or ``--prompt``), so every
S asks the same question after more context. Two targets — the exported one in onnxruntime
(``OnnxRuntimeTarget``) and the transformers model it was exported from, eager (``HFTarget``) — each hold one
prefilled copy per S (``OnnxRuntimeTarget.fork``: one graph session), then:

- **per-step cost**: the seconds of a one-token target step (``verify`` of 1 token without taps, what
  target-only decoding runs) and of a verify of N + 1 tokens with taps (a speculative round), each rolled
  back; sizes, lengths and targets take turns, repeat after repeat (median), so the machine's drift falls on
  all of them alike;
- **end to end**: speculative and target-only tokens/s for both paths (the export's drafter in both), the
  two modes back to back per prompt, their order alternating (``bench/e2e.py: paired_runs``); *decode*
  tokens/s leave the prefill out (it is the same work with and without speculation), *total* keeps it;
- **memory per request**: the bytes of each target's K/V cache at S, the drafter's context K/V, and the
  process's peak resident memory;
- **draft round** (``draft_round_costs``): the seconds of one draft round of the export's drafter
  (onnxruntime) at every S, batch 1 and 4 (``--draft-batches``), reading a ``DrafterState`` of S context rows
  in place (its capacity bucket); with ``--draft-before DIR`` (the ``onnx/`` directory of an export made
  before the in-place drafter cache, whose ``draft.onnx`` takes one stacked ``ctx_k [L, B, T, H_kv, D]``) the
  same rounds as that runtime ran them — the used prefix of a ``[L, B, capacity, H_kv, D]`` buffer, sliced —
  take turns with them, so the ratio S = 4096 / S = 128 is read before and after in one run; with
  ``--draft-padded`` the drafter checkpoint the export came from (the manifest's ``checkpoint.path``) runs the
  torch backend's padded CUDA-graph path without capture (``graphs="eager"``, the round a GPU host replays)
  over the ``DrafterState`` the runtime keeps for it, its context bound by address (*padded, bound*) and
  copied into the bucket's buffers every round as before (*padded, copied*). ``--skip
  steps,e2e,transformers`` with a drafter-only export directory (no target graph) times only the rounds.

Writes ``OUT/context.json``, ``OUT/context.png`` and ``OUT/context.md`` (the table for docs/benchmarks.md)
with ``-o OUT``; prints the table. The goals of the long-context work are evaluated as ratios of this run
(``goals``): reported, never asserted. The export's ``max_context`` must hold S + the new tokens (export
with ``--max-context 16384`` for S = 8k).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path

from ..process_memory import peak_rss_bytes

log = logging.getLogger("dspark")

CONTEXTS = (128, 512, 1024, 2048, 4096, 8192)
PATHS = ("exported", "transformers")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--export", metavar="OUT", required=True, help="dspark-export directory with a target")
    p.add_argument("--contexts", default=",".join(map(str, CONTEXTS)), metavar="S,…",
                   help="context lengths (prompt tokens), comma-separated")
    p.add_argument("--prompt", default=None, help="the final request after the filler (default: the pair's first "
                                                  "held-out prompt, else a fixed sentence)")
    p.add_argument("--repeats", type=int, default=5, help="timed one-token / verify steps per (S, target), median")
    p.add_argument("--e2e-repeats", type=int, default=1, help="end-to-end runs per (S, path, mode), median")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=None, help="torch / onnxruntime CPU threads")
    p.add_argument("--skip", default="", help="comma-separated parts to skip: steps, e2e, transformers, draft")
    p.add_argument("--draft-batches", default="1,4", metavar="B,…", help="batch sizes of the timed draft rounds")
    p.add_argument("--draft-before", default=None, metavar="DIR",
                   help="onnx/ directory of an export with the older stacked ctx_k draft graph: timed alongside")
    p.add_argument("--draft-padded", action="store_true",
                   help="also time the torch backend's padded (CUDA-graph) round over the export's drafter "
                        "checkpoint, its context bound vs copied")
    p.add_argument("-o", "--out", default=None, help="write context.json, context.png, context.md here")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


# -------------------------------------------------------------------------------------- prompts (pure)
def context_prompt(length: int, tail: list[int], filler: list[int]) -> list[int]:
    """``length`` tokens: the end of ``filler`` then ``tail`` (only ``tail``'s last tokens when it is longer)."""
    from ..errors import DSparkTrtError

    if length < 1:
        raise DSparkTrtError(f"context length {length} must be >= 1")
    if len(tail) >= length:
        return list(tail[-length:])
    need = length - len(tail)
    if need > len(filler):
        raise DSparkTrtError(f"the filler has {len(filler)} tokens, {need} are needed for a context of {length}")
    return list(filler[len(filler) - need:]) + list(tail)


def filler_tokens(tokenizer, vocab_size: int, need: int, seed: int = 0) -> list[int]:
    """At least ``need`` tokens of unrelated text: the prompt bank's prompts, one per paragraph (seeded random
    ids when there is no tokenizer)."""
    if tokenizer is None:
        import torch

        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, vocab_size, (need,), generator=g).tolist()
    from ..training.prompt_bank import prompt_bank

    ids: list[int] = []
    bank = prompt_bank(len(prompt_bank(10**6)), seed=seed)
    for i in range(0, len(bank), 64):  # tokenized in blocks of paragraphs until there are enough
        text = "".join(text + "\n\n" for _, text in bank[i: i + 64])
        ids += tokenizer.encode(text, add_special_tokens=False)
        if len(ids) >= need:
            return ids
    return (ids * (need // max(len(ids), 1) + 1))[:need] if ids else ids


# ---------------------------------------------------------------------------------------- measurements
def step_costs(targets: dict, widths: list[int], repeats: int) -> dict:
    """{path: {S: {w: median seconds}}} of ``verify`` of w tokens (w = 1 without taps), each rolled back; every
    (w, S, path) takes its turn within each repeat, after one warm-up pass."""
    import torch

    times = {(p, S, w): [] for p, by_s in targets.items() for S in by_s for w in widths}
    order = list(times)
    for r in range(repeats + 1):
        for key in (order if r % 2 else order[::-1]):
            path, S, w = key
            t = targets[path][S]
            B = int(t.lengths.shape[0])
            start = time.perf_counter()
            t.verify(torch.zeros(B, w, dtype=torch.int64), with_taps=w > 1)
            if r:
                times[key].append(time.perf_counter() - start)
            t.commit(torch.zeros(B, dtype=torch.int64))
    out: dict = {}
    for (p, S, w), ts in times.items():
        out.setdefault(p, {}).setdefault(S, {})[w] = statistics.median(ts)
    return out


def draft_round_costs(runners: dict, contexts: list[int], batches: list[int], repeats: int) -> dict:
    """{name: {B: {S: median seconds}}} of ``runners[name](B, S)`` (a callable running one draft round, built
    once per (B, S) by ``runners[name]``'s setup: see ``draft_runners``); every (name, B, S) takes its turn
    within each repeat, the order alternating, after one warm-up pass."""
    rounds = {(n, B, S): make(B, S) for n, make in runners.items() for B in batches for S in contexts}
    times = {key: [] for key in rounds}
    order = list(rounds)
    for r in range(repeats + 1):
        for key in (order if r % 2 else order[::-1]):
            start = time.perf_counter()
            rounds[key]()
            if r:
                times[key].append(time.perf_counter() - start)
    out: dict = {}
    for (n, B, S), ts in times.items():
        out.setdefault(n, {}).setdefault(B, {})[S] = statistics.median(ts)
    return out


def draft_runners(backend, *, topk, before_dir: str | Path | None = None, threads: int | None = None,
                  headroom: int = 74, seed: int = 0, padded=None) -> dict:
    """``{"in place": make(B, S)}`` (``"sliding"`` for a windowed drafter, ``"before"`` with ``before_dir``):
    ``make(B, S)`` fills a context of S rows per request (random K/V of the drafter's shape and dtype; the
    round's cost does not depend on the values) and returns a callable running one greedy draft round over it.

    *in place*: a ``DrafterState`` holding every row (capacity bucket of S + a round) handed to ``backend.draft``
    as the runtime does for a drafter reading the whole context. *sliding*: the ``DrafterState`` the runtime
    keeps for a drafter whose layers all read a window of W rows (``DSparkConfig.context_window``): at most
    bucket(W + W/2) rows, ``ctx_start`` telling the round which position its row 0 holds.
    *before*: the older runtime's round — the stacked draft graph fed ``[L, B, :S]`` of a
    ``[L, B, S + headroom, H_kv, D]`` buffer (its capacity: prompt + new tokens + a round), as ``OrtGraph`` got it.
    *padded, bound* / *padded, copied* (``padded``: a reference ``DSparkDrafter``): the torch backend's padded
    round (``graphs="eager"``) over a ``DrafterState`` of its ``state_rows(B)`` rows holding every row, the
    context bound by address or copied into the bucket's static buffers (``bind_context=False``)."""
    import torch

    from ..runtime.drafter_state import DrafterState

    c = backend.config
    L, H, D = c.num_hidden_layers, c.num_key_value_heads, c.head_dim
    dtype = getattr(backend, "dtype", torch.float32)
    gen = torch.Generator().manual_seed(seed)

    def inputs(B, S):
        anchor = torch.randint(0, c.vocab_size, (B,), generator=gen)
        return anchor, torch.full((B,), S, dtype=torch.int64), torch.zeros(B), torch.zeros(B, dtype=torch.int64)

    def in_place(B, S, window=None):
        state = DrafterState(L, B, S + c.num_draft_tokens + 2, H, D, dtype=dtype, device=torch.device("cpu"),
                             limit=getattr(backend, "max_context", None), window=window)
        k = torch.randn(L, B, S, H, D, generator=gen).to(dtype)
        state.append(k, -k, torch.full((B,), S))
        anchor, ctx_len, temp, seeds = inputs(B, S)

        def go():
            ck, cv = state.context()
            backend.draft(anchor, ck, cv, ctx_len, topk=topk, temperature=temp, seed=seeds, ctx_start=state.start)
        return go

    runners = {"in place": in_place}
    if padded is not None:
        from ..runtime.drafters.torch import TorchDrafterBackend

        def padded_round(torch_backend):
            def make(B, S):
                state = DrafterState(L, B, S + c.num_draft_tokens + 2, H, D, dtype=padded.embed_tokens.weight.dtype,
                                     device=torch.device("cpu"), rows=torch_backend.state_rows(B))
                k = torch.randn(L, B, S, H, D, generator=gen).to(state.k.dtype)
                state.append(k, -k, torch.full((B,), S))
                anchor, ctx_len, temp, seeds = inputs(B, S)

                def go():
                    torch_backend.draft(anchor, *state.context(), ctx_len, topk=topk, temperature=temp, seed=seeds)
                return go
            return make

        for name, bind in (("padded, bound", True), ("padded, copied", False)):
            runners[name] = padded_round(TorchDrafterBackend(padded, graphs="eager", bind_context=bind,
                                                             max_context=1 << 16))
    if c.context_window is not None:  # the runtime's cache for a windowed drafter: the last rows only
        runners["sliding"] = lambda B, S: in_place(B, S, c.context_window)
    if before_dir is not None:
        from ..runtime.ort_session import OrtGraph

        graph = OrtGraph(Path(before_dir) / "draft.onnx", threads=threads)
        if "ctx_k" not in graph.inputs:
            from ..errors import DSparkTrtError

            raise DSparkTrtError(f"--draft-before {before_dir}: its draft.onnx has no stacked ctx_k input; give the "
                                 f"onnx/ directory of an export made before the in-place drafter cache")

        def before(B, S):
            buf_k = torch.randn(L, B, S + headroom, H, D, generator=gen).to(dtype)  # [L, B, capacity, H_kv, D]
            buf_v = -buf_k
            anchor, ctx_len, temp, seeds = inputs(B, S)

            def go():
                graph.run({"anchor": anchor, "ctx_k": buf_k[:, :, :S], "ctx_v": buf_v[:, :, :S], "ctx_len": ctx_len,
                           "temperature": temp, "seed": seeds})
            return go
        runners["before"] = before
    return runners


def drafter_cache_bytes(config, prompt: int, new_tokens: int, dtype) -> int:
    """Bytes of one request's drafter context K/V after a ``prompt``-token prefill and ``new_tokens`` more, as the
    runtime holds it (``DrafterState`` with the decoder's arguments: sliding when every layer is windowed)."""
    import torch

    from ..runtime.drafter_state import DrafterState

    c, N = config, config.num_draft_tokens
    shape = (c.num_hidden_layers, 1, 0, c.num_key_value_heads, c.head_dim)
    state = DrafterState(shape[0], 1, prompt + N + 2, shape[3], shape[4], dtype=dtype, device=torch.device("cpu"),
                         window=c.context_window)
    rows = lambda n: torch.zeros(shape[:2] + (n,) + shape[3:], dtype=dtype)  # noqa: E731  [L, 1, n, H_kv, D]
    state.append(rows(prompt), rows(prompt), torch.tensor([prompt]))
    for _ in range(0, new_tokens, N + 1):  # rounds accepting everything: the most rows per round
        state.append(rows(N + 1), rows(N + 1), torch.tensor([N + 1]))
    return 2 * state.k.numel() * state.k.element_size()


def cache_bytes(target) -> int:
    """Bytes of a target's K/V cache now (``OnnxRuntimeTarget``: its buffers; ``HFTarget``: its DynamicCache)."""
    if hasattr(target, "cache_bytes"):
        return int(target.cache_bytes())
    layers = getattr(target.cache, "layers", None) or []
    return int(sum(t.numel() * t.element_size() for layer in layers for t in (layer.keys, layer.values)))


def _decode_rate(stats) -> float:
    seconds = stats.total_seconds - stats.prefill_seconds
    return stats.generated_tokens / seconds if seconds > 0 else 0.0


def end_to_end(decoders: dict, prompts: dict, options: dict, repeats: int) -> dict:
    """{path: {S: row}}: speculative and target-only tokens/s (decode and total), acceptance, draft seconds per
    round, identical greedy tokens; per repeat every (S, path) takes its turn."""
    from .e2e import paired_runs

    runs: dict = {}
    for name, dec in decoders.items():  # warm-up: allocations, lazy inits
        dec.generate([prompts[min(prompts)]], **{**options, "max_new_tokens": 4})
    for r in range(max(1, repeats)):
        for S in (sorted(prompts) if r % 2 == 0 else sorted(prompts, reverse=True)):
            for name, dec in decoders.items():
                log.info("e2e: %s path, S = %d", name, S)
                spec, base = paired_runs(dec, [[prompts[S]]], options)
                runs.setdefault(name, {}).setdefault(S, []).append((spec, base))
    out: dict = {}
    for name, by_s in runs.items():
        for S, pairs in by_s.items():
            spec = [s.stats for s, _ in pairs]
            base = [b.stats for _, b in pairs]
            med = lambda xs: statistics.median(xs)  # noqa: E731
            row = {"speculative_decode_tokens_per_second": med([_decode_rate(s) for s in spec]),
                   "target_only_decode_tokens_per_second": med([_decode_rate(b) for b in base]),
                   "speculative_tokens_per_second": med([s.tokens_per_second for s in spec]),
                   "target_only_tokens_per_second": med([b.tokens_per_second for b in base]),
                   "prefill_seconds": med([b.prefill_seconds for b in base]),
                   "mean_acceptance_length": spec[-1].mean_acceptance_length,
                   "draft_seconds_per_round": spec[-1].draft_seconds / max(spec[-1].rounds, 1),
                   "verify_seconds_per_round": spec[-1].verify_seconds / max(spec[-1].rounds, 1),
                   "same_tokens": all(s.tokens == b.tokens for s, b in pairs),
                   "tokens": pairs[-1][0].tokens[0]}
            row["decode_speedup"] = (row["speculative_decode_tokens_per_second"]
                                     / max(row["target_only_decode_tokens_per_second"], 1e-12))
            out.setdefault(name, {})[S] = row
    return out


def goals(report: dict) -> dict:
    """The long-context goals as ratios of this run (None where a part was skipped)."""
    steps, e2e = report.get("steps") or {}, report.get("e2e") or {}
    S = [int(s) for s in report["contexts"]]
    lo, hi = min(S), (4096 if 4096 in S else max(S))
    w = str(report["verify_tokens"])
    ex = {int(k): v for k, v in (steps.get("exported") or {}).items()}
    hf = {int(k): v for k, v in (steps.get("transformers") or {}).items()}
    out = {"short": lo, "long": hi}
    if ex:
        out["one_token_step_long_over_short"] = ex[hi]["1"] / ex[lo]["1"]
        out["verify_over_one_token_step_at_long"] = ex[hi][w] / ex[hi]["1"]
    if ex and hf:
        out["exported_over_transformers_one_token_step"] = {s: ex[s]["1"] / hf[s]["1"] for s in S}
    for name, by_b in (report.get("draft_rounds") or {}).items():  # the draft round's growth with S, per batch
        out.setdefault("draft_round_long_over_short", {})[name] = {
            B: by_s[str(hi)] / by_s[str(lo)] for B, by_s in by_b.items() if str(hi) in by_s and str(lo) in by_s}
    ee = {int(k): v for k, v in (e2e.get("exported") or {}).items()}
    if ee:
        out["decode_speedup_long_over_short"] = ee[hi]["decode_speedup"] / ee[lo]["decode_speedup"]
    if ee and e2e.get("transformers"):
        tt = {int(k): v for k, v in e2e["transformers"].items()}
        out["greedy_tokens_equal_transformers"] = {s: ee[s]["tokens"] == tt[s]["tokens"] for s in ee if s in tt}
    return out


# ------------------------------------------------------------------------------------------------ run
def run(args: argparse.Namespace) -> int:
    import torch

    from ..errors import DSparkTrtError
    from ..threads import set_cpu_threads
    from .report import _values

    contexts = sorted(set(_values(args.contexts, "--contexts")))
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if skip - {"steps", "e2e", "transformers", "draft"}:
        raise DSparkTrtError(f"--skip {args.skip!r}: the parts are steps, e2e, transformers, draft")
    if args.threads:
        set_cpu_threads(args.threads)
    report = {"export": str(args.export), "contexts": contexts, "max_new_tokens": args.max_new_tokens,
              "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if {"steps", "e2e"} <= skip:  # the draft rounds alone: a drafter-only export directory will do
        from ..runtime.drafters.onnxruntime import OnnxRuntimeDrafterBackend

        onnx_dir = Path(args.export) / "onnx" if (Path(args.export) / "onnx").is_dir() else Path(args.export)
        backend = OnnxRuntimeDrafterBackend(onnx_dir, threads=args.threads)
        N = backend.config.num_draft_tokens
        report.update(num_draft_tokens=N, verify_tokens=N + 1)
        report["drafter_cache_bytes"] = {S: drafter_cache_bytes(backend.config, S, args.max_new_tokens,
                                                                getattr(backend, "dtype", torch.float32))
                                         for S in contexts}
    else:
        backend = _steps_and_e2e(args, contexts, skip, report)
    if "draft" not in skip:
        batches = sorted(set(_values(args.draft_batches, "--draft-batches")))
        with backend:
            runners = draft_runners(backend, topk=backend.topk if hasattr(backend, "topk") else None,
                                    before_dir=args.draft_before, threads=args.threads,
                                    padded=_padded_drafter(args.export) if args.draft_padded else None,
                                    headroom=args.max_new_tokens + report["num_draft_tokens"] + 2)
            log.info("draft rounds: %s at S = %s, B = %s", ", ".join(runners), contexts, batches)
            costs = draft_round_costs(runners, contexts, batches, args.repeats)
        report["draft_rounds"] = {n: {B: {S: sec for S, sec in by_s.items()} for B, by_s in by_b.items()}
                                  for n, by_b in costs.items()}
    report["peak_rss_bytes"] = peak_rss_bytes()
    report["goals"] = goals(json.loads(json.dumps(report)))  # string keys, as in the JSON file
    text = tables(json.loads(json.dumps(report)))
    if args.out:
        from ..atomic import atomic_write_text

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "context.json", json.dumps(report, indent=1) + "\n")
        atomic_write_text(out / "context.md", text)
        plot(json.loads(json.dumps(report)), out)
    print(json.dumps(report) if args.json else text)
    return 0


def _padded_drafter(export: str | Path):
    """The reference drafter of the checkpoint ``export`` was made from (fp32, CPU), its shared weights from the
    export's target source when it has one."""
    from ..artifact.export_dir import ExportDir
    from ..errors import DSparkTrtError
    from ..loader import load_drafter

    manifest = ExportDir(export).manifest
    path = Path((manifest.get("checkpoint") or {}).get("path") or "")
    target = (manifest.get("target") or {}).get("source")
    if not path.is_dir():
        raise DSparkTrtError(f"--draft-padded: the drafter checkpoint {str(path) or '?'} that {export} was exported "
                             f"from is not here; run where it is, or drop --draft-padded")
    return load_drafter(path, dtype="fp32", target_dir=target if target and Path(target).is_dir() else None)


def _steps_and_e2e(args, contexts: list[int], skip: set[str], report: dict):
    """The target parts (per-step costs, end to end, memory) into ``report``; returns the export's drafter."""
    import torch

    from ..errors import DSparkTrtError
    from ..runtime import SpeculativeDecoder
    from .e2e import _transformers_twin
    from .heldout import find_heldout

    opts = {"threads": args.threads} if args.threads else {}
    dec = SpeculativeDecoder.from_export(args.export, backend="onnxruntime", device="cpu", **opts)
    target = dec.target
    N = dec.config.num_draft_tokens
    bound = target.max_context
    if bound is not None and max(contexts) + args.max_new_tokens + N + 1 > bound:
        raise DSparkTrtError(f"S = {max(contexts)} + {args.max_new_tokens} new tokens exceeds the export's "
                             f"max_context {bound}; export again with --max-context {2 * max(contexts)}")
    found = find_heldout(export=args.export)
    if args.prompt is not None and dec.tokenizer is None:
        raise DSparkTrtError("--prompt needs the export's tokenizer, and it has none; drop --prompt")
    if args.prompt is None and found:
        tail = found[0][0]  # the pair's first held-out prompt (a chat turn through the template)
    elif dec.tokenizer is not None:
        tail = dec.tokenizer.encode(args.prompt or "Summarize the text above.", add_special_tokens=False)
    else:  # a pair without text (tiny test pairs): seeded ids
        tail = filler_tokens(None, target.vocab_size, 8, seed=1)
    filler = filler_tokens(dec.tokenizer, target.vocab_size, max(contexts))
    prompts = {S: context_prompt(S, tail, filler) for S in contexts}
    decoders = {"exported": dec}
    if "transformers" not in skip:
        decoders["transformers"] = _transformers_twin(dec, args.export)
    report.update(verify_tokens=N + 1, num_draft_tokens=N, tail_tokens=len(tail))
    if "steps" not in skip:
        targets, memory = {}, {}
        for name, d in decoders.items():
            t = d.target
            t.set_taps(d.config.target_layer_ids)
            for S in contexts:
                log.info("steps: prefill %s target, S = %d", name, S)
                fork = t.fork() if hasattr(t, "fork") else __import__("copy").copy(t)
                fork.prefill([torch.tensor(prompts[S])])
                targets.setdefault(name, {})[S] = fork
                memory.setdefault(name, {})[S] = cache_bytes(fork)
        costs = step_costs(targets, [1, N + 1], args.repeats)
        report["steps"] = {p: {S: {str(w): sec for w, sec in by_w.items()} for S, by_w in by_s.items()}
                           for p, by_s in costs.items()}
        report["target_cache_bytes"] = memory
        del targets
    report["drafter_cache_bytes"] = {S: drafter_cache_bytes(dec.config, S, args.max_new_tokens, target.dtype)
                                     for S in contexts}
    if "e2e" not in skip:
        options = {"max_new_tokens": args.max_new_tokens}
        report["e2e"] = end_to_end(decoders, prompts, options, args.e2e_repeats)
    return dec.backend


# ------------------------------------------------------------------------------------- table and plot
def tables(r: dict) -> str:
    """The Markdown of docs/benchmarks.md's long-context section (a report loaded from JSON: string keys)."""
    S = [str(s) for s in r["contexts"]]
    w = str(r["verify_tokens"])
    lines = [f"Measured {r['date']}, {r['threads']} thread(s), N = {r['num_draft_tokens']} (a verify of {w} tokens), "
             f"{r['max_new_tokens']} new tokens, greedy.", ""]
    steps, mem = r.get("steps"), r.get("target_cache_bytes") or {}
    if steps:
        ex, hf = steps.get("exported", {}), steps.get("transformers", {})
        lines += ["| context S | exported 1-token step | × its S = " + S[0] + " | transformers 1-token step | "
                  "exported ÷ transformers | exported verify of " + w + " | verify ÷ 1-token | K/V per request "
                  "(exported / transformers) |", "|---|---|---|---|---|---|---|---|"]
        for s in S:
            e1, ew = ex[s]["1"], ex[s][w]
            h1 = hf.get(s, {}).get("1")
            kv = " / ".join(_size(mem[p][s]) for p in ("exported", "transformers") if s in mem.get(p, {}))
            lines.append(f"| {s} | {e1 * 1e3:.1f} ms | {e1 / ex[S[0]]['1']:.2f}× | "
                         f"{'' if h1 is None else f'{h1 * 1e3:.1f} ms'} | {'' if h1 is None else f'{e1 / h1:.2f}'} | "
                         f"{ew * 1e3:.1f} ms | {ew / e1:.2f}× | {kv} |")
        lines.append("")
    e2e = r.get("e2e")
    if e2e:
        lines += ["| context S | path | speculative decode tok/s | target-only decode tok/s | speed-up | acceptance "
                  "length | draft ms/round | prefill s | total tok/s (spec / target) | identical (greedy) |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for s in S:
            for p, rows in e2e.items():
                x = rows.get(s)
                if x is None:
                    continue
                lines.append(f"| {s} | {p} | {x['speculative_decode_tokens_per_second']:.1f} | "
                             f"{x['target_only_decode_tokens_per_second']:.1f} | {x['decode_speedup']:.2f}× | "
                             f"{x['mean_acceptance_length']:.2f} | {x['draft_seconds_per_round'] * 1e3:.1f} | "
                             f"{x['prefill_seconds']:.1f} | {x['speculative_tokens_per_second']:.1f} / "
                             f"{x['target_only_tokens_per_second']:.1f} | {'yes' if x['same_tokens'] else 'NO'} |")
        lines.append("")
    g = r.get("goals") or {}
    if g:
        lo, hi = g["short"], g["long"]
        lines += ["| goal | this run |", "|---|---|"]
        if "one_token_step_long_over_short" in g:
            lines.append(f"| exported 1-token step at S = {hi} ≤ 2.5× its S = {lo} | "
                         f"{g['one_token_step_long_over_short']:.2f}× |")
        if "exported_over_transformers_one_token_step" in g:
            worst = max(g["exported_over_transformers_one_token_step"].values())
            lines.append(f"| exported faster than transformers eager at every S | slowest ratio {worst:.2f} |")
        if "verify_over_one_token_step_at_long" in g:
            lines.append(f"| verify of {w} at S = {hi} ≤ 1.5× a 1-token step | "
                         f"{g['verify_over_one_token_step_at_long']:.2f}× |")
        if "decode_speedup_long_over_short" in g:
            lines.append(f"| speculative speed-up at S = {hi} ≥ 0.9× its speed-up at S = {lo} | "
                         f"{g['decode_speedup_long_over_short']:.2f}× |")
        for name, by_b in (g.get("draft_round_long_over_short") or {}).items():
            ratios = ", ".join(f"B = {B}: {x:.2f}×" for B, x in by_b.items())
            lines.append(f"| draft round at S = {hi} ÷ S = {lo} ({name}) | {ratios} |")
        if "greedy_tokens_equal_transformers" in g:
            same = g["greedy_tokens_equal_transformers"]
            lines.append(f"| greedy tokens equal transformers' at every S | {'yes' if all(same.values()) else 'NO'} |")
        lines.append("")
    rounds = r.get("draft_rounds")
    if rounds:
        names = list(rounds)
        batches = list(rounds[names[0]])
        head = " | ".join(f"{n}, B = {B}" for B in batches for n in names)
        who = ("the export's drafter, onnxruntime" if not any(n.startswith("padded") for n in names) else
               "the export's drafter, onnxruntime; *padded*: its checkpoint, the torch backend's padded round")
        lines += [f"Draft round ({who}; ms, and × its S = {S[0]}):", "",
                  f"| context S | {head} |", "|---|" + "---|" * (len(batches) * len(names))]
        for s in S:
            cells = [f"{rounds[n][B][s] * 1e3:.1f} ms ({rounds[n][B][s] / rounds[n][B][S[0]]:.2f}×)"
                     for B in batches for n in names]
            lines.append(f"| {s} | " + " | ".join(cells) + " |")
        lines.append("")
    tail = f"Peak resident memory of the run: {_size(r['peak_rss_bytes'])}"
    if r.get("drafter_cache_bytes"):
        tail += f"; drafter context K/V per request at S = {S[-1]}: {_size(r['drafter_cache_bytes'][S[-1]])}"
    lines.append(tail + ".")
    return "\n".join(lines) + "\n"


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def plot(r: dict, out: Path) -> Path | None:
    """context.png, one panel per part measured: per-step target cost vs S, decode tokens/s vs S, draft round vs S."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from ..optional import pip_install

        log.warning("matplotlib missing (%s): no plot", pip_install("bench"))
        return None
    from .report import _savefig

    S = [str(s) for s in r["contexts"]]
    x = [int(s) for s in S]
    w = str(r["verify_tokens"])
    panels = []  # (title, ylabel, [(label, style, ys)])
    steps, e2e = r.get("steps") or {}, r.get("e2e") or {}
    lines = []
    for p, style in (("exported", "-"), ("transformers", "--")):
        if steps.get(p):
            lines.append((f"{p}: 1-token step", "o" + style, [steps[p][s]["1"] * 1e3 for s in S]))
            lines.append((f"{p}: verify of {w}", "s" + style, [steps[p][s][w] * 1e3 for s in S]))
    if lines:
        panels.append(("target step cost vs context", "ms", lines))
    lines = []
    for p, style in (("exported", "-"), ("transformers", "--")):
        if e2e.get(p):
            lines.append((f"{p}: speculative", "o" + style,
                          [e2e[p][s]["speculative_decode_tokens_per_second"] for s in S]))
            lines.append((f"{p}: target only", "s" + style,
                          [e2e[p][s]["target_only_decode_tokens_per_second"] for s in S]))
    if lines:
        panels.append(("decode tokens/s vs context", "tokens/s", lines))
    lines = [(f"{name}, B = {B}", ("o-" if i % 2 == 0 else "s--"), [by_s[s] * 1e3 for s in S])
             for i, (name, by_b) in enumerate((r.get("draft_rounds") or {}).items()) for B, by_s in by_b.items()]
    if lines:
        panels.append(("draft round vs context", "ms", lines))
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (title, ylabel, series) in zip(axes[0], panels):
        for label, style, ys in series:
            ax.plot(x, ys, style, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, S)
        ax.set_xlabel("context S (prompt tokens)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(fontsize=8)
    return _savefig(fig, out / "context.png")
