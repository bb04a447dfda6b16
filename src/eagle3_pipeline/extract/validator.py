"""Checking a sample the server wrote, off the request path.

A staged file is checked on the CPU by its bits (``verify.check_stored``: shapes, token ids,
NaN/Inf, all-zero rows), hashed and moved into its shard by :func:`take_sample` in a worker
thread; only the final-layer hidden states at the probed positions leave it. Those rows of
many samples go through one next-token probe call (:class:`ProbeBatcher`): norm and lm_head
run once for a batch instead of once per sample, on the probe's device.
"""

from __future__ import annotations

import asyncio
import fcntl
import itertools
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..hidden_states import shards
from ..hidden_states.checks import check_stored, probe_positions
from ..runtime.files import sha256_bytes
from .capture import row_key


@dataclass
class Checked:
    """A sample that passed its checks and sits in its shard, waiting for its probe result."""

    entry: dict[str, Any]  # its journal entry, without "agree"
    rows: Any  # float32 final-layer hidden states at the probed positions [n, hidden]
    targets: list[int]  # the token that follows each probed position


class Timings:
    """Seconds per phase, summed over the validator threads."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._lock = threading.Lock()

    def add(self, phases: tuple[str, ...], clock: list[float]) -> None:
        with self._lock:
            for phase, (a, b) in zip(phases, itertools.pairwise(clock), strict=True):
                self.seconds[phase] = self.seconds.get(phase, 0.0) + (b - a)


PHASES = ("wait_write", "read", "parse", "checks", "hash_move")


def _take_writers_lock(staged: str, block: bool) -> bool:
    """The connector holds an exclusive flock on ``staged.lock`` while it writes ``staged``:
    take it shared (sleeping until the write is done if ``block``; the interpreter lock is
    released meanwhile), then remove the lock file. False: still being written."""
    lock = staged + ".lock"
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return True  # never made, or removed already
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if block else fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    os.unlink(lock)
    return True


def written_now(staged: str) -> bool:
    """Whether the server has finished writing ``staged``, without waiting."""
    return _take_writers_lock(staged, block=False)


def wait_written(staged: str, timings: Timings | None = None) -> None:
    """Return once the server has finished writing ``staged`` (no polling latency holding a
    request slot)."""
    t = [time.perf_counter()]
    _take_writers_lock(staged, block=True)
    if timings is not None:
        t.append(time.perf_counter())
        timings.add(PHASES[:1], t)


@dataclass
class StagedSample:
    """A staged file that passed its checks: its bytes (in the reading thread's buffer, valid
    until that thread reads its next file), its tensors (views of those bytes), the final-layer
    rows at the probed positions and the tokens that follow them."""

    data: memoryview
    tensors: dict
    rows: Any  # float32 [n, hidden]
    targets: list[int]
    clock: list[float]  # perf_counter at the end of each of PHASES[:4], from the start


def check_staged(
    staged: str,
    row: dict,
    num_layers: int,
    hidden_size: int,
    max_positions: int,
    written: bool = False,
    data: bytes | None = None,
) -> StagedSample:
    """Wait until the server has written ``staged`` (unless ``written``: :func:`wait_written`
    has returned for it already), read it and check it against ``row`` (shapes, token ids,
    NaN/Inf, all-zero rows: VerificationError), and pick the final-layer rows the next-token
    probe needs. What the extract job and online training (:mod:`eagle3_pipeline.online.transfer`)
    both do with a sample the server returned; ``data``: its bytes, taken from a Mooncake store
    instead."""
    clock = time.perf_counter
    t = [clock()]
    if not written and data is None:
        wait_written(staged)
    t.append(clock())
    if data is None:
        data = read_into_thread_buffer(staged)
    t.append(clock())
    tensors = shards.tensors_from_bytes(data)
    t.append(clock())
    ids = row["input_ids"]
    check_stored(tensors, ids, num_layers, hidden_size, shards.SCALES_KEY)
    positions = probe_positions(ids, row["loss_mask"], max_positions)
    rows = final_rows(tensors, positions)
    t.append(clock())
    return StagedSample(data, tensors, rows, [ids[p + 1] for p in positions], t)


def take_sample(
    staged: str,
    index: int,
    row: dict,
    num_layers: int,
    hidden_size: int,
    max_positions: int,
    root: Path,
    samples_per_shard: int,
    timings: Timings,
    written: bool = False,
) -> Checked:
    """Check the staged file of row ``index`` and move it into its shard (a worker thread).
    ``written``: :func:`wait_written` has returned for it already (in a thread of its own).
    Raises VerificationError for a wrong sample; the staged file then stays out of the shards.
    A moved file without its journal entry (the probe or the job failing next) is a stray
    that the next scan removes."""
    sample = check_staged(staged, row, num_layers, hidden_size, max_positions, written)
    t = sample.clock
    digest = sha256_bytes(sample.data)
    dest = shards.sample_path(root, index, samples_per_shard)
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staged, dest)
    mtime_ns = dest.stat().st_mtime_ns
    t.append(time.perf_counter())
    timings.add(PHASES, t)
    ids = row["input_ids"]
    entry = {
        "index": index,
        "key": row_key(ids),
        "tokens": len(ids),
        "bytes": len(sample.data),
        "sha256": digest,
        "mtime_ns": mtime_ns,
    }
    return Checked(entry, sample.rows, sample.targets)


def read_into_thread_buffer(path: str) -> memoryview:
    """The file's bytes, in a buffer the calling thread keeps (:func:`shards.thread_buffer`),
    valid until this thread reads its next file."""
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        view = shards.thread_buffer("read", size)
        done = 0
        while done < size:
            got = f.readinto(view[done:])
            if not got:
                raise OSError(f"{path}: {done} of {size} bytes read")
            done += got
    return view


def final_rows(tensors: dict, positions: list[int]):
    """The last captured layer's hidden states at ``positions``, dequantized to float32 (the
    values the probe would get from the whole dequantized sample)."""
    import torch

    idx = torch.tensor(positions, dtype=torch.long)
    picked = {"hidden_states": tensors["hidden_states"][idx, -1:]}
    if shards.SCALES_KEY in tensors:
        picked[shards.SCALES_KEY] = tensors[shards.SCALES_KEY][idx]
    return shards.dequantize(picked)[:, 0].float()


class ProbeBatcher:
    """Next-token hits of many samples from few probe calls.

    Samples that arrive while a batch is in the probe wait for it to finish and then go
    together as the next batch, so the batch grows with the load and a lone sample is never
    held back. The probe runs in an executor of its own (one thread)."""

    def __init__(self, probe, executor, timings: Timings):
        self.probe, self.executor, self.timings = probe, executor, timings
        self.pending: list[tuple[Any, list[int], asyncio.Future]] = []
        self.running = False
        self.batches = 0

    async def hits(self, rows, targets: list[int]) -> int:
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((rows, targets, fut))
        if not self.running:
            self._start()
        return await fut

    def _start(self) -> None:
        batch, self.pending = self.pending, []
        self.running = True
        self.batches += 1
        done = asyncio.get_running_loop().run_in_executor(self.executor, self._probe, batch)
        done.add_done_callback(lambda f: self._finish(batch, f))

    def _probe(self, batch) -> list[int]:
        t = [time.perf_counter()]
        out = self.probe.agreement_batch([(rows, targets) for rows, targets, _ in batch])
        t.append(time.perf_counter())
        self.timings.add(("probe",), t)
        return out

    def _finish(self, batch, f: asyncio.Future) -> None:
        self.running = False
        for i, (_, _, fut) in enumerate(batch):
            if fut.done():
                continue
            if f.cancelled():
                fut.cancel()
            elif f.exception() is not None:
                fut.set_exception(f.exception())
            else:
                fut.set_result(f.result()[i])
        if self.pending:
            self._start()
