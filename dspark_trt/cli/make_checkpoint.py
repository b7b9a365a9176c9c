"""Write a real-shape checkpoint with random weights: a DSpark drafter preset, a target preset, or both.

  dspark make-checkpoint --list
  dspark make-checkpoint dspark_qwen3_8b_block7 ckpt/drafter                 # 2.37 B params, 4.74 GB bf16
  dspark make-checkpoint qwen3_8b ckpt/target                                # 8.19 B params, 16.4 GB, 5 shards
  dspark make-checkpoint dspark_qwen3_8b_block7 ckpt/pair --with-target --layers 1 --target-layers 8 --vocab 4096

Weights are streamed tensor by tensor (memory stays ≪ the checkpoint), deterministic for --seed; free disk is
checked first and the output is written atomically. See docs/checkpoints.md, "Real-shape checkpoints".
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("preset", metavar="PRESET", nargs="?", help="preset name (--list shows them)")
    p.add_argument("out_dir", metavar="OUT_DIR", nargs="?",
                   help="directory to create (refused if non-empty unless it is an earlier output and --force)")
    p.add_argument("--list", action="store_true", help="list the presets with their parameters and bytes, and exit")
    p.add_argument("--format", choices=("deepseek", "speculators"), default=None,
                   help="drafter layout (default: the release's own, as --list shows; deepseek: embed_tokens and "
                        "lm_head included, speculators: both read from the target)")
    p.add_argument("--layers", type=int, default=None, help="decoder layers (draft layers of a drafter preset)")
    p.add_argument("--target-layers", type=int, default=None,
                   help="target depth of a drafter preset (its target_layer_ids are spread over it anew)")
    p.add_argument("--vocab", type=int, default=None, help="vocabulary size (>= 257 with a target; default the preset's)")
    p.add_argument("--shard-size", default=None, metavar="SIZE",
                   help="shard limit, e.g. 2GB or 500MiB; 'none' = one model.safetensors (default: one file for "
                        "drafters, the release's limit for targets)")
    p.add_argument("--with-target", action="store_true",
                   help="drafter presets: write OUT_DIR/drafter and OUT_DIR/target (its target preset), like tiny-checkpoint")
    p.add_argument("--target-shard-size", default=None, metavar="SIZE", help="shard limit of the --with-target target")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16", help="weight dtype (default bf16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="replace an earlier make-checkpoint output")


def preset_table(dtype: str = "bf16") -> str:
    """The presets with their parameters and bytes (both drafter formats), as a text table."""
    from ..synthetic.presets import PRESETS, DrafterPreset, drafter_tensor_shapes, parameter_count, target_tensor_shapes
    from ..synthetic.safetensors_stream import format_size

    size = {"fp32": 4, "fp16": 2, "bf16": 2}[dtype]
    rows = [("preset", "kind", "parameters", f"bytes ({dtype})", "description")]
    for p in PRESETS.values():
        if p.kind == "drafter":
            other = "speculators" if p.format == "deepseek" else "deepseek"
            formats = (p.format,) if not isinstance(p, DrafterPreset) else (p.format, other)  # Gemma-4: DeepSpec's only
            for fmt in formats:  # the release's own layout first
                n = parameter_count(drafter_tensor_shapes(p, fmt))
                first = fmt == p.format
                rows.append((p.name if first else "", f"drafter ({fmt}{', release' if first else ''})",
                             f"{n / 1e9:.2f} B ({n:,})", format_size(n * size),
                             p.description if first else f"target: {p.target.name}; release: {p.hub_id or '-'}"))
        else:
            n = parameter_count(target_tensor_shapes(p))
            rows.append((p.name, "target", f"{n / 1e9:.2f} B ({n:,})", format_size(n * size), p.description))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4] for r in rows)


def run(args: argparse.Namespace) -> int:
    from .common import EXIT_USAGE

    if args.list:
        print(preset_table(args.dtype))
        return 0
    if args.preset is None or args.out_dir is None:
        print("error: give PRESET and OUT_DIR (or --list)", file=sys.stderr)
        return EXIT_USAGE
    from ..synthetic.preset_checkpoint import write_preset
    from ..synthetic.safetensors_stream import format_size

    written = write_preset(args.preset, args.out_dir, format=args.format, layers=args.layers,
                           target_layers=args.target_layers, vocab=args.vocab, shard_size=args.shard_size,
                           target_shard_size=args.target_shard_size, dtype=args.dtype, seed=args.seed,
                           with_target=args.with_target, force=args.force, progress=True)
    for part in ("drafter", "target"):
        if getattr(written, part) is not None:
            print(f"{part + ':':9}{getattr(written, part)}")
    print(f"wrote {written.parameters / 1e9:.3f} B parameters ({written.parameters:,}), {format_size(written.nbytes)}")
    return 0
