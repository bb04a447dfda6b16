"""The side lane: with ``--full`` over the whole suite, the modules that start no server, no
training and read no shared run (dry-run plans, configs, documented commands, interrupted
Snakemake runs of stand-in jobs, unit tests of a few seconds and more) run in a second pytest
process beside this one.

Why: the suite is CPU-bound on 2 cores. While the whole-DAG runs are made in the background
(tests/dag_runs.py) both cores are busy; once they are done, the tests that are left run one
at a time and the other core idles (about half of the last ten minutes of a full run:
benchmarks/results/tests/vmstat_full_run.txt). The lane starts with the session: what it takes
from the busy part it gives back at the end, where this session runs alone.

The lane runs the same pytest with the same options on whole files (:data:`MODULES`): its
output goes to ``side_lane/lane.log`` in the session's temporary directory, its JUnit XML beside
this session's (``<name>.lane.xml``, which tests/durations.py reads too); this session waits
for it at its end, prints its summary, and fails when it failed. A module of the list that
holds a test with a server, training, e2e or slurm mark stays in this session whole, unless its
servers are its own (:data:`OWN_SERVERS`).
``EAGLE3_TESTS_LANE=off`` keeps every test in one process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import tiers

HERE = Path(__file__).resolve().parent
ENV = "EAGLE3_TESTS_LANE"  # "child" in the lane's own process, "off" to keep one process
MODULES = (
    "test_workflow_plans.py",
    "test_cluster_docs.py",
    "test_workflow.py",
    "test_interrupted.py",
    "test_plan.py",
    "test_config.py",
    "test_tiers.py",
    "test_bad_input_generated.py",
    "test_reuse.py",
    "test_extract_unit.py",
    "test_bad_input.py",
    "test_online_unit.py",
    "test_pool_clean.py",
    "test_client.py",
    "test_reasoning_templates.py",
    "test_prompt_suites.py",
    "test_reasoning_check.py",
)
HEAVY = {"server", "training", "e2e", "slurm"}
# modules of MODULES whose servers are their own: their whole-DAG run starts them, no session
# fixture it shares with this session does (in the lane it would be made twice)
OWN_SERVERS = {"test_reasoning_check.py"}
_LANE = pytest.StashKey[dict]()


def wanted(config) -> bool:
    """Only for the README's test command: ``--full`` over the whole suite (its testpaths),
    tests run."""
    return (
        config.getoption("--full")
        and config.args_source == pytest.Config.ArgsSource.TESTPATHS
        and not config.option.collectonly
        and not config.getoption("markexpr")
        and not config.getoption("keyword")
        and os.environ.get(ENV, "") == ""
    )


def lane_files(items) -> list[Path]:
    by_file: dict[Path, list] = {}
    for item in items:
        by_file.setdefault(item.path, []).append(item)
    return [
        path
        for path, group in by_file.items()
        if path.name in MODULES
        and path.parent == HERE
        and (path.name in OWN_SERVERS or not any(tiers.derived_marks(i) & HEAVY for i in group))
    ]


def temp_base(config) -> Path:
    """In this session's temporary directory (made empty when it starts)."""
    return Path(config._tmp_path_factory.getbasetemp()) / "side_lane"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    if not wanted(config):
        return
    files = lane_files(items)
    if not files:
        return
    moved = [i for i in items if i.path in files]
    items[:] = [i for i in items if i.path not in files]
    base = temp_base(config)
    base.mkdir(parents=True, exist_ok=True)
    if (HERE.parent / "Snakefile").exists():
        # the model both processes read, made here first: two makers of one cache would clash
        from eagle3_lab.dummy_models import packaged_target_json

        packaged_target_json("cpu", HERE / ".cache")
    cmd = [sys.executable, "-m", "pytest", "--full", "-q", "-p", "no:cacheprovider"]
    cmd += ["--basetemp", str(base / "tmp"), "--rootdir", str(config.rootpath)]
    junit = config.getoption("xmlpath", None)
    if junit:
        cmd += ["--junitxml", str(Path(junit).with_suffix(".lane.xml"))]
    cmd += [str(f) for f in files]
    log = base / "lane.log"
    proc = subprocess.Popen(
        cmd,
        cwd=config.rootpath,
        env={**os.environ, ENV: "child"},
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    config.stash[_LANE] = {
        "proc": proc,
        "log": log,
        "tests": len(moved),
        "files": [f.name for f in files],
    }


def pytest_report_collectionfinish(config):
    lane = config.stash.get(_LANE, None)
    if lane is None:
        return []
    return [
        f"side lane: {lane['tests']} tests of {len(lane['files'])} modules run in a second "
        f"process beside this one (tests/lane.py; its output: {lane['log']})"
    ]


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    lane = session.config.stash.get(_LANE, None)
    if lane is None or "rc" in lane:
        return
    proc = lane["proc"]
    if exitstatus in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR):
        stop(proc)
    lane["rc"] = proc.wait()
    if lane["rc"] != 0 and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config):
    lane = config.stash.get(_LANE, None)
    if lane is None or "rc" not in lane:
        return
    lines = lane["log"].read_text(errors="replace").splitlines()
    ok = lane["rc"] == 0
    terminalreporter.write_sep("-", f"side lane ({', '.join(lane['files'])})", red=not ok)
    # its failures whole when it failed, else its summary line
    start = next((i for i, line in enumerate(lines) if "FAILURES" in line), None)
    shown = lines[start:] if not ok and start is not None else lines[-3:]
    for line in shown:
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"side lane: exit {lane['rc']} ({lane['tests']} tests)")


def stop(proc: subprocess.Popen) -> None:
    """The lane and what its tests started (its own process group)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def pytest_unconfigure(config):
    lane = config.stash.get(_LANE, None)
    if lane is not None:  # still running when this session stopped early
        stop(lane["proc"])
