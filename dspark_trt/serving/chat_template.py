"""The chat template dspark-trt ships, for a tokenizer that has none.

``plain_chat.jinja`` (beside this module, installed with the package) renders each message on its own line
as ``Role: text`` and opens the reply with ``Assistant:``; it uses no special tokens, so any tokenizer can
encode it. ``dspark serve`` with no SOURCE (the embedded demo pair, whose byte tokenizer has no template)
serves chat with it; any other model whose tokenizer has no template refuses chat with ``no_template_message``,
which names the flag and this file.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["PLAIN_CHAT_TEMPLATE", "plain_chat_template", "no_template_message"]

#: the shipped template (dspark_trt/serving/plain_chat.jinja)
PLAIN_CHAT_TEMPLATE = Path(__file__).resolve().with_name("plain_chat.jinja")


def plain_chat_template() -> str:
    """The shipped template's text."""
    return PLAIN_CHAT_TEMPLATE.read_text()


def no_template_message() -> str:
    """Why chat is refused for a tokenizer without a template, and the exact flag that fixes it."""
    return (f"the model's tokenizer has no chat template: start dspark serve with --chat-template "
            f"{PLAIN_CHAT_TEMPLATE} (dspark-trt's plain 'User: … / Assistant:' template) or a template of your own, "
            f"or use /v1/completions")
