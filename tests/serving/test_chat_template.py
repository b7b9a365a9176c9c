"""dspark-trt's shipped chat template (dspark_trt/serving/plain_chat.jinja): it renders a conversation with the demo
pair's byte tokenizer, ships with the package, serves chat on ``dspark serve`` with no SOURCE, and is what the
refusal of a tokenizer without a template names. The chat call itself, through the ``openai`` client on a real
server: tests/serving/test_dspark_serve.py."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

from dspark_trt.serving.chat_template import PLAIN_CHAT_TEMPLATE, no_template_message, plain_chat_template

ROOT = Path(__file__).resolve().parents[2]


def test_the_plain_template_renders_a_conversation_with_the_demo_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    from dspark_trt.runtime.prompting import has_chat_template
    from dspark_trt.synthetic.byte_tokenizer import write_byte_tokenizer

    write_byte_tokenizer(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert not has_chat_template(tok)  # the demo pair's tokenizer (and so `dspark generate` feeds text raw)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What does the verifier do?"},
                {"role": "assistant", "content": "It checks."}, {"role": "user", "content": "And then?"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                   chat_template=plain_chat_template())
    assert text == "System: Be brief.\nUser: What does the verifier do?\nAssistant: It checks.\nUser: And then?\nAssistant:"
    assert tok.apply_chat_template(messages[1:2], tokenize=False, chat_template=plain_chat_template()) == \
        "User: What does the verifier do?\n"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text  # no special tokens: bytes round-trip


def test_the_template_ships_with_the_package():
    assert PLAIN_CHAT_TEMPLATE == ROOT / "dspark_trt" / "serving" / "plain_chat.jinja" and PLAIN_CHAT_TEMPLATE.is_file()
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert any(fnmatch.fnmatch(PLAIN_CHAT_TEMPLATE.name, pattern) for pattern in data["dspark_trt.serving"])
    assert "dspark_trt/serving/plain_chat.jinja" in (ROOT / "docs" / "serving.md").read_text()


def test_the_refusal_names_the_flag_and_the_shipped_file():
    message = no_template_message()
    assert f"--chat-template {PLAIN_CHAT_TEMPLATE} " in message and "/v1/completions" in message


@pytest.fixture
def started(monkeypatch, tiny_pair):
    """``dspark serve`` up to its Deployment: the options it was given (the demo pair is the tiny pair here)."""
    import dspark_trt.demo.pair
    import dspark_trt.serving.deployment

    seen = {}

    class Stop(Exception):
        pass

    class FakeDeployment:
        def __init__(self, source, options):
            seen["source"], seen["options"] = source, options
            self.server = None

        def start(self):
            raise Stop

        def stop(self):
            return None

    monkeypatch.setattr(dspark_trt.demo.pair, "embedded_pair", lambda: (tiny_pair.drafter, tiny_pair.target))
    monkeypatch.setattr(dspark_trt.serving.deployment, "Deployment", FakeDeployment)

    def run(*argv):
        from dspark_trt.cli.main import build_command_parser
        from dspark_trt.cli.serve import run

        with pytest.raises(Stop):
            run(build_command_parser("serve", "dspark serve").parse_args(list(argv)))
        return seen["options"]

    return run


def test_serve_without_a_source_serves_chat_with_the_plain_template(started, tiny_pair, tmp_path):
    assert started().chat_template == plain_chat_template()
    own = tmp_path / "own.jinja"
    own.write_text("{{ messages[0]['content'] }}")
    assert started("--chat-template", str(own)).chat_template == own.read_text()  # a template given wins
    assert started(str(tiny_pair.drafter), "--target", str(tiny_pair.target)).chat_template is None  # a model: its own


def test_the_ready_line_says_which_template_serves_chat():
    from dspark_trt.cli.serve import _chat_note

    def frontend(available, template):
        return SimpleNamespace(chat_available=available, config=SimpleNamespace(chat_template=template))

    assert _chat_note(frontend(True, plain_chat_template())) == "chat: yes, dspark-trt's plain User/Assistant template"
    assert _chat_note(frontend(True, None)) == "chat: yes"
    assert f"--chat-template {PLAIN_CHAT_TEMPLATE}" in _chat_note(frontend(False, None))
