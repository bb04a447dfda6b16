"""Which samples of a part are done: sealed shards, journals of open ones, the reuse pool and
the layout of the stored samples."""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..hidden_states import shards
from ..runtime.files import AppendLog, read_json, sha256_bytes, write_json

log = logging.getLogger(__name__)


# Finished samples whose key no row of this part has any more wait here for a row that has it
# (after an edit of the prompts, prepare's shuffle puts unchanged rows at other indices):
#   <root>/reuse/<capture fingerprint>/<row key>.safetensors  (+ .json: its journal entry)
REUSE = "reuse"


class ShardBook:
    """Which samples of a part are done: sealed shards (shard.json) and journals of open ones.

    A sample counts as done only if its file is intact (its recorded size and modification
    time, or else its recorded sha256) and holds the row now at its index (its recorded key,
    when ``keys`` are given). An intact file of another row moves to the reuse pool, from
    which :meth:`adopt` takes it for the row that has its key.
    """

    def __init__(
        self,
        root: Path,
        samples_per_shard: int,
        rows: range,
        keys: dict[int, str] | None = None,
        pool: Path | None = None,
    ):
        self.root, self.S, self.rows = root, samples_per_shard, rows
        self.keys, self.pool = keys, pool
        self.done: dict[int, dict] = {}
        self.corrupt: list[int] = []
        self.pooled = 0
        self._journals: dict[int, AppendLog] = {}

    def shards(self) -> list[int]:
        if not len(self.rows):
            return []
        return list(
            range(
                shards.shard_index(self.rows[0], self.S),
                shards.shard_index(self.rows[-1], self.S) + 1,
            )
        )

    def shard_samples(self, s: int) -> range:
        lo = max(s * self.S, self.rows.start)
        return range(lo, min((s + 1) * self.S, self.rows.stop))

    def scan(self, workers: int = 8) -> None:
        entries: dict[int, dict] = {}
        for s in self.shards():
            entries.update((e["index"], e) for e in shard_entries(self.root, s))
        with ThreadPoolExecutor(workers) as pool:
            ok = list(pool.map(lambda e: intact(self.root, e, self.S), entries.values()))
        for e, good in zip(entries.values(), ok, strict=True):
            i = e["index"]
            if not good:
                self.corrupt.append(i)
            elif i in self.rows and (self.keys is None or e.get("key") == self.keys.get(i)):
                self.done[i] = e
            elif self.pool is not None and e.get("key"):
                # another row's sample (rows moved, or fewer rows): kept for the row that has it
                to_pool(shards.sample_path(self.root, i, self.S), e, self.pool)
                self.pooled += 1
        for s in self.shards():  # a shard whose seal no longer describes it is reopened
            seal = shards.shard_dir(self.root, s) / "shard.json"
            if seal.exists():
                sealed = {e["index"] for e in read_json(seal)["samples"]}
                if sealed != set(self.shard_samples(s)) or not sealed <= set(self.done):
                    self._reopen(s, seal)
        self._drop_strays()

    def _reopen(self, s: int, seal: Path) -> None:
        journal = AppendLog(seal.parent / "journal.jsonl")
        journal.open()
        for i in self.shard_samples(s):
            if i in self.done:
                journal.append(self.done[i])
        journal.close()
        seal.unlink()

    def _drop_strays(self) -> None:
        """Remove files not backed by a journal entry (e.g. written just before a kill)."""
        for s in self.shards():
            d = shards.shard_dir(self.root, s)
            if not d.exists():
                continue
            for f in d.glob("hs_*.safetensors*"):
                idx = int(f.name.split("_")[1].split(".")[0])
                if idx not in self.done:
                    f.unlink()

    def adopt(self, index: int) -> bool:
        """Take row ``index``'s sample from the reuse pool (by its key); True if it was there."""
        if self.pool is None or self.keys is None:
            return False
        key = self.keys[index]
        src, side = self.pool / f"{key}.safetensors", self.pool / f"{key}.json"
        try:
            entry = read_json(side)
        except (OSError, ValueError):
            return False
        entry = {**entry, "index": index}
        dest = shards.sample_path(self.root, index, self.S)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(src, dest)  # atomic: of two parts wanting it, one gets it
        except FileNotFoundError:
            return False
        side.unlink(missing_ok=True)
        if not intact(self.root, entry, self.S):
            dest.unlink(missing_ok=True)
            return False
        self.record(entry)
        return True

    def record(self, entry: dict) -> None:
        i = entry["index"]
        s = shards.shard_index(i, self.S)
        j = self._journals.get(s)
        if j is None:
            shards.shard_dir(self.root, s).mkdir(parents=True, exist_ok=True)
            j = self._journals[s] = AppendLog(shards.shard_dir(self.root, s) / "journal.jsonl")
            j.open()
        j.append(entry)
        self.done[i] = entry
        if all(k in self.done for k in self.shard_samples(s)):
            self.seal(s)

    def seal(self, s: int) -> None:
        d = shards.shard_dir(self.root, s)
        samples = [self.done[k] for k in self.shard_samples(s)]
        write_json(d / "shard.json", {"index": s, "samples": samples})
        if s in self._journals:
            self._journals.pop(s).close()
        (d / "journal.jsonl").unlink(missing_ok=True)

    def close(self) -> None:
        for j in self._journals.values():
            j.close()
        self._journals.clear()

    def summary(self, s: int) -> dict[str, Any]:
        samples = [self.done[k] for k in self.shard_samples(s)]
        h = sha256_bytes("".join(e["sha256"] for e in samples).encode())
        return {
            "index": s,
            "samples": [samples[0]["index"], samples[-1]["index"]],
            "count": len(samples),
            "tokens": sum(e["tokens"] for e in samples),
            "bytes": sum(e["bytes"] for e in samples),
            "sha256": h,
        }


