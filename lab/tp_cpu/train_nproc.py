"""Run the pipeline's train stage (eagle3_pipeline.train.run: job file, launcher, speculators'
trainer with the CPU bridges, export, consistency check, metrics) on a real run's data with
NPROC CPU processes under torchrun (gloo, DDP) instead of one plain process.

    PYTHONPATH=$PWD/src .venv/bin/python lab/tp_cpu/train_nproc.py \
        --nproc 2 --total-seq-len 1024 --out tp_cpu/train_np2

--nproc 1 runs the stage exactly as the workflow does on the CPU (no torchrun). Every other
train setting comes from the run's config (config/config.yaml), --epochs, --seed and
--total-seq-len aside. With NPROC processes each rank packs its own batch of --total-seq-len
tokens, so one optimizer step sees NPROC x total_seq_len tokens: halve it for 2 processes to
keep the total batch of the 1-process run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", default="results/default")
    ap.add_argument("--config", default="config/config.yaml")
    ap.add_argument("--nproc", type=int, required=True)
    ap.add_argument("--total-seq-len", type=int, default=None)
    ap.add_argument("--epochs", type=int, default=None)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from eagle3_lab.results import write_result
    from eagle3_pipeline.runtime import setup_logging

    setup_logging(None)

    from eagle3_pipeline import config, methods
    from eagle3_pipeline.train import stage

    cfg = config.load(args.config)
    # the EAGLE-3 job's train section, as the workflow hands it to the stage
    tcfg = {**cfg["train"], **methods.method_train_config(cfg["train"], "eagle3")}
    if args.total_seq_len:
        tcfg["total_seq_len"] = args.total_seq_len
    if args.epochs:
        tcfg["epochs"] = args.epochs
    if args.seed is not None:
        tcfg["seed"] = args.seed

    if args.nproc > 1:
        # the stage's own GPU launch line (torchrun --nproc-per-node N), with the CPU settings
        # of train.gpus: 0 everywhere else
        from eagle3_pipeline.train import launcher

        stage.launch_command = lambda job_path, gpus: launcher.launch_command(job_path, args.nproc)

    run = Path(args.run)
    out = Path(args.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    metrics = stage.run(
        target_json=str(run / "target/target.json"),
        dataset_dir=str(run / "prepare/dataset"),
        manifest_path=str(run / "hidden_states/manifest.json"),
        d2t=str(run / "vocab/d2t.npy"),
        t2d=str(run / "vocab/t2d.npy"),
        drafter_dir=str(out / "drafter"),
        metrics_out=str(out / "drafter/metrics.json"),
        plot_out=str(out / "drafter/loss.png"),
        cfg=tcfg,
        work_dir=str(out / "train_work"),
        log_path=str(out / "train.log"),
    )
    summary = {
        "nproc": args.nproc,
        "total_seq_len_per_rank": tcfg["total_seq_len"],
        "seed": tcfg["seed"],
        "epochs": [
            {
                "epoch": e["epoch"],
                "val_full_acc": e.get("val", {}).get("full_acc"),
                "val_cond_acc": e.get("val", {}).get("cond_acc"),
                "val_loss": e.get("val", {}).get("loss"),
                "train_loss": e.get("train", {}).get("loss"),
                "tokens_per_s": e.get("tokens_per_s"),
            }
            for e in metrics["epochs"]
        ],
        "throughput": metrics["throughput"],
        "bridges": metrics["attempts"][0]["bridges"] if metrics.get("attempts") else None,
        "wall_s": metrics["wall_s"],
    }
    write_result(out / "summary.json", summary)
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
