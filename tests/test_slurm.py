"""The CI-sized DAG through a real Slurm cluster (tests/local_slurm.py, started by the
session's `slurm` fixture) with the project's profile and snakemake-executor-plugin-slurm:
every rule a Slurm job with the resources and wall time the profile asks, training as one
allocation over two nodes, a synth job cancelled with scancel costing no answer, and nothing
left in the queue."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from conftest import REPO, ci_snakemake, journaled_answers

pytestmark = [pytest.mark.server, pytest.mark.e2e]

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
