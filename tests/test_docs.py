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
# (README.md, docs/) has none. Besides the words of the project's machinery (sessions, leases,
# budgets, allotments, "the issue") the pattern finds those of moving figures off a GPU host
# ("copied off", "did not come home", "brought home", a journal "adopted", "host steps", "within
# one 30-minute host"). "lease" also finds "release" and "lent " finds "equivalent ": reword
# those too. lab/ keeps the record of how figures were made and is not checked.
MAKING_OF = re.compile(
    r"session|lease|lent |brought home|the issue|\bbudget|\ballot"
    r"|\bcop(?:y|ied|ies|ying) off\b|\b(?:come|came|coming) home\b|\badopt"
    r"|\bhost steps?\b|\d+-minute host",
    re.IGNORECASE,
)
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
        "Over three sessions.",
        "The device Lease ran out.",
        "Two leases later.",
        "A machine lent for an hour.",
        "Drafters brought home from the host.",
        "As the issue asked.",
        "Within the time budget.",
        "Budgets of device time.",
        "Within this allotment.",
        "The time allotted to it.",
        "The drafters, copied off the host, were served on the CPU.",
        "Copy off the drafter as soon as it is trained.",
        "Copying off the journals takes a minute.",
        "Not measured: the prepared rows did not come home.",
        "The journal came home in parts.",
        "The synth journal of the earlier run, adopted: no answer asked for again.",
        "The host steps eff_synth and eff_extract.",
        "Its host step q_speed.",
        "Data, trainings and rounds within one 30-minute host.",
    ]
    assert making_of("\n".join(lines)) == lines
    product = [
        "The drafter is served by vLLM.",
        "An issue tracker.",
        "On a GPU host with a package index.",
        "An offline bundle for a host without an index.",
        "Each step copies the hidden states off the GPU into pinned memory.",
        "A 30-minute timeout; a home directory; the step's own loop.",
        "The connector copies each request's states to the CPU.",
    ]
    assert making_of("\n".join(product)) == []


# results.md states results: a figure is named by its file and command, not by the commit that
# made it (a run's outputs record their revision), and the page stays short; superseded figures
# live on results_history.md. A commit id is 7 to 40 hex digits with a digit and a letter; hashes
# inside file names (`bench_eagle3_46463ef.json`) are no separate word and do not count.
COMMIT_ID = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
RESULTS_PAGES = [REPO / "docs" / "results.md", REPO / "docs" / "results_history.md"]


@pytest.mark.parametrize("page", RESULTS_PAGES, ids=lambda p: p.name)
def test_the_results_pages_cite_no_commits(page):
    hits = [line.strip() for line in page.read_text().splitlines() if COMMIT_ID.search(line)]
    assert hits == [], hits


def test_results_md_stays_short():
    assert len((REPO / "docs" / "results.md").read_text().splitlines()) < 465


def test_the_commit_pattern_finds_commits_only():
    commits = ["Run at 0c76456 on an H200.", "(4cea71a row)", "revision 803db59-dirty"]
    assert [c for c in commits if COMMIT_ID.search(c)] == commits
    others = [
        "`default_run/bench_eagle3_46463ef.json`",
        "`default_run/full_run_e8cdefe.json`",
        "1234567 tokens, 0.00235 error, 7e-5, 2,316 B a token",
        "deadbeefcafe and facade: letters only",
    ]
    assert [o for o in others if COMMIT_ID.search(o)] == []
