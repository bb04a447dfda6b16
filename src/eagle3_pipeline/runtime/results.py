"""The layout of what one stage writes for another (or for its own next run): one version for
every such file, :data:`RESULTS_FORMAT`, in its ``format`` field as
``eagle3-pipeline/<kind>@<version>``. Where a file is read its format is checked: a file of
another version (or of none: written before files had one) is refused, naming the rule to run
again, rather than read through code that knows older layouts.

Bump :data:`RESULTS_FORMAT` when a change alters the layout of one of these files; a run then
asks for its inputs to be made again. (What a reused answer, sample or measurement holds has a
version of its own, in the fingerprint that keys it: synth.answers.ANSWER_FORMAT,
extract.CAPTURE_FORMAT, bench.cache.CACHE_FORMAT.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS_FORMAT = 1

# Each kind of file, and the rule that writes it
HIDDEN_STATES = "hidden-states"  # hidden_states/manifest.json
EXTRACT_PART = "extract-part"  # hidden_states/parts/part_<k>.json
SYNTH_PART = "synth-part"  # synth/parts/part_<k>.json
TRAIN_METRICS = "train-metrics"  # drafter/<method>/metrics.json
ONLINE_MANIFEST = "online-manifest"  # its hidden_states record, online or hybrid
ONLINE_SPEC = "online-hidden-states"  # the training process's spec, online or hybrid
BENCH_BASELINE = "bench-baseline"  # bench/baseline.json
BENCH_METRICS = "bench-metrics"  # bench/<method>/metrics.json
WRITTEN_BY = {
    HIDDEN_STATES: "extract_gather",
    EXTRACT_PART: "extract",
    SYNTH_PART: "synth",
    TRAIN_METRICS: "train",
    ONLINE_MANIFEST: "train",
    ONLINE_SPEC: "train",
    BENCH_BASELINE: "bench_baseline",
    BENCH_METRICS: "bench",
}


class ResultsFormatError(RuntimeError):
    pass


def format_tag(kind: str) -> str:
    """What a file of ``kind`` says it is."""
    return f"eagle3-pipeline/{kind}@{RESULTS_FORMAT}"


def check_format(data: dict[str, Any], path: str | Path, kind: str) -> dict[str, Any]:
    """``data`` (read from ``path``), if it is a ``kind`` of this version; else
    ResultsFormatError naming the rule to run again."""
    found = data.get("format") if isinstance(data, dict) else None
    if found != format_tag(kind):
        raise ResultsFormatError(
            f"{path}: format {found!r}, but this version of the pipeline reads "
            f"{format_tag(kind)!r} only (written by an older version?). Run the stage that "
            f"writes it again: snakemake -R {WRITTEN_BY[kind]}"
        )
    return data


def read_result(path: str | Path, kind: str) -> dict[str, Any]:
    """The JSON file ``path``, checked to be a ``kind`` of this version (:func:`check_format`)."""
    return check_format(json.loads(Path(path).read_text()), path, kind)
