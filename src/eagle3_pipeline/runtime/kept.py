"""What a failed run kept: the partial work of the long stages, said when Snakemake gives up.

A job killed, cancelled or stopped at a cluster's time limit (Slurm's TIMEOUT) fails, and
Snakemake's error names the job, not what survives it. Each long stage keeps its work as it
goes (synth: answers journaled per prompt; extract: one file of hidden states per sample;
train: checkpoints, mid-epoch ones too) and the next run resumes from it. The workflow's
``onerror`` prints this summary, so that the user knows that the same command loses nothing.
Only stages whose output is not complete are listed: a part without its manifest, training
without its drafter.
"""

from __future__ import annotations

import re
from pathlib import Path

SYNTH_JOURNAL = re.compile(r"journal\.part-(\d+)-of-(\d+)\.jsonl$")


def _lines(path: Path) -> int:
    """Complete lines (one journal entry each; a torn last line is not counted)."""
    with path.open("rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


def synth_kept(run: Path) -> list[str]:
    """Per synth part without its manifest: the answers its journals hold."""
    kept: dict[tuple[int, int], int] = {}
    for journal in sorted((run / "synth" / ".partial").glob("*/journal.part-*-of-*.jsonl")):
        part, parts = (int(x) for x in SYNTH_JOURNAL.search(journal.name).groups())
        if (run / "synth" / "parts" / f"part_{part}.json").exists():
            continue
        kept[(part, parts)] = kept.get((part, parts), 0) + _lines(journal)
    return [
        f"synth part {part} of {parts}: {n:,} answers journaled"
        for (part, parts), n in sorted(kept.items())
        if n
    ]


def extract_kept(run: Path) -> list[str]:
    """Hidden states written by extraction parts that did not finish."""
    hs = run / "hidden_states"
    if (hs / "manifest.json").exists() or not (hs / "shards").is_dir():
        return []
    n = sum(1 for _ in (hs / "shards").glob("shard_*/hs_*.safetensors"))
    return [f"extract: hidden states of {n:,} samples written"] if n else []


def train_kept(run: Path) -> list[str]:
    """Per method whose drafter is not exported: its checkpoints."""
    lines = []
    for work in sorted((run / "train_work").glob("*")):
        done = (run / "drafter" / work.name / "metrics.json").exists()
        checkpoints = sorted(p.name for p in (work / "checkpoints").glob("*") if p.is_dir())
        if checkpoints and not done:
            lines.append(f"train {work.name}: checkpoints {', '.join(checkpoints)}")
    return lines


def kept_work(run: Path) -> list[str]:
    """One line per stage part with partial work in ``run`` (a run's results directory)."""
    run = Path(run)
    return [*synth_kept(run), *extract_kept(run), *train_kept(run)]


def message(run: Path) -> str | None:
    """What a failed run says about its partial work, or None when it kept none."""
    lines = kept_work(run)
    if not lines:
        return None
    return "\n".join(
        [
            f"Partial work kept in {run}: the same command resumes from it and redoes none "
            "of it (a job killed, cancelled or stopped at a cluster's time limit alike):",
            *(f"  {line}" for line in lines),
            "A job that keeps reaching its time limit needs a longer runtime: under Slurm, "
            "raise it for that rule under set-resources in the profile "
            "(profiles/slurm/config.yaml).",
        ]
    )
