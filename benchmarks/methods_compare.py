"""Drafter methods side by side, from one finished run that trained several (train.methods).

    .venv/bin/snakemake --cores all --configfile benchmarks/configs/methods_cpu.yaml
    .venv/bin/python benchmarks/methods_compare.py --run results/methods \
        --out benchmarks/results/methods/methods_cpu.json

Reads what the pipeline wrote (`drafter/<method>/metrics.json`, `bench/<method>/metrics.json`,
Snakemake's `benchmarks/train_<method>.tsv`), prints one table row per method, k and prompt set
(tau measured and predicted, acceptance per position, tok/s, speedup against the shared
baseline, outputs differing at T=0) and the training cost of each method, and writes them as
JSON. It measures nothing itself: every figure is the pipeline's own, the speedup with its
spread over the bench rounds where the run measured in rounds.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from eagle3_lab.results import write_result
from eagle3_pipeline.runtime.files import read_json


def snakemake_seconds(tsv: Path) -> float | None:
    """Wall time of a job from Snakemake's benchmark file (None when it did not run)."""
    if not tsv.exists():
        return None
    with tsv.open() as fh:
        return float(next(csv.DictReader(fh, delimiter="\t"))["s"])


def training(run: Path, method: str) -> dict:
    m = read_json(run / "drafter" / method / "metrics.json")
    trainer = m["config"]["trainer"]
    best = next((e["val"] for e in m["epochs"] if e["epoch"] == m["best_epoch"]), {})
    return {
        "drafter": {
            k: trainer.get(k)
            for k in ("speculator_type", "draft_arch", "num_layers", "ttt_steps", "block_size")
            if k in trainer
        }
        | ({"max_anchors": trainer["max_anchors"]} if "max_anchors" in trainer else {}),
        "epochs": len(m["epochs"]),
        "best_epoch": m["best_epoch"],
        "best_by": m["best_by"],
        "best_validation": best,
        "train_wall_s": round(m["wall_s"], 1),
        "job_wall_s": snakemake_seconds(run / "benchmarks" / f"train_{method}.tsv"),
        "train_tokens_per_s": m["throughput"]["tokens_per_s"],
    }


def bench_rows(run: Path, method: str) -> list[dict]:
    b = read_json(run / "bench" / method / "metrics.json")
    keep = (
        "prompt_set",
        "k",
        "temperature",
        "concurrency",
        "acceptance_length",
        "predicted_acceptance_length",
        "per_position",
        "tokens_per_s",
        "baseline_tokens_per_s",
        "speedup",
        "speedup_range",
        "significance",
    )
    rows = []
    for r in b["runs"]:
        row = {"method": method, **{k: r.get(k) for k in keep}}
        ovb = r.get("outputs_vs_baseline")
        row["outputs_differing"] = f"{ovb['differing']}/{ovb['compared']}" if ovb else None
        rows.append(row)
    return rows


def fmt(v, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, list):
        return " / ".join(fmt(x, 2) for x in v)
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def spread(row: dict) -> str:
    """The speedup's min-max over the bench rounds, or what stands in for it (a run measured
    before the bench stage took rounds has neither: one run)."""
    if row.get("speedup_range") is None:
        return "one run"
    lo, hi = row["speedup_range"]
    return f"{lo:.2f}-{hi:.2f} ({row['significance']})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="results/<run> of a finished run")
    ap.add_argument("--out", help="write the comparison as JSON here")
    args = ap.parse_args()
    run = Path(args.run).resolve()
    methods = sorted(p.name for p in (run / "drafter").iterdir() if (p / "metrics.json").exists())
    if not methods:
        sys.exit(f"{run}: no drafter/<method>/metrics.json (is the run finished?)")
    result = {
        "run": str(run.name),
        "methods": methods,
        "training": {m: training(run, m) for m in methods},
        "bench": [r for m in methods for r in bench_rows(run, m)],
        "baseline_job_wall_s": snakemake_seconds(run / "benchmarks" / "bench_baseline.tsv"),
        "bench_job_wall_s": {
            m: snakemake_seconds(run / "benchmarks" / f"bench_{m}.tsv") for m in methods
        },
    }
    print("| method | drafter | training (s) | training tok/s | best epoch (by) |")
    print("|---|---|---|---|---|")
    for m, t in result["training"].items():
        shape = ", ".join(f"{k} {v}" for k, v in t["drafter"].items() if k != "speculator_type")
        print(
            f"| {m} | {shape} | {fmt(t['job_wall_s'] or t['train_wall_s'], 0)} | "
            f"{fmt(t['train_tokens_per_s'], 0)} | {t['best_epoch']} ({t['best_by']}) |"
        )
    print()
    print(
        "| method | prompt set | k | τ measured | τ predicted | acceptance per position | "
        "tok/s | tok/s baseline | speedup | spread | outputs differing (T=0) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in result["bench"]:
        print(
            f"| {r['method']} | {r['prompt_set']} | {r['k']} | {fmt(r['acceptance_length'])} | "
            f"{fmt(r['predicted_acceptance_length'])} | {fmt(r['per_position'])} | "
            f"{fmt(r['tokens_per_s'], 1)} | {fmt(r['baseline_tokens_per_s'], 1)} | "
            f"{fmt(r['speedup'], 2)} | {spread(r)} | {r['outputs_differing'] or '-'} |"
        )
    if args.out:
        write_result(args.out, result)


if __name__ == "__main__":
    main()
