"""Put train_nproc.py runs side by side: validation accuracy per TTT step and epoch, optimizer
steps, training-process wall time (start to end record) and the stage's tokens/s figure.

    python3 lab/tp_cpu/summarize_train.py tp_cpu/train_np1 tp_cpu/train_np2 \
        --json benchmarks/results/tensor_parallel/train_1v2_seed0.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def one(run: Path) -> dict:
    summary = json.loads((run / "summary.json").read_text())
    records = [
        json.loads(line)
        for line in (run / "train_work/logs/metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    start = next(r for r in records if r["kind"] == "start")
    end = next(r for r in records if r["kind"] == "end")
    # one loader record per training batch of rank 0 = one optimizer step
    steps = sum(1 for r in records if r["kind"] == "loader")
    last = summary["epochs"][-1]
    return {
        "run": str(run),
        "world_size": start.get("world_size"),
        "bridges": start.get("bridges"),
        "seed": summary.get("seed", 0),
        "total_seq_len_per_rank": summary["total_seq_len_per_rank"],
        "optimizer_steps": steps,
        "training_process_s": round(end["t"] - start["t"], 1),
        # before the stage counted every rank (its note says so since), rank 0's batch only
        (
            "stage_tokens_per_s (all ranks)"
            if "all ranks" in summary["throughput"].get("note", "")
            else "stage_tokens_per_s (rank 0 only)"
        ): round(summary["throughput"]["tokens_per_s"], 1),
        "final_val_full_acc": [round(a, 4) for a in last["val_full_acc"]],
        "final_val_cond_acc": [round(a, 4) for a in last["val_cond_acc"]],
        "final_val_loss": round(last["val_loss"], 3),
        "val_full_acc_per_epoch": [
            [round(a, 4) for a in e["val_full_acc"]] for e in summary["epochs"]
        ],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = [one(Path(r)) for r in args.runs]
    base = rows[0]["training_process_s"]
    for r in rows:
        r["speedup_vs_first"] = round(base / r["training_process_s"], 2)
    text = json.dumps(rows, indent=2)
    print(text)
    if args.json:
        from eagle3_lab.results import write_result

        write_result(args.json, {"runs": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
