"""Synthetic checkpoints, so the whole pipeline runs without downloading a model.

    tiny.py               tiny deterministic drafter + Hugging Face target pairs (``dspark tiny-checkpoint``)
    presets.py            named real-shape drafters and targets, shapes only
    preset_checkpoint.py  a preset written with random weights (``dspark make-checkpoint``)
    safetensors_stream.py safetensors files written tensor by tensor, chunk by chunk
    drafter_config.py     a drafter checkpoint's ``config.json`` (DeepSeek or speculators layout)
    byte_tokenizer.py     the byte-level tokenizer synthetic targets ship with

Below: config, checkpoint, atomic, hf, errors (and torch, safetensors, transformers). Nothing here runs a model.
"""

from .preset_checkpoint import WrittenCheckpoint, write_preset
from .tiny import TinyCheckpoint, tiny_config, write_tiny_checkpoint

__all__ = ["TinyCheckpoint", "WrittenCheckpoint", "tiny_config", "write_preset", "write_tiny_checkpoint"]
