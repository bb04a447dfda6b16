"""Which rows of a source become prompts: filtering (malformed, empty, over-length), dedupe,
the bad-fraction check, seeded sampling, and the held-out split of the training pool."""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

from ..runtime.files import sha256_bytes
from .rows import (
    LATER_TURNS,
    Malformed,
    ShortAnswer,
    all_turns,
    dedupe_key,
    normalize_row,
    problem,
    user_turn_prefixes,
)
from .sources import read_source, source_name
from .suites import PER_TASK_CAP, SUITES, noncommercial, suite_row, task_licence

# the package's logger: a job's log reads as before the package was split into modules
log = logging.getLogger(__package__)

BAD_REASONS = ("malformed", "empty", "over_length", "over_context")
# The benchmark set that prompts.heldout takes out of the training pool (a reserved name).
HELDOUT_SET = "heldout"
# sources of whole conversations: a prompt may carry the turns before its last
CONVERSATIONS = ("sharegpt", "chitchat", "file")
SOURCE_DEFAULTS = {
    "n": None,
    "multi_turn": False,
    "each_turn": False,
    "max_turns": 6,
    "per_task_cap": None,  # an evaluation suite's: suites.PER_TASK_CAP
}


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

    With ``each_turn`` a raw row yields one sample per user turn (``kept`` counts samples).
    An evaluation suite's rows whose answer is one word are counted as ``short_answer``,
    neither bad nor a candidate."""
    counts = new_counts() if counts is None else counts
    if kind in SUITES:
        counts.setdefault("short_answer", 0)
    detail: Counter = Counter()
    prefix = kind if name == kind else f"{kind}:{name}"
    rows: list[dict] = []
    seen: set[bytes] = set()
    ids: set[str] = set()
    for index, raw in enumerate(raws):
        counts["rows_read"] += 1
        try:
            rid, messages, extra = (
                suite_row(kind, raw)
                if kind in SUITES
                else normalize_row(kind, raw, index, multi_turn or each_turn, max_turns)
            )
        except Malformed as e:
            counts["skipped"]["malformed"] += 1
            detail[str(e)] += 1
            continue
        except ShortAnswer:
            counts["short_answer"] += 1
            continue
        samples = (
            [(f"{rid}.t{k}", p) for k, p in enumerate(user_turn_prefixes(messages), 1)]
            if each_turn
            else [(rid, messages)]
        )
        for sid, sample in samples:
            turns = all_turns({"messages": sample, **extra})
            reason = problem(turns, max_chars)
            if reason:
                counts["skipped"][reason] += 1
                continue
            key = dedupe_key(turns)
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


def cap_tasks(
    rows: list[dict], cap: int, seed: int, split: str, name: str
) -> tuple[list[dict], dict]:
    """At most ``cap`` rows of each task (a seeded sample of a task over it, as :func:`select`
    samples a source), in their original order, and per task its usable rows and licence."""
    by_task: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        by_task.setdefault(row["task"], []).append(i)
    keep: set[int] = set()
    for task, idx in by_task.items():
        if len(idx) <= cap:
            keep.update(idx)
        else:
            rng = random.Random(seed + source_offset(split, f"{name}/{task}"))
            keep.update(rng.sample(idx, cap))
    return [r for i, r in enumerate(rows) if i in keep], {
        "per_task_cap": cap,
        "over_task_cap": len(rows) - len(keep),
        "tasks_usable": {task: len(idx) for task, idx in sorted(by_task.items())},
    }


def licence_counts(kind: str, rows: list[dict], key: str, into: dict | None = None) -> dict:
    """Per licence of an evaluation suite's tasks: its tasks among ``rows`` and how many rows
    (under ``key``: sampled, in_pool), and whether it is non-commercial; added to ``into``."""
    out = into if into is not None else {}
    for row in rows:
        licence = task_licence(kind, row["task"])
        entry = out.setdefault(licence, {"noncommercial": noncommercial(licence), "tasks": []})
        entry[key] = entry.get(key, 0) + 1
        if row["task"] not in entry["tasks"]:
            entry["tasks"].append(row["task"])
    return out


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


def turns_problem(kind: str, split: str, multi_turn: bool, each_turn: bool):
    """``(key, why)`` when a source cannot keep the turns asked of it, else None: a
    conversation's turns need the answers between them, which ShareGPT, chitchat and files
    have; MT-Bench's later questions are asked after the measured server's own answers, in a
    benchmark set only."""
    if each_turn and kind not in CONVERSATIONS:
        return (
            "each_turn",
            "is only for sources sharegpt, chitchat and file (no answers between the turns)",
        )
    if multi_turn and kind not in CONVERSATIONS and (kind, split) != ("mtbench", "bench"):
        return "multi_turn", (
            "is only for sources sharegpt, chitchat and file, and mtbench in prompts.bench (its "
            "later questions are asked after the measured server's own answers, which a "
            "training prompt does not have)"
        )
    return None


def collect(
    spec: dict,
    split: str,
    seed: int,
    max_chars: int,
    max_bad_fraction: float,
    written: dict | None = None,
) -> tuple[list[dict], dict]:
    """Read, filter, dedupe and sample one source; return its rows and stats. ``written``: the
    rows file of each self_written source."""
    spec = {**SOURCE_DEFAULTS, **spec}
    kind, name = spec["source"], source_name(spec)
    where = f"{split}/{name}"
    wrong = turns_problem(kind, split, spec["multi_turn"], spec["each_turn"])
    if wrong:
        raise ValueError(f"prompt source {where}: {wrong[0]} {wrong[1]}")
    t0 = time.monotonic()
    raws, info = read_source(spec, written)
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
    if kind in SUITES:
        rows, capped = cap_tasks(rows, spec["per_task_cap"] or PER_TASK_CAP, seed, split, name)
        stats.update(capped)
    picked = select(rows, spec["n"], seed + source_offset(split, name))
    if kind in SUITES:
        stats["licences"] = licence_counts(kind, picked, "sampled")
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


def context_tokens(row: dict, context) -> int:
    """The tokens of a row's prompt as the server sees it; with later turns, of its last
    turn's, each answer before it counted at the most it may take (``context.answer_tokens``)."""
    later = row.get(LATER_TURNS, ())
    if not later:
        return context.tokens(row["messages"])
    messages = list(row["messages"])
    for turn in later:
        messages += [{"role": "assistant", "content": ""}, {"role": "user", "content": turn}]
    return context.tokens(messages) + len(later) * context.answer_tokens


