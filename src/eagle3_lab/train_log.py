"""Where a train job's seconds went, read from its log: the seconds of each training and
validation epoch (speculators' "Training epoch N/M started ... completed" lines) and how long
its extraction servers took to be ready (online and hybrid jobs). A train job's wall time also
holds the interpreter's start, the target's embeddings loaded and the drafter exported; these
split the part that grows with the data from the part that does not.

The log's stamps are times of day (HH:MM:SS): a phase that ends before it starts crossed
midnight.
"""

from __future__ import annotations

import re

_LINE = re.compile(r"^(\d\d):(\d\d):(\d\d) INFO \S+: (.*)$")
_PHASE = re.compile(r"^(Training|Validation) epoch (\d+)/\d+ (started|completed)$")
_READY = re.compile(r"^vLLM server ready after (\d+(?:\.\d+)?) s\b")
_DAY = 24 * 3600


def phase_seconds(text: str) -> dict[str, list[float]]:
    """``{"epoch_s": [...], "val_s": [...], "server_ready_s": [...]}`` in the log's order; an
    epoch started but never completed (a killed job) is left out."""
    started: dict[tuple[str, str], int] = {}
    out: dict[str, list[float]] = {"epoch_s": [], "val_s": [], "server_ready_s": []}
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        at = int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3])
        message = m[4]
        if ready := _READY.match(message):
            out["server_ready_s"].append(float(ready[1]))
        elif phase := _PHASE.match(message):
            key = (phase[1], phase[2])
            if phase[3] == "started":
                started[key] = at
            elif key in started:
                seconds = (at - started.pop(key)) % _DAY
                out["epoch_s" if phase[1] == "Training" else "val_s"].append(float(seconds))
    return out
