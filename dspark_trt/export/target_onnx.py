"""Target model → ``onnx/target.onnx`` (+ the manifest's ``target`` section, the copied tokenizer, pairing checks).

    check_target_pairing(drafter_config, read_target_config("target/"))      # one-line error on a mismatch
    path = export_target_onnx(model, drafter_config.target_layer_ids, "out/onnx/target.onnx")

The graph is ``export/target_graph.py``'s ``TargetGraph`` exported with ``torch.onnx.export(dynamo=True)``:
standard ONNX ops only (checked), batch ``B``, new tokens ``Q``, cache capacity ``P`` and mask length ``S``
(= P + Q; ``torch.export`` cannot add two dims, so the mask has its own) dynamic. Weights go to
``target.onnx.data`` when they exceed 1.5 GiB (protobuf caps a file at 2 GiB).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path
from typing import Sequence

import torch

from ..artifact.layout import TARGET_ONNX, TOKENIZER_DIR
from ..artifact.target_io import MAX_NEW_TOKENS
from ..config import DSparkConfig, check_layer_ids
from ..errors import DSparkTrtError

__all__ = ["check_target_pairing", "load_target_model", "export_target_onnx", "new_target_section", "copy_tokenizer",
           "target_eos_ids", "target_dynamic_ranges"]

log = logging.getLogger("dspark.export")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json",
                   "generation_config.json")
EXAMPLE_SHAPE = dict(B=2, Q=3, P=4, K=5)  # the traced example: distinct, ≥ 2, so no dimension specialises


def check_target_pairing(config: DSparkConfig, target_config: dict, *, where: str = "target") -> None:
    """The drafter must fit the target: vocabulary, hidden size, tapped layers within its depth."""
    fix = "export the drafter with the target it was trained for"
    vocab, hidden = int(target_config.get("vocab_size", -1)), int(target_config.get("hidden_size", -1))
    if vocab != config.vocab_size:
        raise DSparkTrtError(f"drafter vocab_size {config.vocab_size} != {where} vocab_size {vocab}; {fix}")
    if hidden != config.hidden_size:
        raise DSparkTrtError(f"drafter hidden_size {config.hidden_size} != {where} hidden_size {hidden} (the drafter "
                             f"fuses {config.num_taps}x{config.hidden_size} tapped features); {fix}")
    check_layer_ids(config.target_layer_ids, int(target_config.get("num_hidden_layers", 0)))


def load_target_model(target_dir: str | Path, dtype: torch.dtype):
    """``AutoModelForCausalLM`` from a local directory in ``dtype``, eval, no grad, eager-free SDPA attention."""
    import transformers

    from ..hf import no_progress_bars

    try:
        with no_progress_bars():
            model = transformers.AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype, local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DSparkTrtError(f"cannot load the target model from {target_dir} ({first}); pass a directory with a "
                             f"transformers causal-LM checkpoint, or --skip-target") from None
    return model.eval().requires_grad_(False)


def build_target_model(target_dir: str | Path, dtype: torch.dtype, *, placeholders=None,
                       num_layers: int | None = None):
    """The target's ``transformers`` causal LM built from its config without ``from_pretrained``: each weight read
    from the checkpoint by name (``model.safetensors`` or shards) in ``dtype`` — or, with ``placeholders``
    (``export.streaming.Placeholders``), the large ones stood in for by placeholders that the export streams
    (nothing of them resident). ``num_layers``: only the first decoder layers (validation on a subset at size).
    Tied embeddings stay one tensor; the rotary tables are computed, as transformers computes them."""
    import transformers

    from ..checkpoint import SafetensorsCheckpoint

    try:
        config = transformers.AutoConfig.from_pretrained(target_dir, local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DSparkTrtError(f"cannot load the target model from {target_dir} ({first}); pass a directory with a "
                             f"transformers causal-LM checkpoint, or --skip-target") from None
    if num_layers is not None:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        text.num_hidden_layers = int(num_layers)
        if getattr(text, "layer_types", None):
            text.layer_types = list(text.layer_types)[: int(num_layers)]
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    for name, module in list(model.named_modules()):  # the rotary tables: computed buffers, built for real
        if type(module).__name__.endswith("RotaryEmbedding"):
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, leaf, type(module)(config=module.config))
    meta = [n for n, b in model.named_buffers() if b.is_meta]
    if meta:
        raise DSparkTrtError(f"target buffers {meta[:3]} are not computed by dspark-trt's target builder; report "
                             f"this architecture ({type(model).__name__})")
    tied = bool(getattr(config.get_text_config() if hasattr(config, "get_text_config") else config,
                        "tie_word_embeddings", False))
    made: dict[str, torch.nn.Parameter] = {}
    with SafetensorsCheckpoint(target_dir) as ck:
        shapes = ck.shapes()
        for name, param in list(model.named_parameters(remove_duplicate=False)):
            key = name
            if key not in shapes and tied and name == "lm_head.weight":
                key = "model.embed_tokens.weight"
            if key not in shapes:
                raise DSparkTrtError(f"{target_dir} has no tensor {key} (the {type(model).__name__} needs it); "
                                     f"re-download the target checkpoint")
            if tuple(shapes[key][0]) != tuple(param.shape):
                raise DSparkTrtError(f"target tensor {key} has shape {shapes[key][0]}, the config implies "
                                     f"{list(param.shape)}; fix config.json or re-download the target")
            if key not in made:
                if placeholders is not None and placeholders.wants(param.shape):
                    from .streaming import Recipe

                    t = placeholders.tensor(Recipe(Path(target_dir), key, tuple(param.shape), dtype))
                else:
                    t = ck.get(key).to(dtype)
                made[key] = torch.nn.Parameter(t, requires_grad=False)
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, leaf, made[key])
    return model.eval().requires_grad_(False)


def example_inputs(shape, dtype: torch.dtype, *, B: int, Q: int, P: int, K: int) -> tuple:
    """Graph inputs (input_ids, position_ids, attention_mask, logits_index, [past_key_l], [past_value_l])."""
    g = torch.Generator().manual_seed(0)
    kv = (B, shape.num_key_value_heads, P, shape.head_dim)
    return (torch.randint(0, shape.vocab_size, (B, Q), generator=g),  # [B, Q]
            (P + torch.arange(Q)).expand(B, Q).contiguous(),  # [B, Q]
            torch.ones(B, P + Q, dtype=torch.int64),  # [B, P + Q]
            torch.arange(K).expand(B, K).contiguous() % Q,  # [B, K]
            [torch.randn(kv, generator=g).to(dtype) for _ in range(shape.num_layers)],  # L × [B, H, P, D]
            [torch.randn(kv, generator=g).to(dtype) for _ in range(shape.num_layers)])


def export_target_onnx(model, target_layer_ids: Sequence[int], out_path: str | Path, *, placeholders=None) -> Path:
    """Export ``model`` (its dtype is the graph's) tapping ``target_layer_ids``; write ``out_path``.

    ``placeholders``: the model was built on them (``build_target_model``): its initializers stream from the
    checkpoint into ``<out_path>.data`` (export/streaming.py)."""
    import onnx_ir as ir
    from torch.export import Dim

    from ..torch_to_onnx import torch_onnx_export
    from ..artifact.external_data import EXTERNAL_DATA_BYTES
    from ..artifact.target_io import OUTPUT_NAMES, input_names
    from .target_graph import TargetGraph, check_architecture

    check_architecture(model.config)
    graph = TargetGraph(model, target_layer_ids)
    dtype = next(model.parameters()).dtype
    args = example_inputs(graph.shape, dtype, **EXAMPLE_SHAPE)
    b, q, k = Dim("B", min=1, max=4096), Dim("Q", min=1, max=1 << 20), Dim("K", min=1, max=1 << 20)
    p, s = Dim("P", min=1, max=1 << 20), Dim("S", min=2, max=1 << 21)
    layers = graph.shape.num_layers
    dynamic = {"input_ids": {0: b, 1: q}, "position_ids": {0: b, 1: q}, "attention_mask": {0: b, 1: s},
               "logits_index": {0: b, 1: k}, "past_keys": [{0: b, 2: p}] * layers,
               "past_values": [{0: b, 2: p}] * layers}
    log.info("exporting the target graph (%s, %d layers, taps %s)", type(model).__name__, layers,
             list(target_layer_ids))
    program = torch_onnx_export(graph, args, input_names=input_names(layers), output_names=OUTPUT_NAMES,
                                dynamic_shapes=dynamic)
    model_ir = program.model
    foreign = sorted({n.domain for n in model_ir.graph.all_nodes() if n.domain not in ("", "ai.onnx")})
    if foreign:
        raise DSparkTrtError(f"the target graph uses non-standard ONNX domains {foreign} that TensorRT cannot parse; "
                             f"report this target architecture ({type(model).__name__})")
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if placeholders is not None:
        from ..artifact.external_data import EXTERNAL_DATA_ALIGNMENT
        from .streaming import name_placeholders, stream_initializers

        name_placeholders(graph, placeholders)
        counts = stream_initializers(model_ir, placeholders, what="target graph")
        log.info("target graph: %d initializers (%.1f MiB) stream from the checkpoint, %d computed at export",
                 counts["streamed"], counts["streamed_bytes"] / 2**20, counts["in_memory"])
        del program, graph
        ir.save(model_ir, out_path, external_data=f"{out_path.name}.data", alignment=EXTERNAL_DATA_ALIGNMENT)
        return out_path
    size = sum(v.const_value.nbytes for v in model_ir.graph.initializers.values() if v.const_value is not None)
    ir.save(model_ir, out_path, external_data=f"{out_path.name}.data" if size > EXTERNAL_DATA_BYTES else None)
    return out_path


# -- tokenizer, eos, manifest ------------------------------------------------------------------------------
def copy_tokenizer(target_dir: str | Path, out_dir: str | Path) -> list[str]:
    """Copy the target's tokenizer files into ``out_dir`` (created); returns the names copied."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in TOKENIZER_FILES:
        src = Path(target_dir) / name
        if src.is_file():
            shutil.copy2(src, out_dir / name)
            copied.append(name)
    return copied


def target_eos_ids(target_dir: str | Path, target_config: dict) -> list[int]:
    """eos ids from generation_config.json and config.json (as ``HFTarget`` reads them from the model)."""
    ids = []
    gen = Path(target_dir) / "generation_config.json"
    sources = [json.loads(gen.read_text())] if gen.is_file() else []
    for cfg in sources + [target_config]:
        value = cfg.get("eos_token_id")
        if value is None:
            continue
        ids.extend(value if isinstance(value, (list, tuple)) else [value])
    return list(dict.fromkeys(int(i) for i in ids))


def _config_sha256(target_dir: str | Path) -> str:
    return hashlib.sha256((Path(target_dir) / "config.json").read_bytes()).hexdigest()


def new_target_section(*, target_dir: str | Path, target_config: dict, config: DSparkConfig, dtype: str,
                       io: dict, tokenizer: list[str], max_context: int, validation: list[str] | None) -> dict:
    """The manifest's ``target`` section (CONTRACT: docs/export.md, "The target graph")."""
    from types import SimpleNamespace

    from ..artifact.target_io import KV_INTERFACE
    from .target_graph import target_shape

    shape = target_shape(SimpleNamespace(**target_config))
    return {
        "onnx": TARGET_ONNX,
        "io": io,
        "dtype": dtype,
        "num_layers": shape.num_layers,
        "num_key_value_heads": shape.num_key_value_heads,
        "head_dim": shape.head_dim,
        "hidden_size": shape.hidden_size,
        "vocab_size": shape.vocab_size,
        "layer_ids": list(config.target_layer_ids),
        "hf_hidden_state_indices": config.hf_hidden_state_indices,
        "config_sha256": _config_sha256(target_dir),
        "architecture": (target_config.get("architectures") or ["?"])[0],
        "source": str(Path(target_dir).resolve()),
        "tokenizer": TOKENIZER_DIR if tokenizer else None,  # loaded only when it has tokenizer files
        "tokenizer_files": tokenizer,
        "eos_token_ids": target_eos_ids(target_dir, target_config),
        "max_context": max_context,
        "kv_interface": KV_INTERFACE,
        "engines": [],
        "validation": validation,
    }


def target_dynamic_ranges(max_context: int, *, opt_context: int = 1024, opt_new: int = 8,
                          max_new: int = MAX_NEW_TOKENS) -> dict:
    """Engine profile of the target graph: Q (new tokens) and K (rows with logits) 1 … a prefill chunk, P (the
    cache capacity the graph reads) 1 … the capacity bucket of ``max_context`` (``kv_capacity.capacity_bucket``),
    S = P + Q; W (a Gemma-4 graph's sliding-layer caches) as P unless ``target_build_config`` fixes it to the
    runtime's ring."""
    from ..artifact.kv_capacity import capacity_bucket

    q_max = min(max_new, max_context)
    p_opt, p_max = capacity_bucket(min(opt_context, max_context)), capacity_bucket(max_context)
    q_opt = min(opt_new, q_max)
    return {"Q": (1, q_opt, q_max), "K": (1, q_opt, q_max), "P": (1, p_opt, p_max),
            "S": (2, p_opt + q_opt, p_max + q_max),
            "W": (1, p_opt, p_max)}  # a Gemma-4 graph's sliding caches (an export fixes them to its ring)
