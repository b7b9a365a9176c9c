"""Benchmarks. Each reports speed/memory as ratios measured in one run (never pass/fail on time).

  dspark bench markov   one draft round of the Markov walk: dense vs top-k (and the fused kernel on CUDA)
  dspark bench e2e      tokens/s with and without speculation on the embedded tiny pair
  dspark bench serve    a Triton repository: tokens/s, p50/p99 latency at 1/4/16 clients vs in-process
  dspark bench context  per-step target cost and tokens/s at S = 128 … 8k, exported target vs transformers
  dspark bench export   dspark-export's wall time, peak resident memory and bytes written, per phase
  dspark bench deploy   3 dspark serve replicas behind HAProxy: rolling restart, a killed replica, a drain
  dspark bench releases the release matrix: each preset exported, validated, decoded losslessly, built (RTX)
"""

from __future__ import annotations

import argparse

from .common import import_optional

#: benchmark → module under dspark_trt.bench with add_arguments(parser) and run(args) -> int
BENCHMARKS = {
    "markov": ("markov", "one draft round of the Markov walk, dense vs top-k"),
    "e2e": ("e2e", "end-to-end tokens/s with and without speculation"),
    "serve": ("serve", "Triton serving: tokens/s and latency at 1/4/16 clients vs in-process generate"),
    "report": ("report", "the SmolLM2 benchmark matrix, top-k sweep, plots and tables (docs/benchmarks.md)"),
    "context": ("context", "long contexts: per-step target cost and tokens/s at S = 128 … 8k, exported vs transformers"),
    "export": ("export", "dspark-export's wall time, peak resident memory and bytes written, per phase"),
    "deploy": ("deploy", "3 dspark serve replicas behind HAProxy: rolling restart, a killed replica, a drain"),
    "releases": ("releases", "the release matrix: export, validation, lossless greedy decoding, RTX engine per preset"),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    subs = p.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    for name, (module, help_text) in BENCHMARKS.items():
        mod = import_optional(f"dspark_trt.bench.{module}")
        if mod is None:
            sub = subs.add_parser(name, help=f"{help_text} (not yet available)")
            sub.set_defaults(_bench_run=None)
            continue
        sub = subs.add_parser(name, help=help_text, description=mod.__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(sub)
        sub.set_defaults(_bench_run=mod.run)


def run(args: argparse.Namespace) -> int:
    from ..errors import DSparkTrtError

    if args._bench_run is None:
        raise DSparkTrtError(f"'dspark bench {args.benchmark}' is not yet available in this version")
    return args._bench_run(args)
