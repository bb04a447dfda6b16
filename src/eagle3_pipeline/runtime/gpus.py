"""GPU bookkeeping that Snakemake does not do.

Snakemake counts a ``gpus`` resource but (1) silently scales a job down when ``--resources gpus``
is smaller than asked, (2) ignores limits when no ``--resources`` is given, and (3) never says
*which* devices a job may use. This module fills the three gaps:

* :func:`require_gpus` fails a job that was granted fewer GPUs than its tensor-parallel size.
* :class:`GpuLease` picks free device ids with one ``flock`` per device and exports
  ``CUDA_VISIBLE_DEVICES``; a second job waits until devices are free instead of sharing them.
  Locks die with the process, so a killed job never leaves a device reserved.
* Because the lease waits, a run without ``--resources`` is still safe: GPU jobs that Snakemake
  starts together queue on the locks (with a log line) rather than overcommitting a device.

The lock files live in a directory of the user's own (:func:`default_lock_dir`, created 0700 and
checked for its owner) and are opened without following links: in a directory that other
users of the machine can write, one of them could plant a link that makes a job truncate a file
of its user's, or hold a lock that stops the job's GPU work for good. Leases are therefore per
user: jobs of two users on one machine do not see each other's (a scheduler shares GPUs
between users).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

# where the workflow (inside a Slurm job: one directory per job) or the user puts the locks
LOCK_DIR_ENV = "EAGLE3_GPU_LOCK_DIR"


class GpuAllocationError(RuntimeError):
    pass


def default_lock_dir(env: dict | None = None) -> Path:
    """The directory of the GPU lock files: $EAGLE3_GPU_LOCK_DIR, else one of this user's own
    in the temporary directory (``eagle3-pipeline-gpu-locks-<uid>``)."""
    env = os.environ if env is None else env
    if env.get(LOCK_DIR_ENV):
        return Path(env[LOCK_DIR_ENV])
    return Path(tempfile.gettempdir()) / f"eagle3-pipeline-gpu-locks-{os.getuid()}"


def slurm_lock_dir(job_id: str) -> Path:
    """The lock directory of the jobs inside one Slurm job (of this user's)."""
    return Path(tempfile.gettempdir()) / f"eagle3-pipeline-gpu-locks-{os.getuid()}-slurm-{job_id}"


def private_dir(path: Path) -> Path:
    """``path`` as a directory that only this user can change: created with mode 0700 where it
    is missing; one that exists must be a directory (not a link to one), owned by this user and
    writable by no one else, or GpuAllocationError says what is wrong and what to do."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    st = os.lstat(path)
    wrong = None
    if stat.S_ISLNK(st.st_mode):
        wrong = "is a symbolic link"
    elif not stat.S_ISDIR(st.st_mode):
        wrong = "is not a directory"
    elif st.st_uid != os.getuid():
        wrong = f"belongs to another user (uid {st.st_uid}, not {os.getuid()})"
    elif st.st_mode & 0o022:
        wrong = f"can be written by other users (mode {stat.S_IMODE(st.st_mode):o})"
    if wrong:
        raise GpuAllocationError(
            f"the GPU lock directory {path} {wrong}: a job will not take its GPU locks there "
            "(another user could make it overwrite a file or wait forever). Remove it, or set "
            f"{LOCK_DIR_ENV} to a directory of your own (mode 0700)"
        )
    return path


def nvidia_smi_rows(query: str, timeout: float = 30) -> list[list[str]] | None:
    """``nvidia-smi --query-<query> --format=csv,noheader,nounits`` as rows of stripped fields
    (``query`` e.g. ``gpu=index,memory.total``); None where there is no nvidia-smi. Raises
    OSError / subprocess.SubprocessError when it fails."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    out = subprocess.run(
        [smi, f"--query-{query}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    ).stdout
    return [[f.strip() for f in line.split(",")] for line in out.splitlines() if line.strip()]


def require_gpus(needed: int, granted: int | None, rule: str) -> None:
    """Fail clearly when Snakemake granted fewer GPUs than the job needs."""
    if needed <= 0:
        return
    if granted is None or granted < needed:
        raise GpuAllocationError(
            f"rule {rule} needs {needed} GPU(s) (tensor parallel size) but Snakemake granted "
            f"{granted}. Snakemake scales a job down silently when --resources gpus is smaller "
            f"than asked: run with `--resources gpus={needed}` or more, or lower the tensor "
            "parallel size in the config."
        )


def visible_devices(env: dict | None = None) -> list[str]:
    """Device ids this process may use: CUDA_VISIBLE_DEVICES if set (Slurm sets it),
    else all devices ``nvidia-smi`` lists."""
    env = os.environ if env is None else env
    preset = env.get("CUDA_VISIBLE_DEVICES")
    if preset is not None:
        return [d.strip() for d in preset.split(",") if d.strip() and d.strip() != "-1"]
    try:
        rows = nvidia_smi_rows("gpu=index")
    except (OSError, subprocess.SubprocessError):
        return []
    return [row[0] for row in rows or []]


class GpuLease:
    """Hold ``count`` devices exclusively for the life of this object.

    >>> with GpuLease(2) as devices:   # doctest: +SKIP
    ...     # os.environ["CUDA_VISIBLE_DEVICES"] == ",".join(devices)
    """

    def __init__(
        self,
        count: int,
        devices: list[str] | None = None,
        lock_dir: Path | str | None = None,
        timeout_s: float | None = None,
        poll_s: float = 2.0,
    ):
        self.count = count
        self.devices = visible_devices() if devices is None else list(devices)
        self.lock_dir = Path(lock_dir) if lock_dir is not None else default_lock_dir()
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self._held: dict[str, int] = {}

    def _try_take(self, device: str) -> bool:
        path = self.lock_dir / f"gpu-{device}.lock"
        try:  # never through a link: the file is truncated below
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            raise GpuAllocationError(
                f"the GPU lock file {path} is a symbolic link: remove it (a lock file is "
                "truncated when taken, and would truncate the file it points to)"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._held[device] = fd
        return True

    def acquire(self) -> list[str]:
        if self.count <= 0:
            return []
        if len(self.devices) < self.count:
            raise GpuAllocationError(
                f"need {self.count} GPU(s) but this machine shows {len(self.devices)} "
                f"({self.devices or 'none'}); check CUDA_VISIBLE_DEVICES / nvidia-smi"
            )
        private_dir(self.lock_dir)
        start, warned = time.monotonic(), False
        while True:
            for dev in self.devices:
                if dev not in self._held and len(self._held) < self.count:
                    self._try_take(dev)
            if len(self._held) == self.count:
                chosen = sorted(self._held, key=self.devices.index)
                os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(chosen)
                log.info("GPU lease: using devices %s", chosen)
                return chosen
            # Give back partial holdings so two waiting jobs cannot deadlock on halves.
            self.release()
            if not warned:
                log.warning(
                    "waiting for %d free GPU(s) among %s (others are in use by "
                    "concurrent jobs; pass --resources gpus=N to let Snakemake "
                    "schedule them)",
                    self.count,
                    self.devices,
                )
                warned = True
            if self.timeout_s is not None and time.monotonic() - start > self.timeout_s:
                raise GpuAllocationError(
                    f"no {self.count} free GPU(s) after {self.timeout_s:.0f} s"
                )
            time.sleep(self.poll_s)

    def release(self) -> None:
        for fd in self._held.values():
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
        self._held.clear()

    def __enter__(self) -> list[str]:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
