"""The package is imported from an install or from PYTHONPATH, never by a file editing sys.path:
such an edit hides which copy of the code runs. The few files that still need one are listed."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# sys.path.insert(...), .append/.extend/.remove/.pop/.clear, sys.path = ..., sys.path += ...,
# sys.path[...] = ..., site.addsitedir(...)
SYS_PATH_EDIT = re.compile(
    r"\bsys\.path\s*\.\s*(insert|append|extend|remove|pop|clear)\s*\("
    r"|\bsys\.path\s*(\[[^\]]*\]\s*)?\+?=(?!=)"
    r"|\bsite\.addsitedir\s*\("
)

ALLOWED = {
    # pytest's own setup: the tests' helper modules (smkcli, train_fixtures, ...) as modules
    "tests/conftest.py",
    "lab/tests/conftest.py",
    # Snakemake plans with this checkout's src/, not an installed copy of the package (the
    # editable install names one checkout; the tests plan edited copies of the workflow, and
    # staleness.code.code_hash must hash the code that the jobs run)
    "rules/common.smk",
}
SKIP_DIRS = {".venv", ".git", ".snakemake", "results", ".cache", "__pycache__", "node_modules"}


def code_files() -> list[Path]:
    found = []
    for path in REPO.rglob("*"):
        rel = path.relative_to(REPO)
        if set(rel.parts) & SKIP_DIRS or not path.is_file():
            continue
        if path.suffix in (".py", ".smk") or path.name == "Snakefile":
            found.append(path)
    return found


def sys_path_edits(text: str) -> list[str]:
    """The lines of ``text`` that edit sys.path (comments left out)."""
    return [
        line.strip() for line in text.splitlines() if SYS_PATH_EDIT.search(line.split("#", 1)[0])
    ]


def test_the_pattern_finds_every_kind_of_edit():
    p, s = "sys.path", "site"  # examples built, so that this file does not match itself
    edits = [
        f'{p}.insert(0, str(REPO / "src"))',
        f"{p}.append(here)",
        f"{p}[:0] = [src]",
        f"{p} += [src]",
        f"{p} = [src, *{p}]",
        f"{s}.addsitedir(src)",
    ]
    assert sys_path_edits("\n".join(edits)) == edits
    reads = [f"if src not in {p}:", f"print({p})", f"ok = {p} == []", f"# {p}.insert(0, src)"]
    assert sys_path_edits("\n".join(reads)) == []


def test_no_sys_path_edits_outside_the_allowed_files():
    files = code_files()
    assert any(p.name == "conftest.py" for p in files) and len(files) > 50
    edits = {
        str(p.relative_to(REPO)): found
        for p in files
        if (found := sys_path_edits(p.read_text(errors="replace")))
    }
    unexpected = {f: e for f, e in edits.items() if f not in ALLOWED}
    assert unexpected == {}, (
        "import the package from its install or PYTHONPATH=src instead of editing sys.path: "
        f"{unexpected}"
    )
    # an allowed file that no longer edits sys.path leaves the list
    assert set(edits) >= ALLOWED - {p for p in ALLOWED if not (REPO / p).exists()}, ALLOWED - set(
        edits
    )
