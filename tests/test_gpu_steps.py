"""The GPU host's steps (benchmarks/gpu/steps.sh) plan what they are meant to run.

A lane of that plan is a Snakemake call in a shell function; a wrong word order there costs a
GPU session (Snakemake's ``--resources`` once took the targets as resources and every train and
bench lane failed in 3 s). Each step is called here as the host calls it, with ``SMK_FLAGS=-n``:
a dry run of the methods configs on a copy of the workflow.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from smkcli import REPO, copy_repo, job_names, parse_jobs

EAGLE3 = {"train[method=eagle3]", "bench[method=eagle3]"}
DFLASH = {"train[method=dflash]", "bench[method=dflash]"}


@pytest.fixture(scope="module")
def host_copy(tmp_path_factory) -> Path:
    root = copy_repo(tmp_path_factory.mktemp("host"))
    (root / "benchmarks" / "gpu").mkdir(parents=True)
    shutil.copy2(REPO / "benchmarks" / "gpu" / "steps.sh", root / "benchmarks" / "gpu")
    return root


def run_step(root: Path, tmp_path: Path, step: str) -> set[str]:
    # the steps a lane waits for have finished
    (tmp_path / "status.log").write_text("m_data ok 1 s\nm_baseline ok 1 s\n")
    env = {
        **os.environ,
        "W": str(tmp_path),
        "SMK_FLAGS": "-n",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(root / "src"),
    }
    proc = subprocess.run(
        ["bash", "-c", f"source benchmarks/gpu/steps.sh && {step}"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return set(job_names(parse_jobs(proc.stdout)))


@pytest.mark.parametrize(
    ("step", "planned", "not_planned"),
    [
        (
            "m_data",
            {"synth", "extract_gather", "vocab", "prompts_bench[name=mtbench]"},
            {"bench_baseline"} | EAGLE3 | DFLASH,
        ),
        ("m_train_eagle3", {"train[method=eagle3]"}, {"bench_baseline"} | DFLASH),
        ("m_bench_eagle3", EAGLE3, DFLASH),
        ("m_baseline", {"bench_baseline"}, EAGLE3 | DFLASH),
        ("m_train_dflash", {"train[method=dflash]"}, {"bench_baseline"} | EAGLE3),
        ("m_bench_dflash", DFLASH, EAGLE3),
        ("m_report", {"report"} | EAGLE3 | DFLASH, set()),
    ],
)
def test_each_lane_step_plans_its_own_jobs(host_copy, tmp_path, step, planned, not_planned):
    jobs = run_step(host_copy, tmp_path, step)
    assert planned <= jobs, (step, sorted(jobs))
    assert not (not_planned & jobs), (step, sorted(jobs))
