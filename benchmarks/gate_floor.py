"""The regression gate's floors from training seeds: the workflow run once per seed
(train.seed) on one config, each drafter measured by the bench stage, and floors on one pinned
prompt set set below the worst seed with a margin (bench.gate; docs/architecture.md, "The
regression gate").

    PYTHONPATH=src:tests .venv/bin/python benchmarks/gate_floor.py --set memorized \\
        --seeds 0 1 2 --out benchmarks/results/gate/ci_memorized_floor.json

The CI-sized config (tests/configs/ci.yaml) by default, in a fresh directory with tests/data
as its data/, with the local executor as the tests run it; ``--slurm`` runs it through the
tests' local Slurm cluster (tests/local_slurm.py; root) instead. Your own target:
``--configfile your.yaml --data your/data`` runs it on this machine. The
data stages run once; each seed re-runs training and bench. Any gate of the config is switched
off while measuring (floors: []), so that no seed fails the run. Prints each seed's figures
and the floors as YAML for bench.gate; writes every figure with ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shutil
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from eagle3_lab.results import write_result
from eagle3_pipeline.runtime.files import read_json

from dag_runs import CI_CONFIG, REPO, ci_snakemake


def floors_from(seeds_rows: Iterable[list[dict]], prompt_set: str, margin: float) -> list[dict]:
    """Floors for ``prompt_set``, one per (k, temperature) it was measured at: below the worst
    seed by ``margin`` (a share of what the worst seed gained over a drafter whose every draft
    is rejected: τ 1, acceptance 0), rounded down to two decimals. ``seeds_rows``: each seed's
    result rows (bench metrics' ``runs``)."""
    worst: dict[tuple, dict] = {}
    for rows in seeds_rows:
        for r in rows:
            if r["prompt_set"] != prompt_set:
                continue
            w = worst.setdefault(
                (r["k"], r["temperature"]),
                {"tau": r["acceptance_length"], "per_position": list(r["per_position"])},
            )
            w["tau"] = min(w["tau"], r["acceptance_length"])
            pairs = zip(w["per_position"], r["per_position"], strict=True)
            w["per_position"] = [min(a, b) for a, b in pairs]
    if not worst:
        raise SystemExit(f"no measurement of prompt set {prompt_set!r}")

    def down(x: float) -> float:
        return math.floor(x * 100) / 100

    return [
        {
            "prompt_set": prompt_set,
            "k": k,
            "temperature": t,
            "acceptance_length": max(1.0, down(1 + (w["tau"] - 1) * (1 - margin))),
            "per_position": [down(a * (1 - margin)) for a in w["per_position"]],
        }
        for (k, t), w in worst.items()
    ]


def seed_figures(run: Path, drafter: str) -> dict:
    """What one seed's run measured: its drafter's result rows (acceptance only) and verdict,
    and what training and bench cost (Snakemake's benchmark files)."""
    metrics = read_json(run / "bench" / drafter / "metrics.json")
    train = read_json(run / "drafter" / drafter / "metrics.json")

    def seconds(rule: str) -> float:
        lines = (run / "benchmarks" / f"{rule}_{drafter}.tsv").read_text().splitlines()
        return float(lines[1].split("\t")[0])

    keep = ("prompt_set", "k", "temperature", "acceptance_length", "per_position", "drafts")
    return {
        "runs": [{k: r[k] for k in keep} for r in metrics["runs"]],
        "verdict": metrics["verdict"]["message"],
        "train_s": seconds("train"),
        "bench_s": seconds("bench"),
        "train_epochs": len(train["epochs"]),
        "best_epoch": train.get("best_epoch"),
        "last_train_cond_acc": train["epochs"][-1]["train"]["cond_acc"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configfile", nargs="+", type=Path, default=[CI_CONFIG])
    ap.add_argument("--data", type=Path, default=REPO / "tests" / "data", help="copied to data/")
    ap.add_argument("--set", required=True, help="the pinned prompt set to set floors on")
    ap.add_argument("--drafter", default="eagle3", help="a drafter of train.methods")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--margin", type=float, default=0.3)
    ap.add_argument("--slurm", action="store_true", help="through the tests' local Slurm cluster")
    ap.add_argument("--work", type=Path, help="working directory (default: a temporary one)")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds a workflow run may take")
    ap.add_argument("--out", help="write every seed's figures and the floors as JSON here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp) / "run"
        work.mkdir(parents=True, exist_ok=True)
        shutil.copytree(REPO / "config", work / "config", dirs_exist_ok=True)
        shutil.copytree(args.data, work / "data", dirs_exist_ok=True)
        if args.slurm:
            from local_slurm import ci_cluster

            with ci_cluster() as slurm:
                seeds = measure_seeds(args, work, slurm)
        else:
            seeds = measure_seeds(args, work, None)
    floors = floors_from((s["runs"] for s in seeds.values()), args.set, args.margin)
    for seed, s in seeds.items():
        for r in s["runs"]:
            if r["prompt_set"] == args.set:
                print(
                    f"seed {seed}: {args.set} k={r['k']} T={r['temperature']}: tau "
                    f"{r['acceptance_length']:.3f}, per position "
                    f"{' / '.join(f'{a:.3f}' for a in r['per_position'])} "
                    f"(train {s['train_s']:.0f} s)"
                )
    print("bench:\n  gate:\n    floors:")
    for f in floors:
        print(f"      - {json.dumps(f)}")
    if args.out:
        write_result(
            args.out,
            {
                "configfiles": [str(p) for p in args.configfile],
                "prompt_set": args.set,
                "drafter": args.drafter,
                "margin": args.margin,
                "slurm": args.slurm,
                "seeds": seeds,
                "floors": floors,
            },
        )


def measure_seeds(args, work: Path, slurm) -> dict[int, dict]:
    """Run the workflow once per seed of ``args.seeds`` in ``work``; each seed's figures."""
    from eagle3_pipeline.config import load_files

    with contextlib.chdir(work):  # the config's file paths are relative to the run's directory
        cfg = load_files([str(p.resolve()) for p in args.configfile])
    run = work / cfg["results_dir"] / cfg["run"]
    seeds = {}
    for seed in args.seeds:
        overrides = [f"train={{seed: {seed}}}", "bench={gate: {floors: []}}"]
        t0 = time.monotonic()
        proc = ci_snakemake(
            work,
            "--config",
            *overrides,
            slurm=slurm,
            configfiles=tuple(args.configfile),
            timeout=args.timeout,
        )
        if proc.returncode != 0:
            raise SystemExit(f"seed {seed} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        seeds[seed] = {**seed_figures(run, args.drafter), "wall_s": time.monotonic() - t0}
    return seeds


if __name__ == "__main__":
    main()
