"""deploy/docker/Dockerfile, checked statically: no container engine runs on the project's machines (so it is
never built here; docs/deploy.md says so). Parsed instruction by instruction, the way the Dockerfile frontend
reads it (continuation lines joined, comments dropped), and held to the repository: what it copies exists,
its pip line names extras pyproject.toml defines and the repository's constraints, its entrypoint is the
`dspark` console script, its default command parses with `dspark serve`'s own parser, and its ports, stop
signal and health check are the chart's."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
VALUES = ROOT / "deploy" / "helm" / "dspark-serve" / "values.yaml"


def instructions(text: str) -> list[tuple[str, str]]:
    out, buf = [], ""
    for line in text.splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        op, _, rest = buf.strip().partition(" ")
        out.append((op.upper(), rest.strip()))
        buf = ""
    assert not buf, "a continuation line ends the file"
    return out


@pytest.fixture(scope="module")
def parsed():
    return instructions(DOCKERFILE.read_text())


def one(parsed, op):
    found = [rest for o, rest in parsed if o == op]
    assert len(found) == 1, f"{op}: {len(found)} instructions"
    return found[0]


def test_known_instructions_only(parsed):
    known = {"FROM", "ARG", "ENV", "WORKDIR", "COPY", "RUN", "EXPOSE", "STOPSIGNAL", "HEALTHCHECK", "ENTRYPOINT",
             "CMD", "USER", "LABEL"}
    assert {op for op, _ in parsed} <= known, {op for op, _ in parsed} - known
    assert parsed[0][0] == "FROM"


def test_base_is_a_pinned_triton_server_image(parsed):
    assert re.fullmatch(r"nvcr\.io/nvidia/tritonserver:\d{2}\.\d{2}-py3", one(parsed, "FROM")), one(parsed, "FROM")


def test_copied_paths_exist(parsed):
    for o, rest in parsed:
        if o == "COPY":
            *sources, _dest = shlex.split(rest)
            for s in sources:
                assert (ROOT / s).exists(), f"COPY {s}: not in the repository"
    ignore = (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text()
    for o, rest in parsed:  # the build context keeps what is copied
        if o == "COPY":
            for s in shlex.split(rest)[:-1]:
                assert f"!{s.rstrip('/')}" in ignore.replace("/\n", "\n"), s


def test_install_line_matches_the_project(parsed):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [install] = [r for o, r in parsed if o == "RUN" and "pip install" in r]
    words = shlex.split(install)
    assert words[words.index("-c") + 1] == "constraints.txt"
    [spec] = [w for w in words if w.startswith(".[")]
    extras = spec[2:-1].split(",")
    assert "serve" in extras
    assert set(extras) <= set(project["project"]["optional-dependencies"]), extras
    assert "dspark --version" in install  # the console script runs once installed


def test_entrypoint_and_command_are_dspark_serve(parsed):
    from dspark_trt.cli.main import build_command_parser

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    entry = json.loads(one(parsed, "ENTRYPOINT"))
    assert entry == ["dspark"] and "dspark" in project["project"]["scripts"]
    cmd = json.loads(one(parsed, "CMD"))
    assert cmd[0] == "serve"
    try:
        args = build_command_parser("serve", "dspark serve").parse_args(cmd[1:])
    except SystemExit:
        pytest.fail(f"CMD {cmd} does not parse as dspark serve's arguments")
    assert args.host == "0.0.0.0" and args.metrics_host == "0.0.0.0"


def test_ports_signal_and_health_match_the_chart(parsed):
    ports = yaml.safe_load(VALUES.read_text())["ports"]
    assert sorted(int(p) for p in one(parsed, "EXPOSE").split()) == sorted([ports["openai"], ports["metrics"]])
    assert one(parsed, "STOPSIGNAL") == "SIGTERM"
    health = one(parsed, "HEALTHCHECK")
    assert f"127.0.0.1:{ports['openai']}/health/live" in health


def test_parser_reads_continuations():
    got = instructions("FROM a\n# c\nRUN x \\\n  # inner comment\n  y\nCMD [\"z\"]\n")
    assert got == [("FROM", "a"), ("RUN", "x    y"), ("CMD", '["z"]')]
