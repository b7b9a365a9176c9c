"""Build the TensorRT (or TensorRT-RTX) engines of a directory written by dspark-export, and record them in
its manifest. Run it on the GPU host that has TensorRT; it registers the DSparkTopKMarkov plugin itself.

  dspark build-engine OUT [--engine tensorrt|tensorrt-rtx] [--max-batch-size B] [--graph draft] [--force]
"""

from __future__ import annotations

import argparse

STATUS_LINE = True


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("export_dir", metavar="OUT", help="a directory written by dspark-export")
    p.add_argument("--engine", choices=("auto", "tensorrt", "tensorrt-rtx"), default="auto")
    p.add_argument("--max-batch-size", type=int, default=None)
    p.add_argument("--opt-batch-size", type=int, default=None)
    p.add_argument("--version-compatible", action="store_true", default=None,
                   help="engines for later TensorRT runtimes of the same major version (dense exports only: refused "
                        "with the top-k AOT plugin)")
    p.add_argument("--compute-capability", default=None, help="TensorRT-RTX target GPU (default SM80)")
    p.add_argument("--graph", action="append", choices=("context", "draft", "target"), default=None,
                   help="build only this graph's engine (repeatable; default: every graph of the export)")
    p.add_argument("--force", action="store_true", help="rebuild engines that already exist")


def run(args: argparse.Namespace) -> int:
    from ..export.pipeline import ExportOptions, build_engines

    given = {"max_batch_size": args.max_batch_size, "opt_batch_size": args.opt_batch_size,
             "version_compatible": args.version_compatible, "compute_capability": args.compute_capability}
    manifest = build_engines(args.export_dir, engine=args.engine,
                             options=ExportOptions(**{k: v for k, v in given.items() if v is not None}),
                             force=args.force, graphs=tuple(args.graph) if args.graph else None)
    for entry in manifest["engines"].values():
        print(f"engine {entry['file']} ({entry['flavor']} {entry['version']}, {entry['bytes']} bytes)")
    return 0
