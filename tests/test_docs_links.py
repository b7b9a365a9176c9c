"""Every relative link in README.md and docs/**/*.md resolves: to a file or directory of the repository, and with a
``#fragment`` to a heading of that file under GitHub's anchor rules; a section cited by name after a link
(``[docs/x.md](docs/x.md), "Name"``) is the start of one of its headings. Links inside code are not links."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+(?:\([^()\s]*\))?)(?:\s+\"[^\"]*\")?\)")
CITED = re.compile(r"\]\(([^()\s#]+\.md)\)\)?,? \"([^\"]+)\"")


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def prose(text: str) -> str:
    """The text outside fenced code blocks (kept line for line, so positions still mean something)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def heading_text(raw: str) -> str:
    """A heading as GitHub renders it: links become their text, code and emphasis markers go."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw.strip().rstrip("#").strip())
    return re.sub(r"`|\*\*|__|(?<!\w)[*_]|[*_](?!\w)", "", text)


def slug(text: str) -> str:
    """GitHub's anchor of a heading's text: lower case; letters, digits, spaces, '-' and '_' kept; spaces → '-'."""
    return "".join(c for c in text.lower() if c.isalnum() or c in " -_").replace(" ", "-")


@cache
def headings(path: Path) -> tuple[list[str], set[str]]:
    """(heading texts, anchors) of a Markdown file; a repeated anchor gets -1, -2, … as on GitHub."""
    texts, anchors, seen = [], set(), {}
    for line in prose(path.read_text()).splitlines():
        m = re.match(r"^ {0,3}#{1,6}[ \t]+(.+)$", line)
        if m:
            text = heading_text(m.group(1))
            texts.append(text)
            base = slug(text)
            n = seen.get(base, 0)
            anchors.add(base if n == 0 else f"{base}-{n}")
            seen[base] = n + 1
    anchors.update(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", path.read_text()))
    return texts, anchors


def link_problems(doc: Path) -> list[str]:
    text = INLINE_CODE.sub("", prose(doc.read_text()))
    problems = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, …
            continue
        where, _, fragment = target.partition("#")
        path = (doc.parent / where).resolve() if where else doc
        if where.startswith("/") or not path.is_relative_to(ROOT):
            problems.append(f"{target}: outside the repository")
        elif not path.exists():
            problems.append(f"{target}: no such file")
        elif fragment and path.suffix == ".md" and fragment not in headings(path)[1]:
            problems.append(f"{target}: no heading #{fragment} in {path.relative_to(ROOT)}")
    for where, name in CITED.findall(text):
        path, name = (doc.parent / where).resolve(), " ".join(name.split())
        if path.is_file() and not any(t.lower().startswith(name.lower()) for t in headings(path)[0]):
            problems.append(f'{where}, "{name}": no heading starts so (link #{slug(name)} to one that does)')
    return [f"{doc.relative_to(ROOT)}: {p}" for p in problems]


def test_every_relative_link_resolves_to_a_file_and_heading():
    problems = [p for doc in documents() for p in link_problems(doc)]
    assert problems == []


#: a section cited by name in prose or code: docs/x.md, "Name" (the Markdown link form is in ``CITED``)
NAMED = re.compile(r"((?:docs/)?[\w/.-]+\.md)`?\)?,\s+\"([^\"]{1,80})\"")


def test_every_section_cited_by_name_starts_a_heading():
    """``docs/runtime.md, "Prompts"`` in a document, a docstring or a comment names a heading of that file, or a
    paragraph's bold lead (``**Disk.** An export writes…``)."""
    sources = sorted((ROOT / "dspark_trt").rglob("*.py")) + sorted((ROOT / "examples").rglob("*.py"))
    problems, cited = [], 0
    for path in documents() + sources:
        for where, name in NAMED.findall(path.read_text()):
            name = " ".join(name.split())
            target = ROOT / where if where.startswith("docs/") else path.parent / where
            if path.suffix != ".md" and not where.startswith("docs/") or not target.is_file():
                continue  # an output's file name (OUT/export.md), not a document of this repository
            cited += 1
            named = headings(target.resolve())[0] + re.findall(r"^\*\*(.+?)\*\*", target.read_text(), re.M)
            if not any(heading_text(t).lower().startswith(name.lower()) for t in named):
                problems.append(f'{path.relative_to(ROOT)}: {where}, "{name}"')
    assert cited >= 10 and problems == []


def test_the_readme_links_into_the_docs():
    links = LINK.findall(INLINE_CODE.sub("", prose((ROOT / "README.md").read_text())))
    assert sum(link.startswith("docs/") for link in links) >= 10


def test_the_checker_follows_githubs_anchor_rules(tmp_path):
    assert slug(heading_text("The server (`dspark serve`)")) == "the-server-dspark-serve"
    assert slug(heading_text("Memory and disk: the export streams its weights")) == \
        "memory-and-disk-the-export-streams-its-weights"
    assert slug(heading_text("GPU check: `dspark gpu-check --out DIR` (one GPU, sized for ≤ 8 min on an H200)")) == \
        "gpu-check-dspark-gpu-check---out-dir-one-gpu-sized-for--8-min-on-an-h200"
    assert slug(heading_text("3.1 DeepSeek format")) == "31-deepseek-format"
    assert slug(heading_text("**Bold** and [a link](x.md) and snake_case")) == "bold-and-a-link-and-snake_case"
    doc = tmp_path / "docs" / "a.md"
    doc.parent.mkdir()
    (tmp_path / "docs" / "b.md").write_text("# Title\n\n## Usage\n\n## Usage\n\n```\n# not a heading\n```\n")
    doc.write_text("[ok](b.md#usage) [ok](b.md#usage-1) [bad](b.md#not-a-heading) [bad](c.md) "
                   "`[code](nowhere.md)` [ok](#local)\n\n# Local\n\nSee [b](b.md), \"Usage\"; [b](b.md), \"Prompts\".\n")
    import tests.test_docs_links as checker

    saved = checker.ROOT
    checker.ROOT = tmp_path
    try:
        assert [p.split(": ", 1)[1] for p in link_problems(doc)] == [
            "b.md#not-a-heading: no heading #not-a-heading in docs/b.md", "c.md: no such file",
            'b.md, "Prompts": no heading starts so (link #prompts to one that does)']
    finally:
        checker.ROOT = saved
