"""GPU bookkeeping Snakemake does not do: enough GPUs granted, exclusive devices across jobs.

Jobs are stood in for by subprocesses holding a `GpuLease` over fake device ids in a temporary
lock directory, as two Snakemake jobs on one machine would (no GPU needed).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from eagle3_pipeline import runtime
from eagle3_pipeline.runtime import gpus

from smkcli import REPO, env_for

HOLDER = """
import os, sys, time
from pathlib import Path
from eagle3_pipeline.runtime.gpus import GpuLease
count, devices = int(sys.argv[1]), sys.argv[2].split(",")
lock_dir, out = sys.argv[3], Path(sys.argv[4])
with GpuLease(count, devices=devices, lock_dir=lock_dir, poll_s=0.05) as got:
    out.write_text(f"{','.join(got)} {os.environ['CUDA_VISIBLE_DEVICES']} {time.time()}")
    release = out.with_suffix(".release")
    while not release.exists():
        time.sleep(0.02)
"""


def start_holder(
    tmp_path: Path, name: str, count: int, devices: str
) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / f"{name}.txt"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(count), devices, str(tmp_path / "locks"), str(out)],
        env=env_for(REPO / "src"),
    )
    return proc, out


def wait_for(path: Path, timeout: float = 30.0) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.02)
    raise AssertionError(f"{path} did not appear within {timeout} s")


def release(out: Path, proc: subprocess.Popen) -> None:
    out.with_suffix(".release").touch()
    assert proc.wait(timeout=30) == 0


# ---- require_gpus --------------------------------------------------------------------------


@pytest.mark.parametrize("granted", [4, 0, None])
def test_require_gpus_names_rule_need_and_fix(granted):
    with pytest.raises(gpus.GpuAllocationError) as err:
        gpus.require_gpus(8, granted, "extract")
    msg = str(err.value)
    assert (
        f"rule extract needs 8 GPU(s) (tensor parallel size) but Snakemake granted {granted}" in msg
    )
    assert "--resources gpus=8" in msg


def test_require_gpus_accepts_enough_and_cpu_jobs():
    gpus.require_gpus(8, 8, "synth")
    gpus.require_gpus(8, 16, "synth")
    gpus.require_gpus(0, None, "train")  # CPU jobs need nothing


def test_job_start_fails_when_snakemake_scaled_the_job_down(tmp_path):
    # What a job sees when run with --resources gpus=4 but TP=8 (Snakemake scales down silently).
    job = SimpleNamespace(
        log=[str(tmp_path / "job.log")],
        rule="synth",
        resources=SimpleNamespace(gpus=4),
        input=[],
        output=[],
        params=None,
    )
    called = []
    root = logging.getLogger()
    handlers, level, sigterm = list(root.handlers), root.level, signal.getsignal(signal.SIGTERM)
    try:  # run_job sets up job logging and a SIGTERM handler: put the test process's back
        with pytest.raises(gpus.GpuAllocationError, match="granted 4"):
            runtime.run_job(job, lambda *a: called.append(a), gpus_needed=8)
    finally:
        for h in list(root.handlers):
            if h not in handlers:
                root.removeHandler(h)
                h.close()
        for h in handlers:
            if h not in root.handlers:
                root.addHandler(h)
        root.setLevel(level)
        signal.signal(signal.SIGTERM, sigterm)
    assert not called  # failed before the stage started (no model load)
    assert "needs 8 GPU(s)" in (tmp_path / "job.log").read_text()


# ---- which devices -------------------------------------------------------------------------


def test_visible_devices_respects_cuda_visible_devices():
    assert gpus.visible_devices({"CUDA_VISIBLE_DEVICES": "2, 3"}) == ["2", "3"]
    assert gpus.visible_devices({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert gpus.visible_devices({"CUDA_VISIBLE_DEVICES": "-1"}) == []


def test_lease_picks_from_cuda_visible_devices_and_exports_its_choice(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    with gpus.GpuLease(1, lock_dir=tmp_path) as got:
        assert got == ["5"] and os.environ["CUDA_VISIBLE_DEVICES"] == "5"
        with gpus.GpuLease(1, devices=["5", "7"], lock_dir=tmp_path) as other:
            assert other == ["7"]  # the held device is skipped


def test_lease_asking_more_devices_than_exist_fails_clearly(tmp_path):
    with pytest.raises(gpus.GpuAllocationError, match=r"need 8 GPU.*shows 2"):
        gpus.GpuLease(8, devices=["0", "1"], lock_dir=tmp_path).acquire()


def test_zero_gpu_lease_takes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with gpus.GpuLease(0, devices=[], lock_dir=tmp_path) as got:
        assert got == [] and "CUDA_VISIBLE_DEVICES" not in os.environ


# ---- exclusivity across processes ------------------------------------------------------------


def test_two_one_gpu_jobs_get_different_devices(tmp_path):
    a, out_a = start_holder(tmp_path, "a", 1, "0,1")
    b, out_b = start_holder(tmp_path, "b", 1, "0,1")
    got = {wait_for(out_a).split()[0], wait_for(out_b).split()[0]}
    assert got == {"0", "1"}
    release(out_a, a)
    release(out_b, b)


def test_second_job_waits_until_the_first_releases(tmp_path):
    a, out_a = start_holder(tmp_path, "a", 2, "0,1")
    assert wait_for(out_a).split()[:2] == ["0,1", "0,1"]
    b, out_b = start_holder(tmp_path, "b", 1, "0,1")
    time.sleep(1.0)
    assert not out_b.exists(), "b got a device while a held both"
    released_at = time.time()
    release(out_a, a)
    b_devices, _, b_time = wait_for(out_b).split()
    assert b_devices in ("0", "1") and float(b_time) >= released_at
    release(out_b, b)


def test_a_killed_holder_frees_its_devices(tmp_path):
    a, out_a = start_holder(tmp_path, "a", 2, "0,1")
    wait_for(out_a)
    b, out_b = start_holder(tmp_path, "b", 2, "0,1")
    time.sleep(0.5)
    assert not out_b.exists()
    a.send_signal(signal.SIGKILL)  # a crashed job: the kernel drops its flocks
    a.wait(timeout=30)
    assert wait_for(out_b).split()[0] == "0,1"
    release(out_b, b)


# ---- a machine shared by several users -----------------------------------------------------


def test_lock_dir_is_the_users_own_and_created_private(tmp_path, monkeypatch):
    monkeypatch.delenv(gpus.LOCK_DIR_ENV, raising=False)
    assert gpus.default_lock_dir().name == f"eagle3-pipeline-gpu-locks-{os.getuid()}"
    assert gpus.default_lock_dir({gpus.LOCK_DIR_ENV: "/x"}) == Path("/x")
    locks = tmp_path / "locks"
    with gpus.GpuLease(1, devices=["0"], lock_dir=locks, poll_s=0.05):
        assert (locks.stat().st_mode & 0o777) == 0o700
        assert (locks / "gpu-0.lock").stat().st_mode & 0o077 == 0


@pytest.mark.parametrize(
    "make, fragment",
    [
        (lambda p: p.mkdir(mode=0o777) or p.chmod(0o777), "can be written by other users"),
        (lambda p: p.symlink_to(p.with_name("real"), target_is_directory=True), "symbolic link"),
        (lambda p: p.write_text(""), "is not a directory"),
    ],
)
def test_a_lock_dir_others_could_change_is_refused(tmp_path, make, fragment):
    (tmp_path / "real").mkdir(mode=0o700)
    locks = tmp_path / "locks"
    make(locks)
    lease = gpus.GpuLease(1, devices=["0"], lock_dir=locks, poll_s=0.05)
    with pytest.raises(gpus.GpuAllocationError) as err, lease:
        pass
    assert fragment in str(err.value) and gpus.LOCK_DIR_ENV in str(err.value)


def test_a_planted_link_as_lock_file_truncates_nothing(tmp_path):
    """Another user's link at a lock file's path would make the job truncate the file it
    points to (a lock file is truncated and given the holder's PID when taken)."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o700)
    (locks / "gpu-0.lock").symlink_to(victim)
    lease = gpus.GpuLease(1, devices=["0"], lock_dir=locks, poll_s=0.05)
    with pytest.raises(gpus.GpuAllocationError, match=r"gpu-0\.lock is a symbolic link"), lease:
        pass
    assert victim.read_text() == "precious"
