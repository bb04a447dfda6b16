"""The side lane (tests/lane.py), tried in a pytest of its own: with --full over the whole
suite, the light modules run in a second process, whose failures fail the session."""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
# four pytest processes: more than the quick tier has room for
pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
IN_THE_LANE = """
import os

def test_in_the_lane():
    assert os.environ["EAGLE3_TESTS_LANE"] == "child"
    assert {ok}
"""
IN_THE_SESSION = """
import os

def test_in_the_session():
    assert os.environ.get("EAGLE3_TESTS_LANE", "") == ""
"""


@pytest.fixture
def suite(pytester):
    for name in ("tiers.py", "lane.py"):
        shutil.copy(HERE / name, pytester.path / name)
    pytester.makeconftest('pytest_plugins = ["tiers", "lane"]\n')
    pytester.makeini("[pytest]\ntestpaths = .\n")
    pytester.makepyfile(test_session=IN_THE_SESSION)
    return pytester


def test_the_light_modules_run_beside_the_session(suite):
    suite.makepyfile(test_config=IN_THE_LANE.format(ok=True))
    result = suite.runpytest_subprocess("--full", "--junitxml=run.xml")
    result.assert_outcomes(passed=1)  # the session's own test; the lane's ran beside it
    result.stdout.fnmatch_lines(["side lane: 1 tests of 1 modules run in a second process*"])
    result.stdout.fnmatch_lines(["side lane: exit 0 (1 tests)"])
    lane = ET.parse(suite.path / "run.lane.xml").getroot()
    assert [c.get("name") for c in lane.iter("testcase")] == ["test_in_the_lane"]
    assert result.ret == 0
    # without --full, or with tests named, everything stays in one process
    suite.runpytest_subprocess("test_config.py", "--full").assert_outcomes(failed=1)


def test_a_failure_in_the_lane_fails_the_session_and_is_shown(suite):
    suite.makepyfile(test_config=IN_THE_LANE.format(ok="1 == 2"))
    result = suite.runpytest_subprocess("--full")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*FAILURES*", "*assert 1 == 2*", "side lane: exit 1 *"])
