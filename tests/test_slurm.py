"""The CI-sized DAG through a real Slurm cluster (tests/local_slurm.py, started by the
session's `slurm` fixture) with the project's profile and snakemake-executor-plugin-slurm:
every rule a Slurm job with the resources and wall time the profile asks, training as one
allocation over two nodes, a synth job cancelled with scancel costing no answer, a synth job
stopped at its Slurm time limit costing none either, and nothing left in the queue."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import CI_CONFIG, REPO, ci_snakemake, journaled_answers

pytestmark = [pytest.mark.server, pytest.mark.e2e, pytest.mark.timeout(3600)]

PROFILE = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
CI = yaml.safe_load((REPO / "tests" / "configs" / "ci.yaml").read_text())


def slurm_jobs(slurm, work: Path) -> list[dict]:
    """The Slurm jobs the plugin submitted from ``work`` (its comment names the rule)."""
    return [j for j in slurm.accounted_jobs(work) if j["Comment"].startswith("rule_")]


def rule_of(job: dict) -> str:
    return re.match(r"rule_(\w+?)(?:_wildcards_|$)", job["Comment"]).group(1)


def minutes(limit: str) -> int:
    """sacct's Timelimit ([D-]HH:MM:SS) in minutes."""
    days, _, clock = limit.rpartition("-")
    h, m, _s = (int(x) for x in clock.split(":"))
    return (int(days or 0) * 24 + h) * 60 + m


def test_every_rule_ran_as_a_slurm_job_with_the_profiles_resources(ci_run, slurm):
    jobs = slurm_jobs(slurm, ci_run)
    done = [j for j in jobs if j["State"] == "COMPLETED"]
    rules = {rule_of(j) for j in done}
    assert rules == {
        "target",
        "prompts_train",
        "prompts_bench",
        "synth",
        "synth_gather",
        "prepare",
        "vocab",
        "extract",
        "extract_gather",
        "train",
        "bench",
        "report",
    }, rules
    runtime = {
        rule: int(res["runtime"][:-1]) * {"m": 1, "h": 60}[res["runtime"][-1]]
        for rule, res in PROFILE["set-resources"].items()
    }
    for j in done:
        assert minutes(j["Timelimit"]) == runtime[rule_of(j)], j
    # one job per synth and extraction part
    assert sum(rule_of(j) == "synth" for j in done) == CI["synth"]["jobs"]
    assert sum(rule_of(j) == "extract" for j in done) == CI["extract"]["jobs"]
    # training: one allocation over train.nodes nodes; every other job on one
    for j in done:
        expected = CI["train"]["nodes"] if rule_of(j) == "train" else 1
        assert int(j["NNodes"]) == expected, j


def test_a_cancelled_synth_job_lost_no_answer_and_none_was_asked_twice(ci_run, slurm):
    """scancel of a running synth job (conftest.ci_run): the profile resubmitted it, and the
    resubmitted job answered only what the cancelled one had not journaled."""
    cancelled = json.loads((ci_run / "cancelled_synth.json").read_text())
    states = {j["JobIDRaw"]: j["State"] for j in slurm_jobs(slurm, ci_run)}
    assert states[cancelled["job_id"]].startswith("CANCELLED"), states
    answers = journaled_answers(ci_run / "results" / "ci")
    ids = [a["id"] for a in answers]
    assert len(ids) == len(set(ids)), "an answer was asked for twice"
    stats = json.loads((ci_run / "results" / "ci" / "synth" / "stats.json").read_text())
    assert stats["samples_ok"] == stats["prompts"] == len(ids)
    manifest = json.loads(
        (
            ci_run / "results" / "ci" / "synth" / "parts" / f"part_{cancelled['part']}.json"
        ).read_text()
    )
    # the resubmitted job found what the cancelled one had journaled, and asked for the rest
    assert manifest["this_run"]["reused"] >= cancelled["journaled_before_cancel"], manifest
    assert manifest["this_run"]["reused"] + manifest["this_run"]["answered"] == manifest["prompts"]


