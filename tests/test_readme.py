"""The README's two commands are the contract with a new user: keep them true."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_ci_runs_the_readme_test_command():
    test_command = readme_commands()[1]
    assert "pytest" in test_command
    ci_lines = [line for line in (ROOT / ".ci/run").read_text().splitlines() if line and not line.startswith("#")]
    assert test_command in ci_lines


def test_readme_main_command_pins_torch_through_the_constraints():
    main_command = readme_commands()[0]
    assert "-c constraints.txt" in main_command
    assert "torch==2.13.0" in (ROOT / "constraints.txt").read_text()


def test_readme_and_constraints_say_the_same_about_the_constraints():
    """constraints.txt holds the tested versions, used by the README's commands and optional for users."""
    header = (ROOT / "constraints.txt").read_text().lower()
    readme = (ROOT / "README.md").read_text()
    paragraph = next(p for p in readme.split("\n\n") if p.startswith("`constraints.txt`")).lower()
    for words in ("tested with", "optional", "torch>=2.5"):
        assert words in header and words in paragraph, words
    assert "development" not in header + paragraph and "not for users" not in header


def test_readme_main_command_is_the_export_of_the_embedded_pair():
    assert "dspark-export --topk 512" in readme_commands()[0]


@pytest.mark.parametrize("script, expect", [("draft_one_round.py", "top-k  tokens:"),
                                            ("speculative_generate.py", "identical to the target alone: True")])
def test_examples_run(tmp_path, script, expect):
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / script), str(tmp_path / "ex")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert expect in proc.stdout


# -- the commands whose output the README shows ------------------------------------------------------------------
def shown_commands() -> list[tuple[str, list[str]]]:
    """(command, the output lines shown under it) for every ``$ dspark…`` block of the README."""
    shown = []
    for block in re.findall(r"```\n(\$ dspark.+?)\n```", (ROOT / "README.md").read_text(), flags=re.S):
        command, *output = block.splitlines()
        shown.append((command[2:], output))
    return shown


def line_kinds(lines: list[str]) -> list[str]:
    """The first words of the prompt-format line, of each request's "[i]" line and of the summary: a request's
    text may run over several lines (it is printed as written), so its other lines are not kinds."""
    first = lambda line: line.split(" ")[0]  # noqa: E731
    return [first(lines[0]), *(first(x) for x in lines[1:-1] if re.match(r"\[\d+\] ", x)), first(lines[-1])]


def readme_argv(command: str, export: Path) -> list[str]:
    """A shown command as ``dspark`` arguments, its ``out/export`` replaced by ``export``."""
    import shlex

    argv = [str(export) if a == "out/export" else a for a in shlex.split(command)]
    return ["export", *argv[1:]] if argv[0] == "dspark-export" else argv[1:]


@pytest.fixture(scope="module")
def readme_export(tmp_path_factory):
    """The README's export command, run as shown but without engines (TensorRT-RTX builds take minutes):
    the embedded demo pair, top-k 512, bf16, both graphs validated. → (exit status, stdout, export dir)"""
    import contextlib
    import io

    from dspark_trt.cli.main import main

    command = next(c for c, _ in shown_commands() if c.startswith("dspark-export"))
    out = tmp_path_factory.mktemp("readme") / "export"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        status = main([*readme_argv(command, out), "--engine", "none"])
    return status, stdout.getvalue(), out


def test_the_readme_shows_its_export_and_generate_commands():
    commands = [c for c, _ in shown_commands()]
    assert any(c.startswith("dspark-export ") for c in commands)
    assert any(c.startswith("dspark generate ") for c in commands)


@pytest.mark.onnx
@pytest.mark.slow  # the README's export of the embedded pair, validated (~1 min on 2 cores), shared with the next
def test_the_readme_export_command_runs(readme_export):
    status, out, export = readme_export
    assert status == 0 and (export / "manifest.json").is_file()
    shown = next(o for c, o in shown_commands() if c.startswith("dspark-export"))
    assert out.splitlines()[0].split(":")[0] == shown[0].split(":")[0].replace("out/export", str(export))


@pytest.mark.onnx
@pytest.mark.slow
def test_the_readme_generate_commands_run_and_print_what_is_shown(readme_export, capsys):
    """Each shown ``dspark generate`` runs on the README's export and prints lines of the shown kinds (the prompt
    format, one line per request, the summary), not necessarily the same words."""
    from dspark_trt.cli.main import main

    _, _, export = readme_export
    for command, shown in shown_commands():
        if not command.startswith("dspark generate"):
            continue
        assert main(readme_argv(command, export)) == 0, command
        lines = capsys.readouterr().out.strip().splitlines()
        assert line_kinds(lines) == line_kinds(shown), (command, lines, shown)
        assert lines[-1].split(" request(s)")[0] == shown[-1].split(" request(s)")[0]  # "60 tokens for 1"
