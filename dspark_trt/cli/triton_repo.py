"""Write a Triton model repository serving a DSpark export directory (or a checkpoint pair).

  dspark triton-repo OUT -o REPO                         an export (runtime: tensorrt where importable, else onnxruntime)
  dspark triton-repo --drafter D --target T -o REPO      a checkpoint pair (runtime torch, or --runtime onnxruntime)

  dspark triton-repo OUT -o REPO --instances 2 --gpus 0,1 --max-queue 64    instances, GPUs, a bounded queue

OUT must be a dspark-export directory (checked before anything is written); --force replaces only a repository
written here. Then `dspark serve REPO`. The repository's README.md says how to launch it on CPU and GPU hosts.
"""

from __future__ import annotations

import argparse

from .common import verify_length


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("export_dir", metavar="OUT", nargs="?", default=None, help="export directory (dspark-export -o OUT)")
    p.add_argument("-o", "--output", required=True, metavar="REPO", help="the model repository to write")
    p.add_argument("--drafter", metavar="DIR", default=None, help="drafter checkpoint (instead of OUT)")
    p.add_argument("--target", metavar="DIR", default=None, help="target checkpoint (with --drafter)")
    p.add_argument("--runtime", choices=("tensorrt", "onnxruntime", "torch"), default=None,
                   help="force the runtime (default: tensorrt / onnxruntime for an export, torch for a pair)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda for tensorrt, else cpu)")
    p.add_argument("--topk", default=None, metavar="K|off",
                   help="draft top-k (default: the drafter's; off or 0 = dense)")
    p.add_argument("--confidence-threshold", type=float, default=None,
                   help="verify only drafts whose confidence is at least this")
    p.add_argument("--verify-drafts", type=verify_length, default=None, metavar="L|auto",
                   help="verify at most L drafts per round (default: all N; fewer is faster on a CPU; 'auto' "
                        "chooses each round from the measured verify cost and acceptance)")
    p.add_argument("--max-batch-size", type=int, default=64, help="requests decoded together (default 64)")
    p.add_argument("--max-context", type=int, default=None,
                   help="refuse prompt + max_tokens beyond this (default: the target's context)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads of the model (default: library default)")
    p.add_argument("--copy", action="store_true",
                   help="copy the export (or drafter and target) into REPO/dspark/1/ and reference it there: a "
                        "repository you can move, mount into a container or ship as one directory")
    p.add_argument("--instances", type=int, default=1, metavar="N",
                   help="model instances, each with its own decoder and in-flight batch (default 1)")
    p.add_argument("--gpus", type=_gpu_list, default=None, metavar="IDS",
                   help="GPU ids the instances run on, e.g. 0,1 (GPU runtimes; N instances on each)")
    p.add_argument("--max-queue", type=int, default=None, metavar="N",
                   help="requests allowed to wait for a batch row (per instance); the next one is refused with "
                        "'server busy' (default: no bound)")
    p.add_argument("--force", action="store_true", help="replace a repository written by triton-repo")


def _gpu_list(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--gpus takes device ids separated by commas (e.g. 0,1), got {text!r}")
    if not ids or min(ids) < 0:
        raise argparse.ArgumentTypeError(f"--gpus takes device ids >= 0 separated by commas, got {text!r}")
    return ids


def run(args: argparse.Namespace) -> int:
    from ..errors import DSparkTrtError
    from ..serving.repository import write_model_repository
    from ..topk import DEFAULT_TOPK, parse_topk

    if (args.export_dir is None) == (args.drafter is None and args.target is None):
        raise DSparkTrtError("give an export directory OUT, or --drafter and --target (not both)")
    topk = DEFAULT_TOPK if args.topk is None else parse_topk(args.topk, zero_is_off=True)
    repo = write_model_repository(args.output, export_dir=args.export_dir, drafter_dir=args.drafter,
                                  target_dir=args.target, runtime=args.runtime, device=args.device, topk=topk,
                                  confidence_threshold=args.confidence_threshold, verify_drafts=args.verify_drafts,
                                  max_batch_size=args.max_batch_size, max_context=args.max_context,
                                  threads=args.threads, copy=args.copy, force=args.force,
                                  instances=args.instances, gpus=args.gpus, max_queue=args.max_queue)
    print(f"wrote Triton model repository {repo} (model 'dspark'); launch it with: dspark serve {repo}")
    return 0
