"""The CI-sized runs of the whole DAG that several test modules share, each made once per
session and started in the background as soon as the session knows it needs them, so that the
rest of the suite runs meanwhile (the tests that read them run last).

- ``ci_run``: tests/configs/ci.yaml with the local executor (``--cores 2``); the end-to-end
  checks, the rerun matrix and the gate's test on real servers read it.
- ``slurm_run``: a copy of that run made again, every job of it (``--forceall``), through the
  tests' local Slurm cluster with the project's profile and tests/configs/ci_slurm.yaml on top:
  the data stages take their stored work, training spans two Slurm nodes for real.
- ``synth_interrupted``: synth alone on another copy, through Slurm, under other generation
  settings: a job stopped at its time limit, then the run again, whose job is cancelled with
  scancel once it has journaled answers and resubmitted by the profile's retry.

- ``miniature``: the miniature Kimi-K2.5's two exports (bf16 and W4A16), built in a process of
  their own into tests/.cache/miniature (tests/miniature_build.py: minutes the first time on a
  machine, nothing after).
- ``kimi_run``: the Kimi-K2.5 profile's whole DAG on the bf16 miniature
  (tests/configs/ci_kimi.yaml; tests/test_miniature_dag.py reads it).

Only the Slurm checks (tests/test_slurm.py) need Slurm. The runs' processes carry a session
variable of their own, so the tiers' watch (tests/tiers.py) files their servers and trainings
under the run, not under whichever test is running meanwhile; the tests that read a run get its
marks from the fixture (tiers.FIXTURE_MARKS).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

import tiers

REPO = Path(__file__).resolve().parents[1]
CI_CONFIG = REPO / "tests" / "configs" / "ci.yaml"
CI_SLURM_CONFIG = REPO / "tests" / "configs" / "ci_slurm.yaml"
KIMI_CONFIGS = (REPO / "config" / "kimi-k2.5.yaml", REPO / "tests" / "configs" / "ci_kimi.yaml")
# what each shared run needs made first
NEEDS = {
    "ci_run": (),
    "miniature": (),
    "kimi_run": ("miniature",),
    "slurm_run": ("ci_run",),
    "synth_interrupted": ("ci_run",),
}
SLURM_RUNS = {"slurm_run", "synth_interrupted"}
# the order in which the tests that read the runs go, after those that read none: about the
# order in which the runs are done
READ_ORDER = ("miniature", "ci_run", "kimi_run", "slurm_run", "synth_interrupted")
# Synth asked again under other generation settings (a journal of its own), one answer at a
# time and longer answers: about 5,000 tokens for the 32 prompts, four minutes at c = 1 even
# on an idle 2-core machine (19 tokens/s; about 8 beside the other tests), which a two-minute
# time limit cuts short (Slurm stops a job 120-155 s after its start here: KillWait 5 s). The
# run after it asks eight at a time (synth.concurrency is operational: the same journal, the
# rest sooner and for less CPU).
SLOW_SYNTH = {"synth": {"jobs": 1, "concurrency": 1, "max_tokens": 224}}
SLOW_SYNTH_LIMIT_MIN = 2
AFTER_THE_TIMEOUT = "synth={concurrency: 8}"


def ci_snakemake(
    workdir: Path,
    *args: str,
    slurm=None,
    timeout: int = 3600,
    background: bool = False,
    configfiles: tuple = (CI_CONFIG,),
    env: dict | None = None,
):
    """This checkout's workflow on the CI-sized config (tests/configs/ci.yaml, or
    ``configfiles``) in ``workdir``; with ``slurm`` (a LocalSlurm) through the Slurm profile,
    every job a Slurm job. ``background``: the process, started (output to
    ``workdir``/snakemake.out)."""
    env = dict(env or os.environ, PYTHONPATH=str(REPO / "src"))
    cmd = [
        str(Path(sys.executable).parent / "snakemake"),
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        *map(str, configfiles),
    ]
    if slurm is None:
        cmd += ["--cores", "2"]
    else:
        env = slurm.environ(env)
        # the plugin's first status check after a second instead of 40 (jobs here are short)
        cmd += [
            "--profile",
            str(REPO / "profiles" / "slurm"),
            "--slurm-init-seconds-before-status-checks",
            "1",
        ]
    cmd += list(args)
    if background:
        out = open(workdir / "snakemake.out", "w")  # noqa: SIM115 - the process holds it
        return subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def journal_answers(journals: list[Path]) -> list[dict]:
    """The answers (status ok) in synth journals."""
    from eagle3_pipeline.runtime.files import AppendLog

    return [e for p in journals for e in AppendLog(p).read() if e["status"] == "ok"]


def copy_run(run: Path, dest: Path) -> Path:
    """A copy of a finished run's working directory; the materialized target model is only read
    (target.json names it where it is)."""
    shutil.copytree(run, dest, symlinks=True, ignore=shutil.ignore_patterns("model"))
    return dest


class SharedRuns:
    """The session's shared runs (futures, one thread each) and the Slurm cluster, whose
    daemons live in a thread of their own: they stop with the thread that started them
    (local_slurm's parent-death signal)."""

    def __init__(self, base: Path, needed: set[str]):
        self.base = base
        self.t0 = time.monotonic()
        self.env = dict(os.environ)
        self.env[tiers.SESSION_VARIABLE] = tiers.background_token(os.environ)
        self.futures: dict[str, Future] = {}
        self.seconds: dict[str, float] = {}
        self.procs: list[subprocess.Popen] = []
        self.pool = ThreadPoolExecutor(max_workers=len(NEEDS), thread_name_prefix="dag-run")
        self.cluster: Future = Future()
        self._closing = threading.Event()
        self._cluster_thread: threading.Thread | None = None
        if needed & SLURM_RUNS:
            self.start_cluster()
        for name in NEEDS:
            if name in needed:
                self.start(name)

    # -- the Slurm cluster ----------------------------------------------------------------
    def start_cluster(self) -> None:
        if self._cluster_thread is not None:
            return

        def hold():
            from local_slurm import ci_cluster

            cluster = ci_cluster()
            try:
                cluster.start(self.base / "slurm")
            except BaseException as e:
                self.cluster.set_exception(e)
                return
            self.cluster.set_result(cluster)
            self._closing.wait()
            cluster.stop()

        self._cluster_thread = threading.Thread(target=hold, name="slurm-cluster", daemon=True)
        self._cluster_thread.start()

    def slurm(self, timeout: float = 1800):
        self.start_cluster()
        return self.cluster.result(timeout)

    # -- the runs -------------------------------------------------------------------------
    def start(self, name: str) -> Future:
        if name not in self.futures:
            for first in NEEDS[name]:
                self.start(first)
            self.futures[name] = self.pool.submit(self._timed, name, getattr(self, "_" + name))
        return self.futures[name]

    def result(self, name: str, timeout: float = 3600) -> Path:
        return self.start(name).result(timeout)

    def _timed(self, name: str, make):
        """``make()`` once the runs it needs are made; its seconds, from when the session's
        runs began (what the durations of the tests that read it leave out)."""
        for first in NEEDS[name]:
            self.result(first)
        t0 = time.monotonic()
        try:
            return make()
        finally:
            self.seconds[name] = (t0 - self.t0, time.monotonic() - self.t0)

    def _snakemake(
        self, work: Path, *args: str, slurm=None, configfiles=(CI_CONFIG,), timeout=3600
    ):
        """The workflow in ``work``, in the background; its exit status and output."""
        proc = ci_snakemake(
            work, *args, slurm=slurm, configfiles=configfiles, background=True, env=self.env
        )
        self.procs.append(proc)
        try:
            rc = proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:  # snakemake does not stop on SIGTERM while it polls Slurm
                proc.kill()
                proc.wait()
        return rc, (work / "snakemake.out").read_text(errors="replace")

    def _finished(self, work: Path, *args: str, **kwargs) -> Path:
        """``work`` once the workflow has run there to the end (``_snakemake``'s arguments)."""
        rc, log = self._snakemake(work, *args, **kwargs)
        assert rc == 0, log[-6000:]
        return work

    def _ci_run(self) -> Path:
        if os.environ.get("EAGLE3_CI_RUN"):
            work = Path(os.environ["EAGLE3_CI_RUN"])
            proc = ci_snakemake(work, "-n")
            assert "Nothing to be done" in proc.stdout + proc.stderr, "EAGLE3_CI_RUN: not finished"
            return work
        work = self.base / "ci_run"
        work.mkdir(parents=True)
        shutil.copytree(REPO / "config", work / "config")  # the default configfile, under ci
        shutil.copytree(REPO / "tests" / "data", work / "data")  # the config's prompt files
        return self._finished(work)

    def _miniature(self) -> dict[str, Path]:
        """Both exports, built (or found in the cache) by a process of their own, so that the
        session's tests run meanwhile."""
        log = self.base / "miniature.log"
        code = "import json, miniature_build as m; print(json.dumps(m.build_all()))"
        env = dict(self.env, PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO / "tests")]))
        with open(log, "w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-c", code],
                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=out, text=True,
                start_new_session=True,
            )  # fmt: skip
            self.procs.append(proc)
            stdout, _ = proc.communicate(timeout=3600)
        assert proc.returncode == 0, log.read_text(errors="replace")[-6000:]
        built = json.loads(stdout.strip().splitlines()[-1])  # (the last line: a library may talk)
        return {name: Path(path) for name, path in built.items()}

    def _kimi_run(self) -> Path:
        model = self.result("miniature")["none"]
        work = self.base / "kimi_run"
        work.mkdir(parents=True)
        shutil.copytree(REPO / "config", work / "config")  # the default configfile, merged under
        return self._finished(
            work, "--config", f"target={{path: {model}}}", configfiles=KIMI_CONFIGS
        )

    def _slurm_run(self) -> Path:
        work = copy_run(self.result("ci_run"), self.base / "slurm_run")
        return self._finished(
            work, "--forceall", slurm=self.slurm(), configfiles=(CI_CONFIG, CI_SLURM_CONFIG)
        )

    def _synth_interrupted(self) -> dict:
        """Synth under SLOW_SYNTH through Slurm: first with a time limit too short for it and
        no retry, then again with the profile's limit and retry (AFTER_THE_TIMEOUT), its job
        cancelled with scancel once it has journaled an answer more; what each step kept."""
        slurm = self.slurm()
        work = copy_run(self.result("ci_run"), self.base / "synth_interrupted")
        slow = work / "slow_synth.yaml"
        slow.write_text(yaml.safe_dump(SLOW_SYNTH))
        partial = work / "results" / "ci" / "synth" / ".partial"
        earlier = set(partial.rglob("journal*.jsonl"))

        def answers() -> list[dict]:
            """The answers journaled under SLOW_SYNTH's settings (in journals of their own)."""
            return journal_answers(sorted(set(partial.rglob("journal*.jsonl")) - earlier))

        args, cfgs = ("--until", "synth_gather"), (CI_CONFIG, slow)
        limit = f"synth:runtime={SLOW_SYNTH_LIMIT_MIN}"
        rc_first, out_first = self._snakemake(
            work, *args, "--set-resources", limit, "--retries", "0",
            slurm=slurm, configfiles=cfgs, timeout=900,
        )  # fmt: skip
        kept = answers()
        jobs_first = {j["JobIDRaw"] for j in slurm.accounted_jobs(work)}
        again = (*args, "--config", AFTER_THE_TIMEOUT)
        proc = ci_snakemake(
            work, *again, slurm=slurm, configfiles=cfgs, background=True, env=self.env
        )
        self.procs.append(proc)
        try:
            cancelled = cancel_a_synth_job(slurm, lambda: len(answers()), len(kept), proc)
            rc_second = proc.wait(timeout=1200)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return {
            "work": work,
            "first": {"rc": rc_first, "out": out_first},
            "kept_at_timeout": kept,
            "jobs_first": jobs_first,
            "cancelled": cancelled,
            "second": {"rc": rc_second, "out": (work / "snakemake.out").read_text()},
            "answers": answers(),
        }

    def close(self) -> None:
        """Stop what still runs (a failed session), then the cluster."""
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
        self.pool.shutdown(wait=True, cancel_futures=True)
        self._closing.set()
        if self._cluster_thread is not None:
            self._cluster_thread.join(timeout=120)


