"""Style never drifts: ruff (lint rules and format, configured in pyproject.toml) over the Python
code and snakefmt over the Snakefile and rules/*.smk. Both come pinned in envs/cpu-lock.txt."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.fail(
            f"{name} is not installed in {BIN}: scripts/setup.sh installs envs/cpu-lock.txt"
        )
    return str(path)


def run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_ruff_lint_is_clean():
    proc = run(tool("ruff"), "check", "--no-cache", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format_is_applied():
    proc = run(tool("ruff"), "format", "--check", "--no-cache", ".")
    assert proc.returncode == 0, "run `ruff format .`:\n" + proc.stdout + proc.stderr


def test_snakefmt_is_applied():
    proc = run(tool("snakefmt"), "--check", "Snakefile", "rules")
    assert proc.returncode == 0, "run `snakefmt Snakefile rules`:\n" + proc.stdout + proc.stderr