def shard_entries(root: Path, s: int) -> list[dict]:
    """The recorded samples of shard ``s``: its seal, or the journal of an open shard."""
    d = shards.shard_dir(root, s)
    if (d / "shard.json").exists():
        return read_json(d / "shard.json")["samples"]
    return AppendLog(d / "journal.jsonl").read()


def intact(root: Path, entry: dict, samples_per_shard: int) -> bool:
    """The sample file of ``entry`` is as recorded: its size, and its modification time or,
    where that differs (a copy, a rewrite), its sha256. Hashing every file of a large
    extraction takes many minutes, so an untouched file is trusted by its metadata."""
    path = shards.sample_path(root, entry["index"], samples_per_shard)
    try:
        st = path.stat()
        if st.st_size != entry["bytes"]:
            return False
        if entry.get("mtime_ns") == st.st_mtime_ns:
            return True
        return sha256_bytes(path.read_bytes()) == entry["sha256"]
    except OSError:
        return False


def to_pool(path: Path, entry: dict, pool: Path) -> None:
    """Move a finished sample into the reuse pool under its key (entry first, then file)."""
    pool.mkdir(parents=True, exist_ok=True)
    write_json(pool / f"{entry['key']}.json", {k: v for k, v in entry.items() if k != "index"})
    os.replace(path, pool / f"{entry['key']}.safetensors")


def reset_layout(root: Path, capture: str, samples_per_shard: int, num_samples: int) -> Path:
    """Make the stored samples under ``root`` fit this run; return its reuse pool.

    Runs in every part under one lock. Samples of another capture (target, layers, storage,
    server numerics) are deleted. Samples stored under another ``samples_per_shard``, or in
    shards past the end of the rows (fewer rows than before), move to the reuse pool.
    """
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".layout.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        layout_file = root / "layout.json"
        old = read_json(layout_file) if layout_file.exists() else {}
        pool = root / REUSE / capture
        if old.get("capture") != capture:
            if (root / "shards").exists() or (root / REUSE).exists():
                log.info("target, layers or storage changed: removing the stored hidden states")
            shutil.rmtree(root / "shards", ignore_errors=True)
            shutil.rmtree(root / REUSE, ignore_errors=True)
            old = {}
        old_S = old.get("samples_per_shard", samples_per_shard)
        last_shard = -(-num_samples // samples_per_shard) - 1 if old_S == samples_per_shard else -1
        for d in sorted((root / "shards").glob("shard_*")) if (root / "shards").exists() else []:
            s = int(d.name.split("_")[1])
            if s <= last_shard:
                continue
            for e in shard_entries(root, s):
                if e.get("key") and intact(root, e, old_S):
                    to_pool(shards.sample_path(root, e["index"], old_S), e, pool)
            shutil.rmtree(d)
        write_json(layout_file, {"capture": capture, "samples_per_shard": samples_per_shard})
    return pool
