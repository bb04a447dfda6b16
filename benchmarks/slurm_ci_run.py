"""The CI-sized DAG (tests/configs/ci.yaml) through a real Slurm cluster on this machine, and
what Slurm accounted for each of its jobs.

    PYTHONPATH=src:tests .venv/bin/python benchmarks/slurm_ci_run.py --out slurm_ci_run.json

Starts the tests' local cluster (tests/local_slurm.py: Debian's Slurm daemons, two nodes of
eight GPU device files, installed with apt-get when missing; root), runs the workflow with
`--profile profiles/slurm` in a fresh directory, training over the two nodes (`train.nodes: 2`;
the tests' local run trains on one), and records per Slurm job the
rule, state, nodes, elapsed time, time limit and allocation (sacct), the workflow's wall time,
and what else ran on the machine (load average before and after).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from local_slurm import ci_cluster

from eagle3_lab.results import write_result
from eagle3_pipeline.runtime.provenance import package_versions as versions

from dag_runs import REPO, ci_snakemake


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the accounting as JSON here")
    ap.add_argument(
        "--work",
        type=Path,
        help="run in this (new) directory and keep it, e.g. for benchmarks/gate_floor.py --work "
        "(default: a temporary one)",
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp) / "run"
        shutil.copytree(REPO / "config", work / "config")
        shutil.copytree(REPO / "tests" / "data", work / "data")
        with ci_cluster() as slurm:
            load_before = os.getloadavg()
            t0 = time.monotonic()
            proc = ci_snakemake(work, "--config", "train={nodes: 2}", slurm=slurm)
            wall = time.monotonic() - t0
            if proc.returncode != 0:
                raise SystemExit(proc.stdout[-3000:] + proc.stderr[-3000:])
            jobs = slurm.accounted_jobs(work)
            timings = slurm.timings
    rows = [
        {
            "rule": re.match(r"rule_(\w+?)(?:_wildcards_|$)", j["Comment"]).group(1),
            "wildcards": j["Comment"].partition("_wildcards_")[2] or None,
            "job_id": j["JobIDRaw"],
            "state": j["State"],
            "nodes": int(j["NNodes"]),
            "elapsed": j["Elapsed"],
            "time_limit": j["Timelimit"],
            "alloc_tres": j["AllocTRES"],
        }
        for j in jobs
        if j["Comment"].startswith("rule_")
    ]
    for r in rows:
        print(
            f"{r['job_id']:>4} {r['rule']:<16} {r['wildcards'] or '':<14} {r['state']:<10} "
            f"nodes {r['nodes']}  {r['elapsed']}  (limit {r['time_limit']})"
        )
    print(f"workflow wall time {wall:.0f} s, {len(rows)} Slurm jobs")
    if args.out:
        write_result(
            args.out,
            {
                "workflow_wall_s": wall,
                "jobs": rows,
                "cluster_start_s": timings,
                "load_before": load_before,
                "load_after": os.getloadavg(),
                "cpus": os.cpu_count(),
                "versions": versions(),
            },
        )


if __name__ == "__main__":
    main()
