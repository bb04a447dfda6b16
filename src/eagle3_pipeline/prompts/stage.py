"""The prompts stage: write the training pool (with the held-out benchmark set taken out of it)
or one benchmark set, with its stats."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from ..runtime.files import read_json, write_json, write_jsonl
from ..runtime.provenance import provenance
from ..target.chat import ContextLimit
from . import pool
from .decontam import bench_index
from .rows import validate_row
from .selection import (
    BAD_REASONS,
    HELDOUT_SET,
    collect,
    fit_context,
    licence_counts,
    new_counts,
    split_heldout,
)
from .sources import source_name

# the package's logger: a job's log reads as before the package was split into modules
log = logging.getLogger(__package__)

DEFAULTS = {
    "seed": 0,
    "max_chars": 8000,
    "max_bad_fraction": 0.5,
    "near_duplicates": None,
    "decontamination_ngram": None,
    "decontaminate_against": [],
}
REMOVED = ("duplicates_across_sources", "near_duplicates")


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
    if any("decontaminated" in st for st in per_source.values()):
        tot["decontaminated"] = {}
        for st in per_source.values():
            for against, n in st["decontaminated"].items():
                tot["decontaminated"][against] = tot["decontaminated"].get(against, 0) + n
        for k in REMOVED:
            tot[k] = sum(st[k] for st in per_source.values())
        tot["in_pool"] = sum(st["in_pool"] for st in per_source.values())
    return tot


def _collect_split(
    specs: list[dict],
    split: str,
    params: dict,
    context: ContextLimit | None,
    written: dict | None = None,
) -> tuple[dict, dict]:
    """Each source's sampled rows and stats; with ``context``, without the prompts too long for
    it (counted as over_context). ``written``: the rows file of each self_written source."""
    rows_by_name: dict[str, list[dict]] = {}
    stats: dict[str, dict] = {}
    for i, spec in enumerate(specs):
        name = source_name(spec)
        if name in stats:
            raise ValueError(
                f"config key `prompts.{split}[{i}]`: two sources are called "
                f"{name!r}; give them different `name`s"
            )
        rows, stats[name] = collect(
            spec, split, params["seed"], params["max_chars"], params["max_bad_fraction"], written
        )
        if context is not None:
            rows, over = fit_context(rows, context, f"{split}/{name}", params["max_bad_fraction"])
            stats[name]["skipped"]["over_context"] = over["count"] if over else 0
            stats[name]["over_context"] = over
        rows_by_name[name] = rows
    return rows_by_name, stats


def _write_split(
    split: str,
    params: dict,
    rows_by_name: dict,
    stats: dict,
    out: str | Path,
    stats_out,
    t0,
    extra: dict | None = None,
) -> dict:
    """Write one output file (the training pool or one benchmark set) and its stats."""
    rows = [row for part in rows_by_name.values() for row in part]
    if not rows:
        given = "; ".join(
            f"{name} ({st.get('path') or st['source']}): {st['rows_read']} rows read, "
            + (", ".join(f"{k} {v}" for k, v in st["skipped"].items() if v) or "none bad")
            + f", {st['duplicates']} duplicates"
            for name, st in stats.items()
        )
        raise ValueError(
            f"no {split} prompts: no `prompts.{split}` source gave a usable row ({given}); "
            f"point prompts.{split} at prompts that are not empty, too long or malformed"
        )
    ids = [r["id"] for r in rows]
    if len(set(ids)) != len(ids):
        raise ValueError("prompt ids are not unique")  # guarded above; never expected
    for r in rows:
        validate_row(r)
    written = write_jsonl(out, rows)
    result = {
        split: stats,
        "totals": _totals(stats),
        **(extra or {}),
        "output": {"path": str(out), "rows": written},
        "seconds": round(time.monotonic() - t0, 3),
        "provenance": provenance(params),
    }
    write_json(stats_out, result)
    log.info("prompts: %d %s prompts in %s (%.1fs)", written, split, out, result["seconds"])
    return result


def build_train(
    params: dict,
    train_out: str | Path,
    stats_out: str | Path,
    heldout_out: str | Path | None = None,
    heldout_stats_out: str | Path | None = None,
    context: ContextLimit | None = None,
    written: dict[str, dict[str, str]] | None = None,
) -> dict:
    """Write the training pool of every ``prompts.train`` source and its stats; return them.

    ``params`` is the ``prompts`` config section (:data:`DEFAULTS` for missing keys;
    ``heldout`` is 0 unless given). The sampled rows of every source are cleaned together
    (:func:`.pool.clean`): prompts of the benchmark sources ``decontaminate_against``
    (config.decontamination_sources), repeats across sources and near-duplicates are removed.
    With ``heldout: N`` > 0, N prompts of the pool (:func:`split_heldout`) are never trained
    on: they are written to ``heldout_out`` as the benchmark set :data:`HELDOUT_SET`, where the
    acceptance predicted by validation applies, and the training prompts that contain one are
    removed too. ``context``: the limit synth's requests put on a prompt (vllm.max_model_len -
    synth.max_tokens); sampled prompts over it are skipped (over_context). ``written``: per
    self_written source, ``{"rows": path, "stats": path}`` of what its target wrote.
    """
    params = {**DEFAULTS, **params}
    n_heldout = int(params.get("heldout") or 0)
    if n_heldout and heldout_out is None:
        raise ValueError("prompts.heldout > 0 needs a path for the held-out benchmark set")
    t0 = time.monotonic()
    written = written or {}
    rows_by_name, stats = _collect_split(
        params["train"], "train", params, context, {n: w["rows"] for n, w in written.items()}
    )
    for name, w in written.items():
        stats[name]["written"] = read_json(w["stats"])
    ngram = params["decontamination_ngram"]
    bench = bench_index(params["decontaminate_against"], ngram)
    rows_by_name = pool.clean(rows_by_name, stats, params["near_duplicates"], bench)
    merged = [row for part in rows_by_name.values() for row in part]
    train_rows, held = split_heldout(merged, n_heldout, params["seed"])
    if held:
        held_ids = {r["id"] for r in held}
        for name, part in rows_by_name.items():
            rows_by_name[name] = [r for r in part if r["id"] not in held_ids]
            stats[name]["heldout"] = len(part) - len(rows_by_name[name])
        rows_by_name = pool.without_heldout(rows_by_name, stats, held, ngram)
        train_rows = [row for part in rows_by_name.values() for row in part]
    for name, part in rows_by_name.items():
        stats[name]["in_pool"] = len(part)
        if "licences" in stats[name]:  # an evaluation suite's, per licence of its tasks
            for entry in stats[name]["licences"].values():
                entry["in_pool"] = 0
            licence_counts(stats[name]["source"], part, "in_pool", stats[name]["licences"])
    if held:
        heldout_stats = {
            **new_counts(),
            "source": HELDOUT_SET,
            "name": HELDOUT_SET,
            "rows_read": len(merged),
            "kept": len(merged),
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
    result = _write_split(
        "train",
        params,
        rows_by_name,
        stats,
        train_out,
        stats_out,
        t0,
        {"decontamination": {"turns_indexed": bench.turns, "ngram": ngram}},
    )
    log.info(
        "prompts: %d training prompts, %d held out for benchmarking", len(train_rows), len(held)
    )
    return result


def build_bench(
    params: dict,
    spec: dict,
    out: str | Path,
    stats_out: str | Path,
    context: ContextLimit | None = None,
) -> dict:
    """Write one benchmark prompt set, defined by ``spec`` (an entry of ``prompts.bench``),
    and its stats; return the stats. ``params`` gives seed, max_chars and max_bad_fraction;
    ``context`` the limit the bench's requests put on a prompt (vllm.max_model_len -
    bench.max_tokens): sampled prompts over it are skipped (over_context)."""
    params = {**DEFAULTS, **params, "bench": [spec]}
    t0 = time.monotonic()
    rows, stats = _collect_split([spec], "bench", params, context)
    return _write_split("bench", params, rows, stats, out, stats_out, t0)
