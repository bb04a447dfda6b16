"""The training pool made clean, once every source is sampled: prompts that contain a
benchmark prompt (:mod:`.decontam`), the same prompt again in another source, and
near-duplicates (:mod:`.dedup`) are removed; after the held-out split, training prompts that
contain a held-out one.

Removal comes after sampling, as the context check does: a removed prompt leaves every other
sampled prompt where it was, so a new benchmark source or another threshold costs synth no new
answer for the prompts that stay. Rows are judged in pool order (sources in config order, each
in file order): of two duplicates the first stays. Each source's stats count what was removed,
by reason, with a few examples (:data:`EXAMPLES` per reason).
"""

from __future__ import annotations

import logging
from typing import Any

from .decontam import BenchIndex
from .dedup import NearDuplicates, exact_key

log = logging.getLogger(__package__)

EXAMPLES = 5  # removed prompts kept per source and reason, for the report
HELDOUT_AGAINST = "heldout"  # what the held-out set is called among the benchmark sources
EXAMPLE_CHARS = 300


def removal_counts() -> dict[str, Any]:
    return {
        "decontaminated": {},
        "decontaminated_by_how": {},
        "duplicates_across_sources": 0,
        "near_duplicates": 0,
        "removed_examples": [],
    }


def _example(row: dict, reason: str, **why) -> dict:
    text = row["messages"][-1]["content"]
    cut = text if len(text) <= EXAMPLE_CHARS else text[:EXAMPLE_CHARS] + "..."
    return {"id": row["id"], "reason": reason, "prompt": cut, **why}


def _remove(st: dict, row: dict, reason: str, **why) -> None:
    if reason == "decontaminated":
        against, how = why["against"], why["how"]
        st["decontaminated"][against] = st["decontaminated"].get(against, 0) + 1
        st["decontaminated_by_how"][how] = st["decontaminated_by_how"].get(how, 0) + 1
    else:
        st[reason] += 1
    if sum(e["reason"] == reason for e in st["removed_examples"]) < EXAMPLES:
        st["removed_examples"].append(_example(row, reason, **why))


def clean(
    rows_by_name: dict[str, list[dict]],
    stats: dict[str, dict],
    near_threshold: float | None,
    bench: BenchIndex | None,
) -> dict[str, list[dict]]:
    """The sampled rows of each source without those contaminated by ``bench``, repeated from
    an earlier source, or near-duplicates of an earlier row (``near_threshold``: the Jaccard
    similarity from which a row is one; None: same words only); counts into ``stats``."""
    seen: dict[str, tuple[str, str]] = {}  # exact key -> (source, row id)
    near = NearDuplicates(near_threshold) if near_threshold is not None else None
    out: dict[str, list[dict]] = {}
    for name, rows in rows_by_name.items():
        st = stats[name]
        st.update(removal_counts())
        kept = []
        for row in rows:
            found = bench.match(row["messages"]) if bench is not None else None
            if found:
                _remove(
                    st,
                    row,
                    "decontaminated",
                    against=found.against,
                    how=found.how,
                    matched=found.text[:EXAMPLE_CHARS],
                )
                continue
            key = exact_key(row["messages"])
            if key in seen:
                source, of = seen[key]
                reason = "duplicates_across_sources" if source != name else "near_duplicates"
                _remove(st, row, reason, of=of)
                continue
            if near is not None:
                dup = near.check(row["id"], row["messages"])
                if dup:
                    _remove(st, row, "near_duplicates", of=dup[0], similarity=round(dup[1], 3))
                    continue
            seen[key] = (name, row["id"])
            kept.append(row)
        out[name] = kept
        removed = len(rows) - len(kept)
        if removed:
            log.info(
                "prompt source train/%s: %d sampled prompts removed (%s)",
                name,
                removed,
                describe(st),
            )
    return out


def without_heldout(
    rows_by_name: dict[str, list[dict]],
    stats: dict[str, dict],
    held: list[dict],
    ngram: int | None,
) -> dict[str, list[dict]]:
    """The training rows without those that contain a held-out prompt (counted as
    decontaminated against :data:`HELDOUT_AGAINST`)."""
    index = BenchIndex(ngram)
    index.add_rows(HELDOUT_AGAINST, held)
    out = {}
    for name, rows in rows_by_name.items():
        kept = []
        for row in rows:
            found = index.match(row["messages"])
            if found:
                _remove(
                    stats[name],
                    row,
                    "decontaminated",
                    against=found.against,
                    how=found.how,
                    matched=found.text[:EXAMPLE_CHARS],
                )
            else:
                kept.append(row)
        out[name] = kept
    return out


def describe(st: dict) -> str:
    parts = [f"{against} {n}" for against, n in st["decontaminated"].items()]
    decon = f"decontaminated: {', '.join(parts)}" if parts else "decontaminated 0"
    return (
        f"{decon}; duplicates across sources {st['duplicates_across_sources']}; "
        f"near-duplicates {st['near_duplicates']}"
    )
