"""The serve settings, listed once (serving/settings.py): the CLI options of ``dspark serve`` and ``dspark
triton-repo`` are generated from them, and what the command line says reaches the options unchanged."""

from __future__ import annotations

from dataclasses import fields

import pytest

from dspark_trt.cli.main import build_command_parser
from dspark_trt.serving.settings import (DecodeSettings, ModelSettings, RepositorySettings, ServeOptions,
                                         setting_of)


def _actions(command: str) -> dict:
    parser = build_command_parser(command, f"dspark {command}")
    return {flag: action for action in parser._actions for flag in action.option_strings}


@pytest.mark.parametrize("command, cls", [("serve", ServeOptions), ("triton-repo", RepositorySettings)])
def test_cli_options_are_generated_from_the_settings(command, cls):
    actions = _actions(command)
    for f in fields(cls):
        s = setting_of(f)
        if s is None or s.flag is None:
            continue
        action = actions[s.flag]
        assert (action.dest, action.help) == (f.name, s.help)
        assert action.default == f.default
        if s.off is not None:
            assert actions[s.off[0]].help == s.off[1]


def test_both_commands_share_the_decode_and_instance_flags():
    serve, repo = _actions("serve"), _actions("triton-repo")
    for f in fields(RepositorySettings):
        flag = setting_of(f).flag
        assert serve[flag].help == repo[flag].help and serve[flag].default == repo[flag].default
    assert serve["--runtime"].choices == ("tensorrt", "onnxruntime")  # a checkpoint is served as an export
    assert "torch" in repo["--runtime"].choices


def test_serve_command_line_to_options(tmp_path):
    from dspark_trt.cli.serve import _options

    template = tmp_path / "chat.jinja"
    template.write_text("{{ messages }}")
    parser = build_command_parser("serve", "dspark serve")
    args = parser.parse_args(["--no-openai", "--no-restart", "--threads", "2", "--gpus", "0,1", "--timeout", "5",
                              "--topk", "off", "--verify-drafts", "auto", "--chat-template", str(template)])
    options = _options(args)
    assert (options.openai_port, options.restart, options.threads, options.gpus) == (None, False, 2, [0, 1])
    assert (options.startup_timeout, options.topk, options.verify_drafts) == (5.0, None, "auto")  # off: dense
    assert options.chat_template == "{{ messages }}"
    assert options.repository_flags == ["--topk", "--verify-drafts", "--threads", "--gpus"]
    assert options.writer_options()["topk"] is None  # dense, written "off"
    defaults = _options(parser.parse_args([]))
    assert defaults == ServeOptions() and defaults.repository_flags == []


def test_bad_gpus_are_argparse_errors_in_their_own_words(capsys):
    parser = build_command_parser("triton-repo", "dspark triton-repo")
    with pytest.raises(SystemExit):
        parser.parse_args(["-o", "r", "--gpus", "a,b"])
    assert "--gpus takes device ids separated by commas" in capsys.readouterr().err


def test_model_parameters_are_the_decode_settings_and_the_source(tmp_path):
    s = ModelSettings(export_dir=str(tmp_path), runtime="tensorrt", topk=None, max_queue=4)
    assert s.device == "cuda"  # the runtime's device when none is given
    assert set(s.to_parameters()) <= {f.name for f in fields(ModelSettings)}
    assert {f.name for f in fields(DecodeSettings)} < {f.name for f in fields(ModelSettings)}
    assert ModelSettings.from_parameters(s.to_parameters()) == s


def test_triton_repo_topk_off_is_written_as_dense(tiny_pair, tmp_path):
    from dspark_trt.serving.repository import read_model_config, write_model_repository

    repo = write_model_repository(tmp_path / "repo", drafter_dir=tiny_pair.drafter, target_dir=tiny_pair.target,
                                  topk=None, gpus=None)
    params = read_model_config(repo / "dspark" / "config.pbtxt").parameters
    assert params["topk"].string_value == "off"  # dense, as topk.topk_text writes it
