"""The lab's tests use the repository's test helpers (tests/smkcli.py) and its session
fixtures (the packaged target, the trained drafters of tests/train_fixtures.py). They are not
part of the default test run (pyproject.toml's testpaths is tests/); run them with
``pytest lab/tests``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2] / "tests"
sys.path.insert(0, str(TESTS))

# tests/conftest.py under a name of its own (this file is `conftest` while lab/tests runs alone)
_spec = importlib.util.spec_from_file_location("repo_tests_conftest", TESTS / "conftest.py")
_repo_conftest = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _repo_conftest
_spec.loader.exec_module(_repo_conftest)

from repo_tests_conftest import *  # noqa: F403  (its fixtures and helpers, CACHE among them)
