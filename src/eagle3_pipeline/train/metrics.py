"""Metric records of every training attempt (written by :mod:`.entry`) summarized per epoch,
with throughput and resume history."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

from .. import methods
from ..runtime.files import AppendLog
from ..runtime.results import TRAIN_METRICS, format_tag
from ..stats import median

METRICS_FORMAT = format_tag(TRAIN_METRICS)
RECORDS = "logs/metrics.jsonl"


def read_records(path: Path) -> list[dict[str, Any]]:
    return AppendLog(path).read() if path.exists() else []


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return sum(xs) / len(xs) if xs else None


def summarize(
    records: list[dict[str, Any]], method: str, positions: int, warmup_steps: int = 0
) -> dict[str, Any]:
    """Per-epoch train/val metrics, throughput and resume history from the records.

    The metrics are the method's (:meth:`eagle3_pipeline.methods.base.Method.metric_keys`;
    ``positions`` draft positions: EAGLE-3's TTT steps, DFlash's block slots). A step that was
    trained twice (after a resume) counts once, from the later attempt. ``warmup_steps`` first
    steps of every attempt are left out of the throughput figures.
    """
    keys = methods.get(method).metric_keys(positions)
    train: dict[int, dict] = {}
    for r in records:
        if r["kind"] == "train":
            train[int(r["global_step"])] = r  # later attempts overwrite
    val: dict[int, dict] = {}
    for r in records:
        if r["kind"] == "val":
            val[int(r["epoch"])] = r
    first_step: dict[int, int] = {}
    for step, r in sorted(train.items()):
        first_step.setdefault(r["attempt"], step)
    # speculators' profile counts rank 0's batch only (speculators/train/trainer.py: the tokens
    # of its local batch over its step time); the ranks step in lockstep, each with its own
    # packed batch of about the same size, so the run's rate is about world size times that
    world_size = {
        r["attempt"]: int(r.get("world_size") or 1) for r in records if r["kind"] == "start"
    }

    def step_tokens(r: dict) -> float:
        """Tokens all ranks processed in a profiled step."""
        p = r.get("profile") or {}
        return (p.get("tokens_per_s") or 0) * p["step_ms"] / 1000 * world_size.get(r["attempt"], 1)

    epochs = sorted(set(int(r["epoch"]) for r in train.values()) | set(val))
    per_epoch = []
    for e in epochs:
        steps = [r for _, r in sorted(train.items()) if int(r["epoch"]) == e]
        tm = [r["train"] for r in steps]
        tokens, seconds = 0.0, 0.0
        for r in steps:
            p = r.get("profile") or {}
            if r["global_step"] - first_step.get(r["attempt"], 0) < warmup_steps:
                continue
            if p.get("step_ms") and p.get("tokens_per_s") is not None:
                seconds += p["step_ms"] / 1000
                tokens += step_tokens(r)
        entry: dict[str, Any] = {
            "epoch": e,
            "logged_steps": len(steps),
            "global_steps": [steps[0]["global_step"], steps[-1]["global_step"]] if steps else None,
            # each field: the mean over the epoch's logged steps (per position for a list)
            "train": {
                field: [_mean([m.get(k) for m in tm]) for k in key]
                if isinstance(key, list)
                else _mean([m.get(key) for m in tm])
                for field, key in keys.items()
            },
            "tokens_per_s": tokens / seconds if seconds else None,
        }
        if e in val:
            vm = val[e]["val"]
            entry["val"] = {
                field: [vm.get(f"{k}_epoch") for k in key]
                if isinstance(key, list)
                else vm.get(f"{key}_epoch")
                for field, key in keys.items()
            }
        per_epoch.append(entry)

    # throughput: trainer's own step profile + the loader probe
    tokens = seconds = 0.0
    fetch_ms, step_ms = [], []
    for step, r in sorted(train.items()):
        p = r.get("profile") or {}
        if step - first_step.get(r["attempt"], 0) < warmup_steps or not p.get("step_ms"):
            continue
        seconds += p["step_ms"] / 1000
        tokens += step_tokens(r)
        step_ms.append(p["step_ms"])
        fetch_ms.append(p.get("fetch_ms") or 0.0)
    # loader probe: per batch, how long next() blocked; the interval between two batches is
    # one whole step (wait included), so wait/interval is the share of time spent starved
    waits, intervals = [], []
    by_iter: dict[tuple, list] = {}
    for r in records:
        if r["kind"] == "loader":
            by_iter.setdefault((r["attempt"], r["iter"]), []).append(r)
    for rows in by_iter.values():
        rows = [r for r in rows if r["i"] >= warmup_steps]
        for a, b in itertools.pairwise(rows):
            waits.append(b["wait_s"])
            intervals.append(b["t"] - a["t"])
    ends = [r for r in records if r["kind"] == "end"]
    peaks = [r.get("peak_allocated_gib") for r in ends if r.get("peak_allocated_gib")]
    throughput = {
        "tokens_per_s": tokens / seconds if seconds else None,
        "step_ms_median": median(step_ms),
        "logged_steps": len(step_ms),
        "trainer_fetch_ms_median": median(fetch_ms),
        "loader_wait_ms_mean": 1000 * _mean(waits) if waits else None,
        "loader_wait_ms_max": 1000 * max(waits) if waits else None,
        "loader_step_interval_ms_median": 1000 * median(intervals) if intervals else None,
        "loader_wait_fraction": (sum(waits) / sum(intervals)) if intervals else None,
        "peak_gpu_allocated_gib": max(peaks) if peaks else None,
        "peak_gpu_reserved_gib": max((r.get("peak_reserved_gib") or 0 for r in ends), default=0)
        or None,
        "warmup_steps_excluded": warmup_steps,
        "note": "tokens/s of all ranks: the trainer's profile of logged steps (every log_freq, "
        "rank 0's batch) times the world size; loader wait = time next() on the DataLoader "
        "blocked, per batch",
    }
    starts = [r for r in records if r["kind"] == "start"]
    attempts = []
    for s in starts:
        a = s["attempt"]
        attempts.append(
            {
                "attempt": a,
                "bridges": s.get("bridges"),
                "world_size": s.get("world_size"),
                "device": s.get("device_name"),
                "first_global_step": first_step.get(a),
                "clean_exit": any(r["attempt"] == a and r.get("ok", True) for r in ends),
            }
        )
    return {"epochs": per_epoch, "throughput": throughput, "attempts": attempts}
