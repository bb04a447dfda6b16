"""Lines per library module at two revisions (a refactoring's before and after).

    .venv/bin/python lab/line_counts.py 5e363f8 81d9046 \\
        --out lab/results/code_health/line_counts.json

Counts the lines of every ``src/**/*.py`` file (the pipeline's package and, where there is one,
the lab's) as committed at each revision (``git show``), so the figures do not depend on the
working tree.
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

from eagle3_lab.results import write_result

REPO = Path(__file__).resolve().parents[1]
SRC = "src"


def counts(rev: str) -> dict[str, int]:
    files = subprocess.run(
        ["git", "-C", str(REPO), "ls-tree", "-r", "--name-only", rev, SRC],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    out = {}
    for f in files:
        if f.endswith(".py"):
            text = subprocess.run(
                ["git", "-C", str(REPO), "show", f"{rev}:{f}"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            out[f.removeprefix(SRC + "/")] = len(text.splitlines())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--out")
    a = ap.parse_args()
    before, after = counts(a.before), counts(a.after)
    for name in sorted(set(before) | set(after)):
        print(f"{name:32s} {before.get(name, '-'):>6} {after.get(name, '-'):>6}")
    print(f"{'total':32s} {sum(before.values()):>6} {sum(after.values()):>6}")
    if a.out:
        result = {"revisions": [a.before, a.after], "before": before, "after": after}
        result["total"] = [sum(before.values()), sum(after.values())]
        write_result(a.out, result)


if __name__ == "__main__":
    main()
