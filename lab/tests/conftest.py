"""The lab's tests use the repository's test helpers (tests/smkcli.py). They are not part of the
default test run (pyproject.toml's testpaths is tests/); run them with ``pytest lab/tests``."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
