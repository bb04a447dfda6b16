"""The CI-sized DAG through a real Slurm cluster (tests/local_slurm.py) with the project's
profile and snakemake-executor-plugin-slurm, on copies of the session's finished local run
(tests/dag_runs.py): every rule a Slurm job with the CPUs, memory and wall time the profile
asks, training as one allocation over two nodes whose trainer ran as two processes, a synth job
stopped at its Slurm time limit and one cancelled with scancel costing no answer, and nothing
left in the queue."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from dag_runs import CI_CONFIG, CI_SLURM_CONFIG, REPO, ci_snakemake
from smkcli import sbatch_flag, slurm_calls

# The shared runs are made in the background (tests/dag_runs.py); the first test here may wait
# for them.
pytestmark = pytest.mark.timeout(3600)

PROFILE = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
CI = yaml.safe_load(CI_CONFIG.read_text())
ON_SLURM = yaml.safe_load(CI_SLURM_CONFIG.read_text())
CONFIGS = (CI_CONFIG, CI_SLURM_CONFIG)


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


def megabytes(req_mem: str) -> float:
    """sacct's ReqMem (a job's whole request since Slurm 21.08: '62.50G') in MB (MiB)."""
    value, unit = float(req_mem[:-1]), req_mem[-1]
    return value * {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2}[unit]


def test_every_rule_ran_as_a_slurm_job_with_the_profiles_resources(slurm_run, slurm):
    jobs = slurm_jobs(slurm, slurm_run)
    done = [j for j in jobs if j["State"] == "COMPLETED"]
    assert len(done) == len(jobs), [(j["Comment"], j["State"]) for j in jobs]
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
        expected = ON_SLURM["train"]["nodes"] if rule_of(j) == "train" else 1
        assert int(j["NNodes"]) == expected, j
    # CPUs and memory: what Slurm granted each job is what the profile asks through the plugin
    # (its sbatch line: --cpus-per-task per task, --mem-per-cpu per CPU)
    args = ["--forceall", "--configfile", *map(str, CONFIGS)]
    asked = {f"rule_{c['rule']}": c["sbatch"] for c in slurm_calls(*args, workdir=slurm_run)}
    for j in done:
        sbatch = asked[re.sub(r"_wildcards_.*", "", j["Comment"])]
        cpus = sbatch_flag(sbatch, r"--cpus-per-task=(\d+)") * (
            sbatch_flag(sbatch, r"--ntasks=(\d+)") or 1
        )
        assert int(j["AllocCPUS"]) == cpus, (j, sbatch)
        mem = cpus * sbatch_flag(sbatch, r"--mem-per-cpu (\d+)")
        assert megabytes(j["ReqMem"]) == pytest.approx(mem, rel=1e-3), (j, sbatch)
    # the rules the profile sizes say so; the others take their threads (every core asked)
    for rule, res in PROFILE["set-resources"].items():
        if "cpus_per_task" in res and f"rule_{rule}" in asked:
            assert (
                sbatch_flag(asked[f"rule_{rule}"], r"--cpus-per-task=(\d+)") == res["cpus_per_task"]
            )


def test_training_spans_two_nodes_as_two_processes(slurm_run, slurm):
    """The train job's allocation holds two nodes, and the trainer ran as one process on each
    (torchrun's world size, recorded by the training process itself)."""
    run = slurm_run / "results" / "ci"
    train = json.loads((run / "drafter" / "eagle3" / "metrics.json").read_text())
    assert [a["world_size"] for a in train["attempts"]] == [ON_SLURM["train"]["nodes"]] == [2]
    assert len(train["epochs"]) == ON_SLURM["train"]["epochs"]
    assert train["this_run"]["trained_steps"] > 0 and train["consistency"]["ok"]
    (job,) = [j for j in slurm_jobs(slurm, slurm_run) if rule_of(j) == "train"]
    assert int(job["NNodes"]) == 2
    log = (run / "logs" / "train_eagle3.log").read_text(errors="replace")
    assert "srun" in log and "--nnodes=2" in log


def test_the_same_command_again_finishes_at_once_and_leaves_no_job(slurm_run, slurm):
    proc = ci_snakemake(slurm_run, slurm=slurm, configfiles=CONFIGS, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Nothing to be done" in proc.stdout + proc.stderr
    # none of this run's (other shared runs may have jobs on the cluster meanwhile: %Z is a
    # job's working directory)
    queued = slurm.run("squeue", "--noheader", "--format=%i %Z").stdout.splitlines()
    assert [q for q in queued if q.split(" ", 1)[-1].strip() == str(slurm_run)] == [], queued


# ---- synth stopped by its time limit, then cancelled (dag_runs.SharedRuns._synth_interrupted) --


def test_a_synth_job_past_its_time_limit_says_what_it_kept(synth_interrupted, slurm):
    first = synth_interrupted["first"]
    assert first["rc"] != 0, first["out"][-3000:]
    work = synth_interrupted["work"]
    synth = [
        j
        for j in slurm_jobs(slurm, work)
        if rule_of(j) == "synth" and j["JobIDRaw"] in synth_interrupted["jobs_first"]
    ]
    assert [j["State"] for j in synth] == ["TIMEOUT"], synth
    assert "TIMEOUT" in first["out"]  # the executor plugin's error names Slurm's state
    kept = len(synth_interrupted["kept_at_timeout"])
    assert kept > 0, "the job was stopped before it answered anything: the limit proves nothing"
    assert f"synth part 0 of 1: {kept:,} answers journaled" in first["out"], first["out"][-3000:]
    assert "the same command resumes from it" in first["out"]


def test_after_a_timeout_a_cancelled_and_resubmitted_job_asks_only_for_the_rest(
    synth_interrupted, slurm
):
    """The run again after the timeout (eight requests at a time: an operational key, the same
    answers): its synth job is cancelled with scancel once it has journaled answers of its
    own, the profile resubmits it, and the resubmitted job answers only what neither stopped
    job had journaled; no answer is asked twice."""
    second, work = synth_interrupted["second"], synth_interrupted["work"]
    assert second["rc"] == 0, second["out"][-3000:]
    cancelled = synth_interrupted["cancelled"]
    states = {j["JobIDRaw"]: j["State"] for j in slurm_jobs(slurm, work)}
    assert states[cancelled["job_id"]].startswith("CANCELLED"), states
    run = work / "results" / "ci"
    ids = [a["id"] for a in synth_interrupted["answers"]]
    assert len(ids) == len(set(ids)), "an answer was asked for twice"
    manifest = json.loads((run / "synth" / "parts" / "part_0.json").read_text())
    # the resubmitted job found what the cancelled one had journaled, and asked for the rest
    assert manifest["this_run"]["reused"] >= cancelled["journaled_before_cancel"], manifest
    assert cancelled["journaled_before_cancel"] > len(synth_interrupted["kept_at_timeout"])
    assert manifest["this_run"]["reused"] + manifest["this_run"]["answered"] == manifest["prompts"]
    stats = json.loads((run / "synth" / "stats.json").read_text())
    assert stats["samples_ok"] == len(ids) == manifest["prompts"]
    assert slurm.run("squeue", "--noheader").stdout.strip() == ""
