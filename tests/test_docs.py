"""Every relative link in the user documentation resolves: the file exists, and a `#anchor`
names a heading of the file it points into (as GitHub makes anchors from headings). README.md
and docs/ say nothing about how the project was made."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted(
    [
        REPO / "README.md",
        REPO / "benchmarks" / "README.md",
        *REPO.glob("docs/*.md"),
        *REPO.glob("lab/*.md"),
    ]
)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def prose(text: str) -> str:
    """The text without fenced and indented code blocks (links there are not links)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if fenced or line.startswith("    "):
            continue
        out.append(line)
    return "\n".join(out)


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation other than '-' and '_' dropped, spaces
    to '-', a repeated anchor numbered."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose(path.read_text()).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def relative_links(path: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(prose(path.read_text()))
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target)  # http:, https:, mailto:
    ]


def test_the_documents_are_found():
    names = {p.relative_to(REPO).as_posix() for p in DOCS}
    assert {"README.md", "docs/results.md", "lab/README.md", "benchmarks/README.md"} <= names


def dead_links(doc: Path) -> list[str]:
    dead = []
    for target in relative_links(doc):
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists():
            dead.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            dead.append(f"{target}: no heading #{anchor} in {dest.name}")
    return dead


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_resolve(doc):
    dead = dead_links(doc)
    assert not dead, f"{doc.relative_to(REPO)}: dead links:\n  " + "\n  ".join(dead)


def test_a_dead_link_is_found(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## A section's title\n")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "See [ok](other.md#a-sections-title), [gone](missing.md), [bad anchor](other.md#nope),\n"
        "[here](#top), [web](https://example.com/x.md) and ![img](other.md).\n\n"
        "    [in code](not-a-link.md)\n\n# Top\n"
    )
    assert dead_links(doc) == [
        "missing.md: no such file",
        "other.md#nope: no heading #nope in other.md",
    ]


def test_the_anchor_rule_follows_github():
    """The slug rule on headings this repository uses: code, apostrophes, a '+', numbering."""
    doc = REPO / "docs" / "architecture.md"
    assert "the-bench-stages-rounds" in anchors(doc)  # "The bench stage's rounds"
    assert "hidden_statesmanifestjson" in anchors(doc)  # "hidden_states/manifest.json"
    assert "1-environment" in anchors(REPO / "docs" / "cluster.md")  # "1. Environment"


# Words about how the project was made, not about what it does: the user documentation
# (README.md, docs/) has none. The pattern is that of
# `grep -riE "session|lease|lent |brought home|the issue" README.md docs/`, so it also
# finds "release" or "equivalent ": reword those too, the grep is then clean.
MAKING_OF = re.compile(r"session|lease|lent |brought home|the issue|\bbudget", re.IGNORECASE)
USER_DOCS = sorted([REPO / "README.md", *REPO.glob("docs/*.md")])


def making_of(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if MAKING_OF.search(line)]


def test_the_user_docs_say_nothing_about_how_the_project_was_made():
    assert len(USER_DOCS) > 5
    found = {
        str(p.relative_to(REPO)): hits for p in USER_DOCS if (hits := making_of(p.read_text()))
    }
    assert found == {}, found


def test_the_making_of_pattern_finds_its_words():
    lines = [
        "Measured in the GPU session of 3 December.",
        "The device Lease ran out.",
        "A machine lent for an hour.",
        "Drafters brought home from the host.",
        "As the issue asked.",
        "Within the time budget.",
    ]
    assert making_of("\n".join(lines)) == lines
    assert making_of("The drafter is served by vLLM.\nAn issue tracker.") == []