def cancel_a_synth_job(slurm, journaled, kept: int, proc, timeout: float = 900) -> dict:
    """scancel the running synth job once ``journaled()`` (answers) is more than ``kept``; how
    many there were by then. Fails if the run ends first."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        assert proc.poll() is None, "the run ended before its synth job could be cancelled"
        rows = slurm.run("squeue", "--noheader", "--format=%i|%T|%k", check=False).stdout
        for job_id, state, comment in (r.split("|") for r in rows.splitlines()):
            if state != "RUNNING" or not re.search(r"^rule_synth_wildcards_\d+$", comment):
                continue
            held = journaled()
            if held > kept:
                slurm.run("scancel", job_id)
                return {"job_id": job_id, "journaled_before_cancel": held}
        time.sleep(1)
    raise TimeoutError("the synth job journaled no answer in time")


# ---- fixtures and the order of the tests -----------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def shared_runs(request, tmp_path_factory, record_testsuite_property):
    """Starts the shared runs the session's tests need (and what they need first); their
    seconds go into the JUnit file (tests/durations.py shows them)."""
    needed = {f for item in request.session.items for f in item.fixturenames} & set(NEEDS)
    for name in list(needed):
        needed |= set(NEEDS[name])
    if not needed and not any("slurm" in i.fixturenames for i in request.session.items):
        yield None
        return
    runs = SharedRuns(tmp_path_factory.mktemp("shared_runs"), needed)
    yield runs
    runs.close()
    request.config.stash[SECONDS] = dict(runs.seconds)
    for name, (start, end) in runs.seconds.items():
        record_testsuite_property(f"shared run {name}", f"{start:.0f}-{end:.0f} s")


SECONDS = pytest.StashKey[dict]()


@pytest.fixture(scope="session")
def ci_run(shared_runs) -> Path:
    """The working directory of the finished CI-sized run (local executor). EAGLE3_CI_RUN=<dir>
    names a finished one to use instead (while working on these tests; checked to be up to
    date)."""
    return shared_runs.result("ci_run")


@pytest.fixture(scope="session")
def miniature(shared_runs) -> dict[str, Path]:
    """The miniature Kimi-K2.5's exports by quantization ("none": bf16, "w4a16")."""
    return shared_runs.result("miniature")


