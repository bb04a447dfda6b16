"""The test suite's own rules: a missing or broken package of the environment (vLLM above all)
fails the tests that need it instead of skipping them, and CI stops at a wall limit of its own,
saying so."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def skips_on_imports(path: Path) -> list[str]:
    """Where ``path`` turns an import that fails into a skip: ``pytest.importorskip``, or a
    ``pytest.skip`` whose reason says something is not installed."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        reason = " ".join(
            a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
        )
        if node.func.attr == "importorskip" or (
            node.func.attr == "skip" and "install" in reason.lower()
        ):
            found.append(f"{path.name}:{node.lineno}")
    return found


def test_a_missing_package_fails_instead_of_skipping():
    """The environment the tests run in is the lock's (scripts/setup.sh), vLLM included: a
    test passing there because its import failed would hide a broken install. So no test skips
    on an import, locally or in CI."""
    found = [hit for p in sorted((REPO / "tests").glob("*.py")) for hit in skips_on_imports(p)]
    assert found == []


def test_a_skip_on_an_import_is_found(tmp_path):
    test = tmp_path / "test_x.py"
    test.write_text(
        "import pytest\n"
        "torch = pytest.importorskip('torch')\n"
        "def test_a():\n"
        "    pytest.skip('vLLM is not installed')\n"
        "def test_b():\n"
        "    pytest.skip('this interpreter is the lock\\'s')\n"
    )
    assert skips_on_imports(test) == ["test_x.py:2", "test_x.py:4"]


def test_ci_stops_at_its_wall_limit_and_says_so(tmp_path):
    """.ci/run in a copy whose setup does nothing and whose pytest hangs: stopped at the limit
    (CI_WALL_LIMIT), with the exit status of `timeout` and a line saying why; a pytest that
    fails keeps its own status."""
    (tmp_path / ".ci").mkdir()
    shutil.copy(REPO / ".ci" / "run", tmp_path / ".ci" / "run")
    for script, body in (("scripts/setup.sh", "exit 0"), (".venv/bin/pytest", "sleep 60")):
        path = tmp_path / script
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)

    def ci(limit: str) -> subprocess.CompletedProcess:
        env = {"PATH": "/usr/bin:/bin", "CI_WALL_LIMIT": limit}
        cmd = ["bash", str(tmp_path / ".ci" / "run")]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)

    hung = ci("1s")
    assert hung.returncode == 124
    assert "ran past the wall limit of 1s and were stopped" in hung.stderr
    (tmp_path / ".venv" / "bin" / "pytest").write_text("#!/bin/sh\nexit 3\n")
    failed = ci("10s")
    assert failed.returncode == 3 and "wall limit" not in failed.stderr


def test_ci_runs_the_readmes_test_command_and_keeps_every_tests_duration(tmp_path):
    """The README's test command runs every tier (plain `pytest` runs the quick one), and
    .ci/run is that command with the durations kept: a stand-in pytest that writes a JUnit
    file leaves a durations page beside it."""
    readme = (REPO / "README.md").read_text()
    assert "    scripts/setup.sh && .venv/bin/pytest --full " in readme
    ci_run = (REPO / ".ci" / "run").read_text()
    assert "scripts/setup.sh\n" in ci_run and " .venv/bin/pytest --full --durations=0 " in ci_run
    (tmp_path / ".ci").mkdir()
    shutil.copy(REPO / ".ci" / "run", tmp_path / ".ci" / "run")
    (tmp_path / "tests").mkdir()
    shutil.copy(REPO / "tests" / "durations.py", tmp_path / "tests" / "durations.py")
    junit = (
        '<testsuites><testsuite name="pytest" time="12.5" timestamp="2026-01-01T00:00:00">'
        '<testcase classname="tests.test_a" name="test_one" time="10.0"/>'
        '<testcase classname="tests.test_a" name="test_two" time="0.5"><failure/></testcase>'
        "</testsuite></testsuites>"
    )
    lane = (
        '<testsuites><testsuite name="pytest" time="4.0" timestamp="2026-01-01T00:00:01">'
        '<testcase classname="tests.test_b" name="test_plan" time="3.0"/>'
        "</testsuite></testsuites>"
    )
    # the stand-in pytest writes the JUnit file where --junitxml says and its side lane's
    # beside it (tests/lane.py), and names one test as the quick tier when asked to collect
    pytest_stand_in = (
        'case "$*" in *--collect-only*) echo tests/test_a.py::test_one; exit 0;; esac\n'
        'for a in "$@"; do case "$a" in --junitxml=*) x="${a#--junitxml=}"; '
        f"echo '{junit}' > \"$x\"; echo '{lane}' > \"${{x%.xml}}.lane.xml\";; esac; done"
    )
    for script, body in (
        ("scripts/setup.sh", "exit 0"),
        (".venv/bin/pytest", pytest_stand_in),
        (".venv/bin/python", f'exec {sys.executable} "$@"'),
    ):
        path = tmp_path / script
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "CI_OUT": str(tmp_path / "out")}
    proc = subprocess.run(
        ["bash", str(tmp_path / ".ci" / "run")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "out" / "durations.md").read_text()
    assert "- command: `.ci/run `" in page and "3 tests: 1 failure, 2 passed" in page
    assert "- side lane: 1 tests in a second process beside the main one" in page
    assert "- revision: unknown\n" in page  # what .ci/run saw before the tests (no git here)
    assert "| 10.0 | Q | tests/test_a.py::test_one |" in page
    assert "| tests/test_a.py | 2 | 10.5 | 77.8% |" in page
    assert "| 3.0 |  | tests/test_b.py::test_plan |" in page
