"""Files that are never half-written: atomic writes, streaming zstd JSONL, checksums."""

from __future__ import annotations

import contextlib
import glob
import gzip
import hashlib
import io
import json
import os
import shutil
import socket
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import zstandard


def temporary_path(path: str | os.PathLike) -> Path:
    """The hidden path beside ``path`` that this process writes before moving it into place:
    ``.<name>.tmp-<host>-<pid>``, so that a temporary a killed writer left is known as such
    (:func:`remove_stale_temporaries`)."""
    path = Path(path)
    return path.with_name(f"{_temporary_prefix(path)}{os.getpid()}")


def _temporary_prefix(path: Path) -> str:
    return f".{path.name}.tmp-{socket.gethostname()}-"


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Remove the temporaries of ``path`` (:func:`temporary_path`) whose writer on this host is
    gone: a writer killed with SIGKILL (or by the machine) cannot remove its own. Those of live
    processes and of other hosts (a shared file system) are left alone. Returns the removed."""
    path = Path(path)
    prefix = _temporary_prefix(path)
    removed = []
    for tmp in path.parent.glob(glob.escape(prefix) + "*"):
        pid = tmp.name[len(prefix) :]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        removed.append(tmp)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success move it into place in one step.

    Readers therefore see either the old file or the complete new one, never a partial one.
    Temporaries of ``path`` that killed writers left are removed first.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    tmp = temporary_path(path)
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


class TruncatedFile(ValueError):
    """A compressed file that ends inside a frame or member: it was not written whole."""


class _ZstdFrames(io.RawIOBase):
    """The decompressed bytes of every zstd frame of ``raw``, one after another. A stream that
    ends inside a frame raises :class:`TruncatedFile` (zstandard's own reader ends quietly
    there, as if the file were whole)."""

    def __init__(self, raw: Any, name: str, chunk: int = 1 << 16):
        self.raw, self.name, self.chunk = raw, name, chunk
        self._obj = zstandard.ZstdDecompressor().decompressobj(write_size=1 << 20)
        self._in_frame = False
        self._out, self._pos = memoryview(b""), 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while self._pos == len(self._out):
            data = self.raw.read(self.chunk)
            if not data:
                if self._in_frame:
                    raise TruncatedFile(f"{self.name} ends inside a zstd frame: it is truncated")
                return 0
            self._out, self._pos = memoryview(self._feed(data)), 0
        n = min(len(b), len(self._out) - self._pos)
        b[:n] = self._out[self._pos : self._pos + n]
        self._pos += n
        return n

    def _feed(self, data: bytes) -> bytes:
        out = []
        while data:
            self._in_frame = True
            out.append(self._obj.decompress(data))
            if not self._obj.eof:
                break
            data = self._obj.unused_data  # the next frame's start, if any
            self._obj = zstandard.ZstdDecompressor().decompressobj(write_size=1 << 20)
            self._in_frame = False
        return b"".join(out)


@contextlib.contextmanager
def _decompressed(path: Path) -> Iterator[tuple[Any, Any]]:
    """``(raw file, binary stream of its content)`` of a plain, ``.zst`` or ``.gz`` file."""
    with open(path, "rb") as raw:
        if path.name.endswith(".zst"):
            yield raw, io.BufferedReader(_ZstdFrames(raw, str(path)), buffer_size=1 << 20)
        elif path.name.endswith(".gz"):
            yield raw, gzip.GzipFile(fileobj=raw)
        else:
            yield raw, raw


def iter_lines(
    path: str | os.PathLike,
    on_read: Callable[[int], Any] | None = None,
    errors: str = "strict",
) -> Iterator[str]:
    """Text lines of a plain, ``.zst`` or ``.gz`` file, streamed with bounded memory: the one
    reader of (compressed) JSONL. ``on_read(n)`` is told of the ``n`` bytes read from disk since
    its last call (compressed bytes: a progress bar's total is the file size). ``errors``: how
    bytes that are not UTF-8 are decoded (``str.decode``). A truncated compressed file raises
    :class:`TruncatedFile` where it ends."""
    path = Path(path)
    with _decompressed(path) as (raw, stream):
        reported = 0
        for i, line in enumerate(io.TextIOWrapper(stream, encoding="utf-8", errors=errors)):
            if on_read is not None and i % 1024 == 0:
                on_read(raw.tell() - reported)
                reported = raw.tell()
            yield line
        if on_read is not None:
            on_read(path.stat().st_size - reported)


def iter_byte_lines(path: str | os.PathLike) -> Iterator[bytes]:
    """The lines of a plain, ``.zst`` or ``.gz`` file as bytes, undecoded (each line decodes,
    or fails to, on its own), streamed; a truncated compressed file raises
    :class:`TruncatedFile` where it ends."""
    with _decompressed(Path(path)) as (_, stream):
        yield from stream


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
