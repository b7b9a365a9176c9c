"""Write a Triton model repository serving a DSpark export directory (or a checkpoint pair).

  dspark triton-repo OUT -o REPO                         an export (runtime: tensorrt where importable, else onnxruntime)
  dspark triton-repo --drafter D --target T -o REPO      a checkpoint pair (runtime torch, or --runtime onnxruntime)

  dspark triton-repo OUT -o REPO --instances 2 --gpus 0,1 --max-queue 64    instances, GPUs, a bounded queue

OUT must be a dspark-export directory (checked before anything is written); --force replaces only a repository
written here. Then `dspark serve REPO`. The repository's README.md says how to launch it on CPU and GPU hosts.
"""

from __future__ import annotations

import argparse

from ..serving.settings import RepositorySettings
from .settings_args import add_settings, settings_values


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("export_dir", metavar="OUT", nargs="?", default=None, help="export directory (dspark-export -o OUT)")
    p.add_argument("-o", "--output", required=True, metavar="REPO", help="the model repository to write")
    p.add_argument("--drafter", metavar="DIR", default=None, help="drafter checkpoint (instead of OUT)")
    p.add_argument("--target", metavar="DIR", default=None, help="target checkpoint (with --drafter)")
    add_settings(p, RepositorySettings)
    p.add_argument("--copy", action="store_true",
                   help="copy the export (or drafter and target) into REPO/dspark/1/ and reference it there: a "
                        "repository you can move, mount into a container or ship as one directory")
    p.add_argument("--force", action="store_true", help="replace a repository written by triton-repo")


def run(args: argparse.Namespace) -> int:
    from ..errors import DSparkTrtError
    from ..serving.repository import write_model_repository
    from ..topk import DEFAULT_TOPK, parse_topk

    if (args.export_dir is None) == (args.drafter is None and args.target is None):
        raise DSparkTrtError("give an export directory OUT, or --drafter and --target (not both)")
    repo = write_model_repository(args.output, export_dir=args.export_dir, drafter_dir=args.drafter,
                                  target_dir=args.target, copy=args.copy, force=args.force,
                                  **settings_values(RepositorySettings, args))
    print(f"wrote Triton model repository {repo} (model 'dspark'); launch it with: dspark serve {repo}")
    return 0
