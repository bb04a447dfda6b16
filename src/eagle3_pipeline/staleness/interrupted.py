"""Outputs a failed or cancelled job took with it, while what was made from them stays.

Snakemake deletes a job's outputs before it runs and when it fails; a later run then finds the
output missing, but rebuilds a missing file only where something downstream needs updating. If
the downstream outputs exist (the bench results and report of the previous drafter, say), the
next ``snakemake`` says "Nothing to be done" and the report shows results of an earlier run as
if they were current: the same command after a failed train job rebuilds nothing.

Snakemake's metadata tells the two cases of a missing file apart. It records every job it
starts (its start time, the inputs it read) under ``.snakemake/metadata``, also for jobs that
then fail. A missing output whose job started *after* an existing output was made from it was
taken by a job that did not finish: that downstream output is stale, and the job must run
again (with everything after it). A missing output whose job ran *before* its consumers was
removed by hand (hidden states deleted to free the disk, say): Snakemake's choice stands and
nothing is forced.

Only Snakemake's file-based metadata store (the default) is read.
"""

from __future__ import annotations

import json
import os
import sys
from base64 import urlsafe_b64decode
from dataclasses import dataclass
from pathlib import Path

METADATA_DIR = Path(".snakemake") / "metadata"


@dataclass(frozen=True)
class Interrupted:
    """``missing`` (an output of ``rule``) was removed by a job that started after ``stale``
    was made from it."""

    missing: str
    rule: str
    stale: str


def metadata_records(workdir: str | os.PathLike = ".") -> dict[str, dict]:
    """Snakemake's metadata record per output path (relative to the working directory, as
    Snakemake writes it). The record's file name is the path, urlsafe-base64 encoded and split
    into chunks of a file name's length (every chunk but the last prefixed with ``@``)."""
    root = Path(workdir) / METADATA_DIR
    records: dict[str, dict] = {}
    if not root.is_dir():
        return records
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            chunks = path.relative_to(root).parts
            encoded = "".join(c.removeprefix("@") for c in chunks)
            try:
                output = urlsafe_b64decode(encoded).decode()
                records[output] = json.loads(path.read_text())
            except (ValueError, OSError):  # not a record of this format: leave it to Snakemake
                continue
    return records


def _under(path: str, output: str) -> bool:
    return path == output or path.startswith(output.rstrip("/") + "/")


def interrupted_outputs(workdir: str | os.PathLike = ".") -> list[Interrupted]:
    """Every missing output whose job started after an existing output was made from it."""
    workdir = Path(workdir)
    records = metadata_records(workdir)
    exists = {path: (workdir / path).exists() for path in records}
    found = []
    for missing, record in sorted(records.items()):
        started = record.get("starttime")
        if exists[missing] or started is None or record.get("incomplete"):
            continue  # present, unknown, or Snakemake's own --rerun-incomplete case
        for downstream, consumer in sorted(records.items()):
            made = consumer.get("starttime")
            if (
                exists[downstream]
                and made is not None
                and made < started
                and any(_under(str(i), missing) for i in consumer.get("input") or [])
            ):
                found.append(Interrupted(missing, record.get("rule", "?"), downstream))
                break
    return found


def message(found: list[Interrupted]) -> str:
    rules = sorted({f.rule for f in found})
    lines = [
        f"  {f.missing} (rule {f.rule}) is missing, but {f.stale} was made from it before "
        "its job started again and did not finish"
        for f in found
    ]
    return (
        "NOTE: a job that failed or was cancelled removed outputs that other results were made "
        f"from; the default target asks for them again, so rule(s) {', '.join(rules)} run "
        "again and everything after them (with targets of your own, add -R "
        f"{' '.join(rules)}):\n" + "\n".join(lines)
    )


def interrupted_targets(workdir: str | os.PathLike = ".", stream=None) -> list[str]:
    """Called while the Snakefile is read, for the default target's inputs: the interrupted
    outputs, with a note that says why they are made again. As targets, Snakemake rebuilds
    them, and everything made from them is then older than its input and runs again too."""
    found = interrupted_outputs(workdir)
    if found:
        print(message(found), file=stream or sys.stderr)
    return sorted({f.missing for f in found})
