"""The byte-level tokenizer synthetic targets ship with."""

from __future__ import annotations

from dspark_trt.synthetic.byte_tokenizer import write_byte_tokenizer


def test_byte_tokenizer_ids_are_utf8_bytes(tmp_path):
    from transformers import AutoTokenizer

    write_byte_tokenizer(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    text = "Grüße, DSpark!"
    assert tok.encode(text, add_special_tokens=False) == list(text.encode("utf-8"))
    assert tok.decode(list(text.encode("utf-8"))) == text
    assert len(tok) == 257 and tok.convert_tokens_to_ids("<|mask|>") == 256
