"""Starting the training process (:mod:`.entry`): plain ``python -m`` on the CPU, ``torchrun``
on GPUs, always under the process guard."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from ..server import guard as server_guard

log = logging.getLogger(__name__)


def _training_process_modules() -> None:
    """Never called. The training process runs these modules in a subprocess; importing them
    here puts them into the train rule's code hash (staleness.code.code_hash), so an edit to either
    re-runs the stage."""
    from ..hidden_states import dataset as hs_backend  # noqa: F401
    from . import entry  # noqa: F401


def launch_command(job_path: Path, gpus: int) -> list[str]:
    entry = ["-m", "eagle3_pipeline.train.entry", str(job_path)]
    if gpus <= 0:
        return [sys.executable, *entry]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={gpus}",
        *entry,
    ]


def child_env(gpus: int) -> dict[str, str]:
    env = server_guard.with_package_on_path(dict(os.environ))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' save_pretrained bars
    if gpus <= 0:
        # half the cores: the rest stay free for data loading and other jobs (docs/dependencies.md)
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 2) // 2)))
    return env


def launch(
    cmd: list[str], env: dict[str, str], log_path: str | None, grace_s: float = 120.0
) -> int:
    """Run the training process in its own session, under the server guard so that it dies
    with this job even on ``kill -9``; on interrupt stop it (SIGTERM, then SIGKILL after
    ``grace_s``) and re-raise."""
    out = open(log_path, "ab") if log_path else None  # noqa: SIM115
    try:
        proc = subprocess.Popen(
            server_guard.command(cmd, grace_s),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
            start_new_session=True,
        )
        try:
            return proc.wait()
        except BaseException:
            log.warning("stopping the training process (pid %d)", proc.pid)
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            except ProcessLookupError:
                pass
            raise
    finally:
        if out:
            out.close()