def fit_context(
    rows: list[dict], context, where: str, max_bad_fraction: float
) -> tuple[list[dict], dict | None]:
    """The rows whose prompt fits ``context`` (a :class:`~eagle3_pipeline.target.chat.
    ContextLimit`: the target's tokens with its chat template, against what the context leaves
    for the answer), in order, and what was skipped (None when nothing was): the limit, how it
    was set and the prompts over it with their token counts. Applied to the sampled rows, so
    that the others stay the rows they were; a server would refuse each skipped one. ValueError
    when more than ``max_bad_fraction`` of them are over it."""
    kept, over = [], []
    for row in rows:
        tokens = context_tokens(row, context)
        if tokens > context.max_tokens:
            over.append({"id": row["id"], "tokens": tokens})
        else:
            kept.append(row)
    if not over:
        return kept, None
    limit = f"{context.max_tokens} tokens ({context.why})"
    for o in over[:10]:
        log.warning("prompt %s is %d tokens, over the %s: skipped", o["id"], o["tokens"], limit)
    if len(over) > 10:
        log.warning("... and %d more prompts over %s", len(over) - 10, limit)
    if len(over) > max_bad_fraction * len(rows):
        longest = max(over, key=lambda o: o["tokens"])
        raise ValueError(
            f"prompt source {where}: {len(over)} of {len(rows)} sampled prompts are longer than "
            f"the context leaves for the answer, {limit} (the longest: {longest['id']}, "
            f"{longest['tokens']} tokens), more than `prompts.max_bad_fraction` = "
            f"{max_bad_fraction}: {context.fix()}"
        )
    return kept, {
        "limit": context.max_tokens,
        "why": context.why,
        "count": len(over),
        "prompts": over[:100],
    }


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
