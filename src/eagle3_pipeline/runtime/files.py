"""Files that are never half-written: atomic writes, streaming zstd JSONL, checksums."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import zstandard


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success move it into place in one step.

    Readers therefore see either the old file or the complete new one, never a partial one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        if tmp.exists():
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_json(path: str | os.PathLike, obj: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    return json.loads(Path(path).read_text())


def write_jsonl_zst(path: str | os.PathLike, rows: Iterable[dict], level: int = 3) -> int:
    """Stream ``rows`` into a zstd-compressed JSONL file atomically; return the row count."""
    n = 0
    with atomic_path(path) as tmp, open(tmp, "wb") as raw:
        cctx = zstandard.ZstdCompressor(level=level, threads=-1)
        with cctx.stream_writer(raw, closefd=False) as zw:
            buf = io.TextIOWrapper(zw, encoding="utf-8", write_through=True)
            for row in rows:
                buf.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")))
                buf.write("\n")
                n += 1
            buf.flush()
            buf.detach()
    return n


def iter_lines(
    path: str | os.PathLike,
    on_read: Callable[[int], Any] | None = None,
    errors: str = "strict",
) -> Iterator[str]:
    """Text lines of a plain, ``.zst`` or ``.gz`` file, streamed with bounded memory: the one
    reader of (compressed) JSONL. ``on_read(n)`` is told of the ``n`` bytes read from disk since
    its last call (compressed bytes: a progress bar's total is the file size). ``errors``: how
    bytes that are not UTF-8 are decoded (``str.decode``)."""
    path = Path(path)
    with open(path, "rb") as raw:
        if path.name.endswith(".zst"):
            stream: Any = zstandard.ZstdDecompressor().stream_reader(raw)
        elif path.name.endswith(".gz"):
            stream = gzip.GzipFile(fileobj=raw)
        else:
            stream = raw
        reported = 0
        for i, line in enumerate(io.TextIOWrapper(stream, encoding="utf-8", errors=errors)):
            if on_read is not None and i % 1024 == 0:
                on_read(raw.tell() - reported)
                reported = raw.tell()
            yield line
        if on_read is not None:
            on_read(path.stat().st_size - reported)


def iter_jsonl(path: str | os.PathLike) -> Iterator[dict]:
    """Rows of a JSONL file (plain, ``.zst`` or ``.gz``); blank lines are skipped."""
    for line in iter_lines(path):
        if line.strip():
            yield json.loads(line)


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> int:
    path = Path(path)
    if path.suffix == ".zst":
        return write_jsonl_zst(path, rows)
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n


class AppendLog:
    """An append-only JSONL journal that survives ``kill -9``.

    Each record is one line, flushed as written. A process killed mid-write leaves at most one
    partial last line; :meth:`read` drops it and :meth:`open` truncates it away so the next
    append starts on a clean line.
    """

    def __init__(self, path: str | os.PathLike, fsync_every: int = 64, default=None):
        self.path = Path(path)
        self.fsync_every = fsync_every
        self.default = default  # json.dumps(default=...) for values JSON cannot encode
        self._fh = None
        self._since_sync = 0

    def read(self) -> list[dict]:
        return [row for _, _, row in self.records()]

    def records(self) -> Iterator[tuple[int, int, dict]]:
        """Each complete record with the byte offsets where its line starts and ends, one at
        a time (a journal may be larger than memory); a torn last line is left out."""
        if not self.path.exists():
            return
        pos = 0
        with open(self.path, "rb") as fh:
            for raw in fh:
                if not raw.endswith(b"\n"):
                    return
                try:
                    row = json.loads(raw)
                except json.JSONDecodeError:
                    return
                yield pos, pos + len(raw), row
                pos += len(raw)

    def open(self) -> None:
        """Open for appending after dropping any torn tail (the records are not held: a
        journal may be larger than memory)."""
        good_end = 0
        for _, end, _ in self.records():
            good_end = end
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() and self.path.stat().st_size != good_end:
            with open(self.path, "rb+") as fh:
                fh.truncate(good_end)
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - held until close()

    def append(self, row: dict) -> None:
        assert self._fh is not None, "AppendLog.open() first"
        self._fh.write(
            json.dumps(row, ensure_ascii=False, separators=(",", ":"), default=self.default) + "\n"
        )
        self._fh.flush()
        self._since_sync += 1
        if self._since_sync >= self.fsync_every:
            os.fsync(self._fh.fileno())
            self._since_sync = 0

    def close(self) -> None:
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
            self._fh = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_tree(root: str | os.PathLike) -> str:
    """Content hash of a directory (a saved dataset): every file's path relative to ``root`` and
    its sha256, in path order. Two copies of the same content hash alike wherever they lie."""
    root = Path(root)
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(f"{f.relative_to(root).as_posix()}\0{sha256_file(f)}\n".encode())
    return h.hexdigest()


def stable_hash(obj: Any) -> str:
    """Hash of a JSON-able object that does not depend on key order."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
