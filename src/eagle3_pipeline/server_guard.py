"""Keeps a vLLM server's process tree from outliving the job that started it.

    python -m eagle3_pipeline.server_guard <parent pid> <grace s> -- <server command...>

The guard leads its own process group and runs the server inside it. vLLM forks engine-core
and worker processes that a plain parent-death signal would orphan (they would keep the GPUs).
The guard asks the kernel for SIGTERM when the job dies (even by ``kill -9``), and on SIGTERM
or SIGINT, or when the server exits, it takes the whole group down: SIGINT first, SIGKILL after
the grace period.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time


def _kill_group(grace_s: float, child: subprocess.Popen | None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if child is not None and child.poll() is None:
        os.killpg(0, signal.SIGINT)
        try:
            child.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
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
    child: subprocess.Popen | None = None

    def on_signal(signum, frame):
        _kill_group(grace, child)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    child = subprocess.Popen(command)
    rc = child.wait()
    print(f"[server_guard] vLLM server exited with code {rc}", flush=True)
    time.sleep(0.5)
    _kill_group(grace, None)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
