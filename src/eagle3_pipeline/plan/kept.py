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

from pathlib import Path

from ..synth import answers
from ..synth.errors import SynthError
from ..target import load_info


def synth_fingerprint(run: Path, cfg: dict) -> str | None:
    """The fingerprint of the answers ``cfg`` would reuse (target and generation settings), or
    None before the target exists (no answer can either)."""
    target_json = Path(run) / "target" / "target.json"
    if not target_json.exists():
        return None
    return answers.fingerprint(load_info(target_json), cfg["synth"], cfg["vllm"])


def _lines(path: Path) -> int:
    """Complete lines (one journal entry each; a torn last line is not counted)."""
    with path.open("rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


def synth_kept(run: Path, fingerprint: str | None) -> list[str]:
    """Per synth part without its manifest: the entries its journals hold under
    ``fingerprint`` (journals of other settings are not reused, so they are not counted)."""
    if fingerprint is None:
        return []
    kept: dict[tuple[int, int], int] = {}
    try:
        journals = answers.AnswerStore(run / "synth" / ".partial", fingerprint).journals()
    except SynthError:  # answers of an older layout, not kept: the synth job said so
        return []
    for journal in journals:
        part, parts = answers.journal_part(journal)
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


def kept_work(run: Path, synth_fp: str | None) -> list[str]:
    """One line per stage part with partial work in ``run`` (a run's results directory);
    ``synth_fp``: the fingerprint of the answers synth would reuse (:func:`synth_fingerprint`)."""
    run = Path(run)
    return [*synth_kept(run, synth_fp), *extract_kept(run), *train_kept(run)]


def message(run: Path, cfg: dict) -> str | None:
    """What a run of ``cfg`` that failed says about its partial work, or None when it kept none."""
    lines = kept_work(run, synth_fingerprint(run, cfg))
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