@pytest.fixture(scope="session")
def kimi_run(shared_runs) -> Path:
    """The working directory of the Kimi-K2.5 profile's finished CI-sized run on the miniature."""
    return shared_runs.result("kimi_run")


@pytest.fixture(scope="session")
def slurm_run(shared_runs) -> Path:
    """The working directory of the copy of ci_run made again through Slurm (--forceall)."""
    return shared_runs.result("slurm_run")


@pytest.fixture(scope="session")
def synth_interrupted(shared_runs) -> dict:
    """What synth through Slurm kept when stopped at its time limit and when cancelled."""
    return shared_runs.result("synth_interrupted")


def needs_a_run(item) -> int:
    """0: reads no shared run; else 1 + the place in READ_ORDER of the last run it reads."""
    names = set(item.fixturenames)
    return max((1 + i for i, name in enumerate(READ_ORDER) if name in names), default=0)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    """The tests that read a shared run go last, in the order the runs are made."""
    items.sort(key=needs_a_run)  # stable: each group keeps its order


def pytest_terminal_summary(terminalreporter, config):
    seconds = config.stash.get(SECONDS, {})
    if seconds:
        made = ", ".join(
            f"{name} {b - a:.0f} s (at {a:.0f}-{b:.0f} s)" for name, (a, b) in seconds.items()
        )
        terminalreporter.write_line(f"shared runs made in the background: {made}")
