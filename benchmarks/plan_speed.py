#!/usr/bin/env python
"""Planning time must not grow with the number of samples or extraction shards.

    python benchmarks/plan_speed.py [--repeats 5] [--out plan_speed.json]

Times `snakemake -n` (a dry run in a fresh temporary directory: parse, validate the config,
build the DAG, print the plan) for 10 vs 10,000 training prompts and extract.jobs 1 vs 8,
against `snakemake --version` (the CLI's own start-up: interpreter, imports, plugin registry),
and the smallest dry run once more with its code parses not yet cached (a fresh
EAGLE3_CODE_CACHE each time: what the first plan after an edit of every module costs; the
others read a cache made before the first repeat). Each command runs --repeats times; the
table gives the median wall time, the median CPU time of the child (user + sys: steadier than
wall time on a shared machine) and both as a ratio to `snakemake --version`. Goal: every dry
run within 1.5x of `snakemake --version`.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from eagle3_lab.results import write_result
from eagle3_pipeline.runtime.provenance import package_versions

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def timed(cmd: list[str], env: dict) -> tuple[float, float]:
    """(wall seconds, child CPU seconds) of one run; fails loudly if the command fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", help="write the medians and ratios as JSON here")
    args = ap.parse_args()

    base = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    with tempfile.TemporaryDirectory(prefix="plan-speed-") as tmp:
        env = dict(os.environ, PYTHONPATH=str(REPO / "src"), EAGLE3_CODE_CACHE=f"{tmp}/code")
        cases: list[tuple[str, list[str]]] = [("snakemake --version", [SNAKEMAKE, "--version"])]
        for n in (10, 10_000):
            for jobs in (1, 8):
                cfg = yaml.safe_load(yaml.safe_dump(base))
                cfg["prompts"]["train"] = [{"source": "sharegpt", "n": n}]
                cfg["extract"]["jobs"] = jobs
                cfg_path = Path(tmp) / f"n{n}-jobs{jobs}.yaml"
                cfg_path.write_text(yaml.safe_dump(cfg))
                workdir = Path(tmp) / f"wd-n{n}-jobs{jobs}"
                cases.append(
                    (
                        f"snakemake -n  (prompts n={n}, extract.jobs={jobs})",
                        [
                            SNAKEMAKE,
                            "-n",
                            "--snakefile",
                            str(REPO / "Snakefile"),
                            "--directory",
                            str(workdir),
                            "--configfile",
                            str(cfg_path),
                        ],
                    )
                )

        smallest, largest = cases[1][0], cases[-1][0]
        cold_name = f"{smallest}, code parses not cached"
        timed(cases[1][1], env)  # the cache the other dry runs read
        results = {}
        for r in range(args.repeats):  # interleaved, so load changes hit every case alike
            for name, cmd in cases:
                results.setdefault(name, []).append(timed(cmd, env))
            cold = {**env, "EAGLE3_CODE_CACHE": f"{tmp}/cold-{r}"}
            results.setdefault(cold_name, []).append(timed(cases[1][1], cold))
        cases.append((cold_name, cases[1][1]))

    ref_wall = statistics.median(w for w, _ in results[cases[0][0]])
    ref_cpu = statistics.median(c for _, c in results[cases[0][0]])
    print(
        f"snakemake: {SNAKEMAKE}; {args.repeats} repeats each; load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n"
    )
    header = f"{'command':<48} {'wall med':>9} {'cpu med':>8} {'wall x':>7} {'cpu x':>6}"
    print(header)
    print("-" * len(header))
    worst = 0.0
    rows = []
    for name, _ in cases:
        wall = statistics.median(w for w, _ in results[name])
        cpu = statistics.median(c for _, c in results[name])
        print(f"{name:<48} {wall:8.2f}s {cpu:7.2f}s {wall / ref_wall:6.2f}x {cpu / ref_cpu:5.2f}x")
        rows.append({"command": name, "wall_s_median": wall, "cpu_s_median": cpu})
        if name not in (cases[0][0], cold_name):
            worst = max(worst, cpu / ref_cpu)
    small = statistics.median(c for _, c in results[smallest])
    large = statistics.median(c for _, c in results[largest])
    cold = statistics.median(c for _, c in results[cold_name])
    print(
        f"\nlargest (n=10000, jobs=8) / smallest (n=10, jobs=1) dry run, CPU: {large / small:.2f}x"
    )
    print(f"worst dry run / snakemake --version, CPU: {worst:.2f}x (goal <= 1.5x)")
    print(f"smallest dry run, code parses cached / not cached, CPU: {small / cold:.2f}x")
    if args.out:
        write_result(
            args.out,
            {
                "repeats": args.repeats,
                "cpus": os.cpu_count(),
                "load_average_after": os.getloadavg()[0],
                "rows": rows,
                "largest_over_smallest_cpu": large / small,
                "worst_over_version_cpu": worst,
                "cached_over_uncached_cpu": small / cold,
                "versions": package_versions(),
            },
        )


if __name__ == "__main__":
    main()
