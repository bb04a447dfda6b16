"""Starting the training process (:mod:`.entry`): plain ``python -m`` on the CPU, ``torchrun``
on GPUs, ``srun`` of a ``torchrun`` on every node of a Slurm allocation for ``train.nodes`` > 1;
always under the process guard."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from ..runtime.threads import cpu_wait_policy
from ..server import guard as server_guard
from . import entry as training_process  # noqa: F401  (run by the launch: in the code hash)
from .errors import TrainError

log = logging.getLogger(__name__)

# torchrun's rendezvous port on the first node: one per Slurm job, so that two training jobs
# whose allocations share a node do not meet
RENDEZVOUS_BASE_PORT = 29500


def _training_process_modules() -> None:
    """Never called. The training process runs these backends (and :mod:`.entry`, imported
    above) in a subprocess; importing them here puts them into the train rule's code hash
    (staleness.code.code_hash), so an edit to either re-runs the stage, without loading
    hs_connectors where the job only launches training."""
    from ..hidden_states import dataset as hs_backend  # noqa: F401
    from ..online import transfer  # noqa: F401  (extract.mode online/hybrid)


def launch_command(
    job_path: Path, gpus: int, nodes: int = 1, head: str = "<first node>", job_id: str = "<job>"
) -> list[str]:
    """The training process's command: on one node ``python -m`` (CPU) or a standalone
    ``torchrun`` with a process per GPU; on ``nodes`` nodes one ``torchrun`` per node (``gpus``
    processes each, one on the CPU) started by ``srun`` inside Slurm job ``job_id``, meeting
    at a rendezvous on ``head``, the allocation's first node."""
    entry = ["-m", "eagle3_pipeline.train.entry", str(job_path)]
    if nodes > 1:
        port = RENDEZVOUS_BASE_PORT + (int(job_id) % 1000 if job_id.isdigit() else 0)
        return [
            "srun",
            f"--jobid={job_id}",
            f"--nodes={nodes}",
            f"--ntasks={nodes}",
            "--ntasks-per-node=1",
            "--overlap",  # beside the step that runs this job's script, where there is one
            "--kill-on-bad-exit=1",
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={nodes}",
            f"--nproc-per-node={max(gpus, 1)}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={head}:{port}",
            f"--rdzv-id={job_id}",
            *entry,
        ]
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


def allocation() -> tuple[str | None, list[str]]:
    """This job's Slurm job id and the hostnames of its nodes, first node first (none outside
    an allocation). Asked of Slurm, not read from SLURM_JOB_NODELIST: the plugin's job step
    leaves only the job id in the environment."""
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        return None, []
    try:
        nodelist = subprocess.run(
            ["squeue", "--noheader", f"--jobs={job_id}", "--format=%N"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.strip()
        hosts = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError) as e:
        raise TrainError(f"cannot ask Slurm for the nodes of job {job_id}: {e}") from e
    return job_id, hosts


def multi_node_command(job_path: Path, gpus: int, nodes: int) -> list[str]:
    """:func:`launch_command` over ``nodes`` nodes of this job's Slurm allocation; refuses
    to start where there is no such allocation."""
    job_id, hosts = allocation()
    if len(hosts) < nodes:
        where = (
            f"in Slurm job {job_id}, which has {len(hosts)} node(s)"
            if job_id
            else "outside a Slurm allocation"
        )
        raise TrainError(
            f"train.nodes is {nodes}, but the train job runs {where}: run the workflow with "
            "--profile profiles/slurm (the train job is then one allocation of train.nodes "
            "nodes), or set train.nodes: 1"
        )
    return launch_command(job_path, gpus, nodes, head=hosts[0], job_id=job_id)


def child_env(gpus: int, devices: list[str] | None = None) -> dict[str, str]:
    """The training process's environment; ``devices``: its GPUs, when the job's other GPUs
    run its extraction servers (extract.mode online/hybrid)."""
    env = server_guard.with_package_on_path(dict(os.environ))
    if devices is not None and gpus > 0:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' save_pretrained bars
    if gpus <= 0:
        # half the cores: the rest stay free for data loading and other jobs (docs/dependencies.md)
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 2) // 2)))
        env = cpu_wait_policy(env)
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
