"""A byte-level Hugging Face tokenizer: ids 0…255 are the UTF-8 bytes, 256 is ``<|mask|>``.

The tokenizer of the embedded demo pair and of the real-shape preset targets, so text prompts, ``dspark
generate`` and an export's ``tokenizer/`` work on synthetic targets; ids above 256 exist in such a model but
decode to nothing.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["MASK_TOKEN", "BYTE_VOCAB", "write_byte_tokenizer"]

MASK_TOKEN = "<|mask|>"
BYTE_VOCAB = 257  # ids the tokenizer uses: 0…255 bytes, 256 the mask token


def _byte_chars() -> dict[int, str]:
    """Byte → printable character, the byte-level BPE convention (printable Latin-1 kept, the rest shifted)."""
    printable = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    out, shifted = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + shifted)
            shifted += 1
    return out


def write_byte_tokenizer(directory: str | Path) -> None:
    """A Hugging Face fast tokenizer whose ids are UTF-8 bytes (0…255) plus ``<|mask|>`` = 256."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = _byte_chars()
    tok = Tokenizer(models.BPE(vocab={chars[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([MASK_TOKEN])
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(str(directory))