def test_the_same_command_again_finishes_at_once_and_leaves_no_job(ci_run, slurm):
    proc = ci_snakemake(ci_run, slurm=slurm, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Nothing to be done" in proc.stdout + proc.stderr
    assert slurm.run("squeue", "--noheader").stdout.strip() == ""


# Synth asked again under other generation settings (a journal of its own), one answer at a time
# and longer answers: about three minutes of work on the CI machine's CPU, which a one-minute
# time limit (Slurm stops a job 60-95 s after its start here: KillWait 5 s) cuts short.
SLOW_SYNTH = {"synth": {"jobs": 1, "concurrency": 1, "max_tokens": 256}}


@pytest.fixture(scope="module")
def timed_out(ci_run, slurm, tmp_path_factory) -> dict:
    """A copy of the finished CI run whose synth job Slurm stops at a one-minute time limit
    (no retry: --retries 0), then the same command with the profile's runtime."""
    work = tmp_path_factory.mktemp("timeout") / "work"
    shutil.copytree(ci_run, work, symlinks=True, ignore=shutil.ignore_patterns("model"))
    slow = work / "slow_synth.yaml"
    slow.write_text(yaml.safe_dump(SLOW_SYNTH))
    journals = work / "results" / "ci" / "synth" / ".partial"
    before = set(journals.rglob("journal*.jsonl"))
    args = ("--until", "synth_gather")
    cfgs = (CI_CONFIG, slow)
    first = ci_snakemake(
        work, *args, "--set-resources", "synth:runtime=1", "--retries", "0",
        slurm=slurm, configfiles=cfgs, timeout=900,
    )  # fmt: skip
    new = sorted(set(journals.rglob("journal*.jsonl")) - before)
    kept = [a for p in new for a in journaled_answers(work / "results" / "ci", p.name)]
    jobs_first = slurm_jobs(slurm, work)
    second = ci_snakemake(work, *args, slurm=slurm, configfiles=cfgs, timeout=1200)
    return {
        "work": work,
        "first": first,
        "second": second,
        "new_journals": new,
        "kept_at_timeout": kept,
        "jobs_first": jobs_first,
    }


def test_a_synth_job_past_its_time_limit_says_what_it_kept(timed_out):
    first = timed_out["first"]
    out = first.stdout + first.stderr
    assert first.returncode != 0, out[-3000:]
    synth = [j for j in timed_out["jobs_first"] if rule_of(j) == "synth"]
    assert [j["State"] for j in synth] == ["TIMEOUT"], synth
    assert "TIMEOUT" in out  # the executor plugin's error names Slurm's state
    kept = len(timed_out["kept_at_timeout"])
    assert kept > 0, "the job was stopped before it answered anything: the limit proves nothing"
    assert f"synth part 0 of 1: {kept:,} answers journaled" in out, out[-3000:]
    assert "the same command resumes from it" in out


def test_the_same_command_after_a_timeout_asks_only_for_the_rest(timed_out, slurm):
    second, work = timed_out["second"], timed_out["work"]
    assert second.returncode == 0, (second.stdout + second.stderr)[-3000:]
    (journal,) = timed_out["new_journals"]
    answers = journaled_answers(work / "results" / "ci", journal.name)
    ids = [a["id"] for a in answers]
    assert len(ids) == len(set(ids)), "an answer was asked for twice"
    manifest = json.loads((work / "results" / "ci" / "synth" / "parts" / "part_0.json").read_text())
    assert manifest["this_run"]["reused"] >= len(timed_out["kept_at_timeout"]), manifest
    assert manifest["this_run"]["reused"] + manifest["this_run"]["answered"] == manifest["prompts"]
    stats = json.loads((work / "results" / "ci" / "synth" / "stats.json").read_text())
    assert stats["samples_ok"] == len(ids)
    assert slurm.run("squeue", "--noheader").stdout.strip() == ""
