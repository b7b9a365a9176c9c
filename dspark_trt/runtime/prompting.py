"""Text prompts → token ids, the way the target was trained to read them.

A chat model (its tokenizer carries a chat template: SmolLM2-Instruct, Qwen3, Llama-3-Instruct, …) learned
conversations, not bare text: fed a bare question, SmolLM2-135M-Instruct answers EOS at once. Like a
chat-serving engine given a chat request, ``encode_prompt`` renders a text as one user turn with the
assistant turn opened, through the tokenizer's own template, and feeds any other text as it is. It says which
it did (``"chat"`` or ``"raw"``), so an output or a benchmark can state what the model was asked.

    ids, fmt = encode_prompt(tokenizer, "What is the capital of France?")        # fmt == "chat" for SmolLM2
    ids, fmt = encode_prompt(tokenizer, "The history of Rome", raw=True)         # fmt == "raw": text as is

``training/prompts.py`` renders its chat prompts with ``encode_chat``, so the held-out prompts of a pair
(``prompts.json``) and ``dspark generate --prompt`` feed a chat turn the same token ids.
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["CHAT", "RAW", "has_chat_template", "encode_chat", "encode_prompt", "encode_prompts"]

CHAT, RAW = "chat", "raw"  # how a text prompt was fed


def has_chat_template(tokenizer) -> bool:
    """Whether ``tokenizer`` carries a chat template (a chat / instruct model's tokenizer does)."""
    return bool(getattr(tokenizer, "chat_template", None))


def encode_chat(tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` as one user turn, the assistant turn opened (the tokenizer's chat template)."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        tokenize=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids  # some versions return a BatchEncoding
    return [int(i) for i in ids]


def encode_prompt(tokenizer, text: str, *, raw: bool = False) -> tuple[list[int], str]:
    """(token ids, ``"chat"`` | ``"raw"``): through the chat template when the tokenizer has one and ``raw`` is
    False, else the text's own tokens (no special tokens added)."""
    if not raw and has_chat_template(tokenizer):
        return encode_chat(tokenizer, text), CHAT
    return [int(i) for i in tokenizer.encode(text, add_special_tokens=False)], RAW


def encode_prompts(tokenizer, texts: Sequence[str], *, raw: bool = False) -> tuple[list[list[int]], str]:
    """``encode_prompt`` for each text → (id lists, the one format used for all of them)."""
    fmt = RAW if raw or not has_chat_template(tokenizer) else CHAT
    return [encode_prompt(tokenizer, t, raw=raw)[0] for t in texts], fmt
