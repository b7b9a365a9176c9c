"""Text prompts through the chat template (chat models) or as they are (``runtime/prompting.py``)."""

from __future__ import annotations

import pytest

from dspark_trt.runtime.prompting import encode_chat, encode_prompt, encode_prompts, has_chat_template

TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.fixture(scope="module")
def byte_tokenizers(tmp_path_factory):
    """(plain, chat): the byte-level tokenizer (ids = UTF-8 bytes) without and with a chat template."""
    from transformers import AutoTokenizer

    from dspark_trt.synthetic.byte_tokenizer import write_byte_tokenizer

    out = tmp_path_factory.mktemp("tok")
    write_byte_tokenizer(out)
    plain = AutoTokenizer.from_pretrained(out)
    chat = AutoTokenizer.from_pretrained(out)
    chat.chat_template = TEMPLATE
    return plain, chat


def test_a_chat_tokenizer_gets_one_user_turn_with_the_assistant_turn_opened(byte_tokenizers):
    plain, chat = byte_tokenizers
    assert has_chat_template(chat) and not has_chat_template(plain)
    ids, fmt = encode_prompt(chat, "hi")
    assert fmt == "chat" and ids == list(b"<user>hi\n<assistant>") == encode_chat(chat, "hi")
    assert encode_prompt(chat, "hi", raw=True) == (list(b"hi"), "raw")  # --raw: the text as it is
    assert encode_prompt(plain, "hi") == (list(b"hi"), "raw")  # no template: as it is, no special tokens


def test_encode_prompts_reports_one_format(byte_tokenizers):
    plain, chat = byte_tokenizers
    assert encode_prompts(chat, ["a", "b"]) == ([list(b"<user>a\n<assistant>"), list(b"<user>b\n<assistant>")], "chat")
    assert encode_prompts(chat, ["a"], raw=True) == ([[97]], "raw")
    assert encode_prompts(plain, ["a"]) == ([[97]], "raw")


def test_training_prompts_render_like_generate(byte_tokenizers):
    """The held-out prompts of a pair (``bench report``, ``bench e2e``) and ``dspark generate --prompt`` feed a chat
    turn the same ids; text prompts stay as they are, even for a chat tokenizer."""
    from dspark_trt.training.prompts import render_prompts

    _, chat = byte_tokenizers
    got = render_prompts([("chat", "hi"), ("text", "def f():\n")], chat)
    assert got == [encode_prompt(chat, "hi")[0], list(b"def f():\n")]
    manual = chat.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True)
    manual = manual["input_ids"] if hasattr(manual, "keys") else manual
    assert got[0] == list(manual)  # what render_prompts fed before it shared encode_chat
