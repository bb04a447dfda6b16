"""Keeps a vLLM server's (or a training run's) process tree from outliving the job that
started it.

    python -m eagle3_pipeline.server.guard <parent pid> <grace s> -- <command...>

The guard leads its own process group and runs the command inside it. vLLM forks engine-core
and worker processes, torchrun its ranks, that a plain parent-death signal would orphan (they
would keep the GPUs, and a re-run would train a second time into the same directory).
The guard asks the kernel for SIGTERM when the job dies (even by ``kill -9``), and on SIGTERM
or SIGINT, or when the server exits, it takes the whole group down: SIGINT first, SIGKILL after
the grace period.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def with_package_on_path(env: dict[str, str]) -> dict[str, str]:
    """``env`` with this package's parent directory first on PYTHONPATH.

    Child processes run this package's own modules (this guard, the training entry point,
    vLLM's connector module): they must import it even where it is not installed, e.g. a
    checkout used through PYTHONPATH on an offline GPU host.
    """
    src = str(Path(__file__).resolve().parents[2])
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != src]
    return {**env, "PYTHONPATH": os.pathsep.join([src, *rest])}


def command(cmd: list[str], grace_s: float) -> list[str]:
    """`cmd` wrapped in the guard, watching the calling process. Start it in a new session."""
    return [
        sys.executable,
        "-m",
        "eagle3_pipeline.server.guard",
        str(os.getpid()),
        str(grace_s),
        "--",
        *cmd,
    ]


def _kill_group(grace_s: float, child: subprocess.Popen | None, interrupt: bool) -> None:
    """Stop the group: SIGINT (unless the group already got one), SIGKILL after the grace."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if child is not None and child.poll() is None:
        if interrupt:  # a second SIGINT makes vLLM skip parts of its clean shutdown
            os.killpg(0, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=grace_s)
    sys.stdout.flush()
    os.killpg(0, signal.SIGKILL)  # everything left in the group, the guard included


def main(argv: list[str]) -> int:
    parent, grace_s, sep, *command = argv
    assert sep == "--" and command, "usage: server_guard <parent pid> <grace s> -- <command>"
    grace = float(grace_s)
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != int(parent):  # the job died before the guard was armed
        return 1
    received: list[int] = []
    # The handler only records the signal: waiting on the child inside it would contend for
    # Popen's wait lock with the main loop and stall for the whole grace period.
    signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    child = subprocess.Popen(command)
    while child.poll() is None and not received:
        time.sleep(0.2)
    if received:
        # SIGINT comes from VllmServer.stop() to the whole group (the server got it too);
        # SIGTERM from the kernel when the job died.
        _kill_group(grace, child, interrupt=received[0] != signal.SIGINT)
    print(
        f"[server_guard] {os.path.basename(command[0])} exited with code {child.returncode}",
        flush=True,
    )
    time.sleep(0.5)
    _kill_rest_of_group()
    # The command's own status (a signal as 128 + n): training is judged by it.
    return child.returncode if child.returncode >= 0 else 128 - child.returncode


def _kill_rest_of_group() -> None:
    """SIGKILL whatever the command left in the group (orphaned workers), sparing the guard."""
    me, group = os.getpid(), os.getpgid(0)
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                pgrp = int(fh.read().rsplit(")", 1)[1].split()[2])  # "pid (comm) state ppid pgrp"
            if pgrp == group:
                os.kill(int(entry), signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            continue


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
