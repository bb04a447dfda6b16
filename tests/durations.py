"""Per-test durations of a run, from its JUnit XML (``pytest --junitxml``), as Markdown: the
run's wall time and where it went, by tier, by module and by test. `.ci/run` writes one for
every CI run, in $CI_OUT beside the JUnit file.

    .venv/bin/python tests/durations.py RUN.xml --command "..." --note "what else ran" \
        [--revision "$(git describe --always --dirty)"] > out.md

The side lane's JUnit XML (``RUN.lane.xml``, tests/lane.py) is read too when it is there.
Each test's seconds are its set-up, call and tear-down together (pytest's JUnit default), so
a session fixture's cost lands on the first test that asks for it. The quick tier is what plain
`pytest` selects (`pytest --collect-only -q`, run here unless ``--quick`` gives its output).
"""

from __future__ import annotations

import argparse
import collections
import os
import platform
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def read_junit(path: Path) -> tuple[dict, list[dict]]:
    """The session's attributes and one dict per test case (id, seconds, outcome)."""
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    props = {p.get("name"): p.get("value") for p in suite.iterfind("properties/property")}
    cases = []
    for case in suite.iter("testcase"):
        module = case.get("classname", "").split(".")
        file = "tests/" + module[1] + ".py" if len(module) > 1 else case.get("file", "?")
        name = case.get("name")
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = tag
        cases.append(
            {
                "id": f"{file}::{name}",
                "file": file,
                "s": float(case.get("time", 0)),
                "outcome": outcome,
            }
        )
    return {**suite.attrib, "properties": props}, cases


def quick_tier(listing: Path | None) -> set[str]:
    """The ids plain `pytest` selects: from ``listing`` (the output of `pytest --collect-only
    -q`), else asked here."""
    if listing is not None:
        text = listing.read_text()
    else:
        cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
        text = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True).stdout
    return {line.strip() for line in text.splitlines() if "::" in line}


def machine() -> str:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    mem_kib = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal")
    )
    python = platform.python_version()
    return f"{os.cpu_count()} cores ({cpu}), {mem_kib / 2**20:.0f} GiB, Python {python}"


def minutes(s: float) -> str:
    return f"{s / 60:.1f} min"


def revision() -> str:
    """``git describe --always --dirty`` of this checkout, now."""
    from eagle3_pipeline.runtime.provenance import code_version

    return code_version()["git"] or "unknown"


def render(
    attrs: dict, cases: list[dict], quick: set[str], command: str, note: str, rev: str = ""
) -> str:
    wall = float(attrs.get("time", 0))
    total = sum(c["s"] for c in cases)
    outcomes = collections.Counter(c["outcome"] for c in cases)
    in_quick = [c for c in cases if c["id"] in quick]
    lines = [
        "# Test durations",
        "",
        "Written by `tests/durations.py` from the JUnit XML of one run (`.ci/run` writes one "
        "for every CI run).",
        "",
        f"- command: `{command}`",
        f"- revision: {rev or revision()}",
        f"- machine: {machine()}",
        f"- started: {attrs.get('timestamp', '?')}; wall time {minutes(wall)} "
        f"({wall:.0f} s), {len(cases)} tests: "
        + ", ".join(f"{n} {k}" for k, n in sorted(outcomes.items())),
    ]
    for name, value in attrs.get("properties", {}).items():
        if name.startswith("shared run "):
            lines.append(f"- {name} (made in the background, from the session's start): {value}")
    if attrs.get("lane"):
        lines.append(f"- side lane: {attrs['lane']}")
    if note:
        lines.append(f"- beside it: {note}")
    lines += [
        f"- quick tier (plain `pytest`): {len(in_quick)} of these tests, "
        f"{minutes(sum(c['s'] for c in in_quick))} of their time",
        "",
        "## By module",
        "",
        "| module | tests | seconds | share |",
        "|---|---:|---:|---:|",
    ]
    by_file: dict[str, list[dict]] = collections.defaultdict(list)
    for c in cases:
        by_file[c["file"]].append(c)
    for file, group in sorted(by_file.items(), key=lambda kv: -sum(c["s"] for c in kv[1])):
        s = sum(c["s"] for c in group)
        lines.append(f"| {file} | {len(group)} | {s:.1f} | {100 * s / total:.1f}% |")
    lines += [
        "",
        "## By test (1 s and more; Q: in the quick tier)",
        "",
        "| seconds | tier | test |",
        "|---:|---|---|",
    ]
    shown = [c for c in sorted(cases, key=lambda c: -c["s"]) if c["s"] >= 1.0]
    for c in shown:
        flag = "" if c["outcome"] == "passed" else f" ({c['outcome']})"
        lines.append(f"| {c['s']:.1f} | {'Q' if c['id'] in quick else ''} | {c['id']}{flag} |")
    rest = [c for c in cases if c["s"] < 1.0]
    lines.append(
        f"\n{len(rest)} more tests took under a second each ({sum(c['s'] for c in rest):.1f} s)."
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("junit", type=Path)
    ap.add_argument("--command", required=True, help="the command that ran the tests")
    ap.add_argument("--note", default="", help="what else ran on the machine meanwhile")
    ap.add_argument("--quick", type=Path, help="`pytest --collect-only -q` (default: run it)")
    ap.add_argument(
        "--revision", default="", help="the code the tests ran (default: git describe, now)"
    )
    args = ap.parse_args()
    attrs, cases = read_junit(args.junit)
    lane = args.junit.with_suffix(".lane.xml")  # the side lane's tests (tests/lane.py)
    if lane.exists():
        lane_attrs, lane_cases = read_junit(lane)
        cases += lane_cases
        attrs["lane"] = (
            f"{len(lane_cases)} tests in a second process beside the main one "
            f"(tests/lane.py), {float(lane_attrs.get('time', 0)):.0f} s from its start"
        )
    quick = quick_tier(args.quick)
    sys.stdout.write(render(attrs, cases, quick, args.command, args.note, args.revision))


if __name__ == "__main__":
    main()
