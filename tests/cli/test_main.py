"""cli/main: the umbrella parser, ``dspark-export`` as a program of its own, no flag abbreviations."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from dspark_trt import __version__
from dspark_trt.cli.main import SUBCOMMANDS, build_command_parser, build_parser


def _all_parsers(parser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _all_parsers(sub)


def test_no_parser_accepts_abbreviations():
    parsers = list(_all_parsers(build_parser())) + [build_command_parser("export", "dspark-export")]
    assert len(parsers) > len(SUBCOMMANDS)  # the bench benchmarks included
    assert [p.prog for p in parsers if p.allow_abbrev] == []


@pytest.mark.parametrize("argv", [["export", "--version-comp"], ["export", "--no-val"], ["tiny-checkpoint", "x", "--for"],
                                  ["generate", "--max-new", "3"]])
def test_a_prefix_of_a_flag_is_a_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err


def run(*argv):
    return subprocess.run([sys.executable, "-c", "import sys; from dspark_trt.cli.export_entry import main; "
                           "sys.exit(main())", *argv], capture_output=True, text=True)


def test_dspark_export_version_and_help_name_the_program():
    proc = run("--version")  # was read as --version-compatible and started an export
    assert proc.returncode == 0 and proc.stdout.strip() == f"dspark-trt {__version__}", proc.stderr
    proc = run("--help")
    assert proc.returncode == 0 and proc.stdout.startswith("usage: dspark-export ")
    assert "--topk" in proc.stdout and "--version-compatible" in proc.stdout


def test_verbosity_flags_still_combine():
    args = build_command_parser("export", "dspark-export").parse_args(["-vv", "-q"])
    assert (args.verbose, args.quiet) == (2, 1)


@pytest.mark.parametrize("value", ["0", "-5", "many", "1.5", ""])
def test_one_topk_rule_and_message_for_every_command(value, tiny_pair, capsys):
    """dspark-export used to read --topk 0 as off and call -5 "not a number"; generate refused 0."""
    from dspark_trt.cli.main import main

    message = f"--topk {value}: use an integer K >= 1 (candidates per draft slot) or 'off' (the dense Markov head)"
    pair = ["--drafter", str(tiny_pair.drafter), "--target", str(tiny_pair.target)]
    for argv in (["export", "--topk", value, "--engine", "none"], ["generate", *pair, "--topk", value, "--input-ids", "1"]):
        assert main(argv) == 1
        assert f"error: {message}" in capsys.readouterr().err.splitlines()


def test_help_lists_every_benchmark(capsys):
    """``dspark --help`` names every ``dspark bench`` subcommand (markov, e2e, serve, report)."""
    from dspark_trt.cli.bench import BENCHMARKS
    from dspark_trt.cli.main import main

    assert main([]) == 2  # no command: the help, exit 2
    line = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("bench "))
    assert {"markov", "e2e", "serve", "report"} <= set(BENCHMARKS)
    assert all(name in line for name in BENCHMARKS), line
