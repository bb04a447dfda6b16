"""A failed job's removed outputs are rebuilt though what was made from them exists
(eagle3_pipeline.staleness.interrupted), on a three-rule workflow run by real Snakemake: the
same metadata records as the pipeline's, without its stages."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3_pipeline.staleness.interrupted import interrupted_outputs, metadata_records

# each test runs real Snakemake several times (~3 s of CPU each): the full tier
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SNAKEFILE = """
from eagle3_pipeline.staleness.interrupted import interrupted_targets

rule all:
    input: "c.txt", interrupted_targets()
rule a:
    output: "a.txt"
    params: value=config.get("value", 1)
    shell: "test {params.value} != fail && echo {params.value} > {output}"
rule b:
    input: "a.txt"
    output: "b.txt"
    shell: "cat {input} > {output}"
rule c:
    input: "b.txt"
    output: "c.txt"
    shell: "cat {input} > {output}"
"""


def snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(sys.executable).parent / "snakemake"), "--cores", "1", *args],
        cwd=workdir,
        env=dict(os.environ, PYTHONPATH=str(REPO / "src")),
        capture_output=True,
        text=True,
    )


def made(tmp_path: Path) -> Path:
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    assert snakemake(tmp_path).returncode == 0
    return tmp_path


def test_a_failed_job_is_run_again_with_everything_after_it(tmp_path):
    work = made(tmp_path)
    failed = snakemake(work, "--config", "value=fail")  # a's job starts, removes a.txt, fails
    assert failed.returncode != 0 and not (work / "a.txt").exists()
    assert [(i.missing, i.rule, i.stale) for i in interrupted_outputs(work)] == [
        ("a.txt", "a", "b.txt")
    ]
    # Snakemake alone would find b.txt and c.txt current and do nothing; here a runs again
    again = snakemake(work, "--config", "value=2")
    assert again.returncode == 0, again.stderr
    assert "rule(s) a run again" in again.stderr
    assert (work / "c.txt").read_text() == "2\n"  # b and c were made again from the new a
    assert interrupted_outputs(work) == []
    assert "Nothing to be done" in snakemake(work, "--config", "value=2").stderr


def test_the_same_command_after_a_failure_fails_again_instead_of_doing_nothing(tmp_path):
    work = made(tmp_path)
    assert snakemake(work, "--config", "value=fail").returncode != 0
    again = snakemake(work, "--config", "value=fail")
    assert again.returncode != 0 and "Nothing to be done" not in again.stderr


def test_an_output_removed_by_hand_is_left_to_snakemake(tmp_path):
    """Deleting an intermediate output (hidden states to free the disk) forces nothing: its
    job ran before what was made from it."""
    work = made(tmp_path)
    (work / "a.txt").unlink()
    assert interrupted_outputs(work) == []
    assert "Nothing to be done" in snakemake(work).stderr


def test_with_targets_of_ones_own_the_note_names_the_rules_to_force(tmp_path):
    work = made(tmp_path)
    assert snakemake(work, "--config", "value=fail").returncode != 0
    dry = snakemake(work, "-n", "b.txt", "--config", "value=fail")  # the failed settings
    assert "with targets of your own, add -R a" in dry.stderr
    assert "Nothing to be done" in dry.stdout + dry.stderr  # b.txt was asked for; it is there


def test_records_are_read_back_by_output_path(tmp_path):
    work = made(tmp_path)
    records = metadata_records(work)
    assert set(records) == {"a.txt", "b.txt", "c.txt"}
    assert records["b.txt"]["input"] == ["a.txt"] and records["b.txt"]["rule"] == "b"
