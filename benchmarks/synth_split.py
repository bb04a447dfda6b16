"""The synth stage as one job against N jobs (synth.jobs), each a fresh run of the workflow up
to the merged answers, in alternating rounds.

    .venv/bin/python benchmarks/synth_split.py --jobs 2 --rounds 3 --out split.json

Every round runs `snakemake --until synth_gather` in a fresh directory for each variant (the
order reversed every round), on the --configfile (default: the embedded default config), and
records the synth stage's time from Snakemake's own job benchmarks (the parts and the gather;
on one machine the parts of a CPU server run one after another, each holding every core) and
the merged output's sha256. It reports the time of each variant with its spread, the ratio per
round, and whether every run's merged output is the same bytes (at T = 0: the answers do not
depend on how many jobs asked for them). What else ran on the machine is recorded (load average
before and after every run).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from eagle3_lab import rounds as rounds_lib
from eagle3_lab.results import write_result
from eagle3_pipeline import config as cfglib
from eagle3_pipeline.runtime.provenance import package_versions as versions

REPO = Path(__file__).resolve().parents[1]


def snakemake_cmd(work: Path, configfile: str, jobs: int) -> list[str]:
    return [
        str(Path(sys.executable).parent / "snakemake"),
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(work),
        "--configfile",
        configfile,
        "--cores",
        "all",
        "--until",
        "synth_gather",
        "--config",
        f"synth={{jobs: {jobs}}}",
    ]


def one_run(base: Path, configfile: str, jobs: int, tag: str) -> dict:
    work = base / tag
    shutil.rmtree(work, ignore_errors=True)
    (work / "config").mkdir(parents=True)
    shutil.copy(REPO / "config" / "config.yaml", work / "config" / "config.yaml")
    load_before = os.getloadavg()
    t0 = time.monotonic()
    proc = subprocess.run(
        snakemake_cmd(work, configfile, jobs),
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO / "src")),
        capture_output=True,
        text=True,
    )
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"run {tag} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    run = work / cfglib.run_dir(cfglib.load_files([configfile]))
    bench = run / "benchmarks"

    def seconds(name: str) -> float:
        lines = (bench / f"{name}.tsv").read_text().splitlines()
        return float(lines[1].split("\t")[0])

    parts = [seconds(f"synth_part{k}") for k in range(jobs)]
    merged = (run / "synth" / "synth.jsonl.zst").read_bytes()
    return {
        "synth_s": sum(parts) + seconds("synth_gather"),
        "parts_s": parts,
        "gather_s": seconds("synth_gather"),
        "workflow_wall_s": wall,
        "merged_sha256": hashlib.sha256(merged).hexdigest(),
        "load_before": load_before,
        "load_after": os.getloadavg(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configfile", default=str(REPO / "config" / "config.yaml"))
    ap.add_argument("--jobs", type=int, default=2, help="synth.jobs of the split variant")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", default="/tmp/synth-split", help="scratch directory")
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args()
    if args.rounds < 3:
        ap.error("--rounds: at least 3 (a spread needs them)")
    base = Path(args.work)
    names = {"one": 1, "split": args.jobs}
    counter = {"n": 0}

    def variant(name: str):
        def run() -> dict:
            counter["n"] += 1
            return one_run(base, args.configfile, names[name], f"{name}-{counter['n']}")

        return run

    result = rounds_lib.alternate({k: variant(k) for k in names}, args.rounds)
    times = {k: rounds_lib.figure(result, k, "synth_s") for k in names}
    spread = {k: rounds_lib.spread(v) for k, v in times.items()}
    ratio = rounds_lib.spread(rounds_lib.paired_ratios(result, "split", "one", "synth_s"))
    hashes = {r[k]["merged_sha256"] for r in result["rounds"] for k in names}
    print(
        f"\nsynth stage s median (min-max): 1 job {spread['one']['median']:.1f} "
        f"({spread['one']['min']:.1f}-{spread['one']['max']:.1f}), {args.jobs} jobs "
        f"{spread['split']['median']:.1f} ({spread['split']['min']:.1f}-"
        f"{spread['split']['max']:.1f}); {args.jobs} jobs / 1 per round {ratio['median']:.2f} "
        f"({ratio['min']:.2f}-{ratio['max']:.2f}); merged outputs: {len(hashes)} distinct"
    )
    if args.out:
        write_result(
            args.out,
            {
                "protocol": "alternating rounds, order reversed every round; a fresh "
                "directory per run, up to synth_gather",
                "jobs": args.jobs,
                "synth_s": times,
                "spread": spread,
                "ratio_split_over_one": ratio,
                "merged_outputs_distinct": len(hashes),
                "rounds": result["rounds"],
                "cpus": os.cpu_count(),
                "args": vars(args),
                "versions": versions(),
            },
        )


if __name__ == "__main__":
    main()
