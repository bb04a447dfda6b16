"""What every workflow script needs: logging to the job's log, signals, GPU checks, progress."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .gpus import GpuLease, require_gpus

log = logging.getLogger("eagle3_pipeline")


def setup_logging(log_path: str | os.PathLike | None, level: int = logging.INFO) -> None:
    """Log to the job's log file (appending: a server may share it) and to stderr."""
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    root = logging.getLogger()
    root.setLevel(level)
    for h in list(root.handlers):
        root.removeHandler(h)
    stream = logging.StreamHandler(sys.stderr)
    stream.setFormatter(fmt)
    root.addHandler(stream)
    if log_path:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        fh = logging.FileHandler(log_path, mode="a")
        fh.setFormatter(fmt)
        root.addHandler(fh)
    for noisy in ("httpx", "httpx2", "httpcore", "urllib3", "filelock", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"received signal {signum}")


def handle_termination() -> None:
    """Turn SIGTERM (Snakemake cancelling, Slurm time limits) into KeyboardInterrupt, so that
    context managers - above all a managed vLLM server - shut down cleanly."""
    signal.signal(signal.SIGTERM, _raise_interrupt)


def run_job(snakemake: Any, fn: Callable[..., Any], gpus_needed: int = 0) -> Any:
    """Run ``fn(input, output, params, log_path)`` as a Snakemake script job.

    SIGTERM (Snakemake cancelling, Slurm time limits) becomes KeyboardInterrupt so that context
    managers - above all a managed vLLM server - shut down cleanly. A job stopped once every
    declared output is written (each is written last and atomically: there, it is complete),
    e.g. while its server shuts down, has done its work: it ends successfully, so that
    Snakemake keeps those outputs instead of deleting them as a failed job's.
    """
    log_path = snakemake.log[0] if len(snakemake.log) else None
    setup_logging(log_path)
    handle_termination()
    rule = snakemake.rule
    granted = getattr(snakemake.resources, "gpus", 0)
    try:
        require_gpus(gpus_needed, granted, rule)
        with GpuLease(gpus_needed):
            result = fn(snakemake.input, snakemake.output, snakemake.params, log_path)
    except KeyboardInterrupt as stop:
        if outputs_complete(snakemake.output):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            log.warning("%s stopped (%s) after writing all its outputs: they are kept", rule, stop)
            return None
        log.error("%s interrupted; partial work is kept and the next run resumes from it", rule)
        raise
    except Exception:
        log.exception("%s failed", rule)
        raise
    # done: a stop signal now (the interpreter exiting) must not turn the job into a failure
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return result


def outputs_complete(outputs: Any) -> bool:
    """Whether every declared output of a job exists (a job with none has none complete)."""
    paths = [Path(p) for p in outputs]
    return bool(paths) and all(p.exists() for p in paths)


async def for_each(items, fn, concurrency: int) -> None:
    """Await ``fn(item)`` for every item, at most ``concurrency`` at a time (a fixed pool of
    workers, so memory stays flat however many items there are). The first exception cancels
    the work in flight and propagates."""
    pending = iter(items)

    async def worker() -> None:
        for item in pending:  # one shared iterator: each item goes to exactly one worker
            await fn(item)

    tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Progress:
    """A progress bar for log files: one line every ``every_s`` seconds with rate and ETA."""

    def __init__(
        self,
        total: int,
        what: str,
        unit: str = "items",
        every_s: float = 10.0,
        logger: logging.Logger = log,
        done: int = 0,
    ):
        self.total, self.what, self.unit = total, what, unit
        self.every_s, self.logger = every_s, logger
        self.done = self.start_done = done
        self.extra = 0.0
        self.t0 = self.last = time.monotonic()

    def update(self, n: int = 1, extra: float = 0.0, force: bool = False) -> None:
        self.done += n
        self.extra += extra
        now = time.monotonic()
        if force or now - self.last >= self.every_s or self.done >= self.total:
            self.last = now
            self.logger.info("%s", self.line(now))

    def line(self, now: float | None = None) -> str:
        now = now or time.monotonic()
        dt = max(now - self.t0, 1e-9)
        new = self.done - self.start_done
        rate = new / dt
        eta = (self.total - self.done) / rate if rate > 0 else float("nan")
        pct = 100.0 * self.done / self.total if self.total else 100.0
        bar = "#" * int(pct / 5) + "." * (20 - int(pct / 5))
        s = f"{self.what} [{bar}] {self.done}/{self.total} {self.unit} ({pct:.0f}%)"
        s += f" {rate:.2f} {self.unit}/s"
        if self.extra:
            s += f", {self.extra / dt:.0f} tok/s"
        if eta == eta:
            s += f", ETA {format_seconds(eta)}"
        return s


class StageClock:
    """A stage's wall time, split where its server answers: a rate divides by the work after
    that moment, so a two-minute server start does not read as slow generation (the stages
    make their :class:`Progress` there too, for its rate and ETA)."""

    def __init__(self):
        self.t0 = time.monotonic()
        self.t_ready: float | None = None

    def ready(self) -> None:
        self.t_ready = time.monotonic()

    def split(self) -> dict:
        """``server_start_s``: from the stage's start until the server answered (0 when none
        started); ``elapsed_s``: the work after it."""
        now = time.monotonic()
        ready = self.t_ready if self.t_ready is not None else self.t0
        return {"server_start_s": round(ready - self.t0, 2), "elapsed_s": round(now - ready, 2)}


def format_seconds(s: float) -> str:
    s = int(s)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{sec:02d}s" if m else f"{sec}s")
