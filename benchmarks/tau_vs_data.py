"""Acceptance length against training-data size, from one finished run.

    .venv/bin/python benchmarks/tau_vs_data.py --run results/quality --sizes 250 500 1000 2000

Takes a run whose prepare, vocab and extract stages are done (e.g. `snakemake --configfile
config/quality.yaml --until extract_gather vocab`), trains one drafter per size on the first n rows
of its (shuffled) training set with the run's train config, and benchmarks each under vLLM
speculative decoding with the run's bench config. Writes `<run>/tau_vs_data/curve.json` and
`curve.png`. Every drafter sees the same hidden states, vocab map and hyperparameters; only
the amount of data changes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from eagle3_lab.results import write_result
from eagle3_pipeline import bench, train
from eagle3_pipeline import config as cfglib
from eagle3_pipeline.bench import best_val
from eagle3_pipeline.methods import method_train_config
from eagle3_pipeline.runtime import setup_logging
from eagle3_pipeline.runtime.files import read_json

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="results/<run> with extraction done")
    ap.add_argument("--config", help="config file of that run (default: config/<run name>.yaml)")
    ap.add_argument("--sizes", type=int, nargs="+", required=True)
    ap.add_argument("--epochs", type=int, help="override train.epochs")
    ap.add_argument("--prompt-sets", nargs="+", help="override bench.prompt_sets")
    args = ap.parse_args()
    run = Path(args.run).resolve()
    cfg_path = Path(args.config or REPO / "config" / f"{run.name}.yaml")
    cfg = cfglib.load(cfg_path)
    if args.epochs:
        cfg["train"]["epochs"] = args.epochs
    if args.prompt_sets:
        cfg["bench"]["prompt_sets"] = args.prompt_sets
    out = run / "tau_vs_data"
    out.mkdir(exist_ok=True)
    setup_logging(out / "log.txt")
    from datasets import load_from_disk

    full = load_from_disk(str(run / "prepare" / "dataset"))
    sets = {
        name: str(run / "prompts" / f"bench_{name}.jsonl") for name in cfg["bench"]["prompt_sets"]
    }
    # EAGLE-3 drafters, trained and measured as the run's train and bench jobs would: with
    # bench.pairing alternate each drafter's rounds alternate with a baseline server beside it,
    # with separate one baseline is measured for all of them
    train_cfg = {**cfg["train"], **method_train_config(cfg["train"], "eagle3")}
    bench_cfg = {**cfg["bench"], "num_speculative_tokens": cfglib.speculative_tokens(cfg, "eagle3")}
    baseline = None
    if bench_cfg["pairing"] == "separate":
        baseline = out / "baseline.json"
        bench.run_baseline(
            run / "target/target.json",
            sets,
            baseline,
            bench_cfg,
            cfg["vllm"],
            cache_dir=out / "bench_cache",
            log_path=out / "log.txt",
        )
    curve_path = out / "curve.json"
    curve = read_json(curve_path) if curve_path.exists() else {"points": []}
    done = {p["samples"] for p in curve["points"]}
    for n in sorted(args.sizes):
        if n in done:
            continue
        if n > len(full):
            raise SystemExit(f"the run has {len(full)} rows, fewer than {n}")
        d = out / f"n{n}"
        if not (d / "dataset").exists():
            full.select(range(n)).save_to_disk(str(d / "dataset"))
        t0 = time.monotonic()
        metrics = train.run(
            target_json=run / "target/target.json",
            dataset_dir=d / "dataset",
            manifest_path=run / "hidden_states/manifest.json",
            d2t=run / "vocab/d2t.npy",
            t2d=run / "vocab/t2d.npy",
            drafter_dir=d / "drafter",
            metrics_out=d / "drafter/metrics.json",
            plot_out=d / "drafter/loss.png",
            cfg=train_cfg,
            work_dir=d / "train_work",
            log_path=out / "log.txt",
        )
        train_s = time.monotonic() - t0
        b = bench.run(
            run / "target/target.json",
            d / "drafter",
            run / "hidden_states/manifest.json",
            d / "drafter/metrics.json",
            sets,
            d / "bench.json",
            bench_cfg,
            cfg["vllm"],
            cache_dir=d / "bench_cache",
            baseline_json=baseline,
            log_path=out / "log.txt",
        )
        tokens = int(sum(full.select(range(n))["seq_len"]))
        point = {
            "samples": n,
            "tokens": tokens,
            "epochs": train_cfg["epochs"],
            "train_s": round(train_s),
            "val": best_val(metrics),
            "acceptance_length": {r["prompt_set"]: r["acceptance_length"] for r in b["runs"]},
            "per_position": {r["prompt_set"]: r["per_position"] for r in b["runs"]},
            "predicted": {r["prompt_set"]: r["predicted_acceptance_length"] for r in b["runs"]},
            "speedup": {r["prompt_set"]: r["speedup"] for r in b["runs"]},
        }
        curve["points"].append(point)
        curve["points"].sort(key=lambda p: p["samples"])
        write_result(curve_path, curve)
        shutil.rmtree(d / "train_work", ignore_errors=True)
        print(json.dumps(point), flush=True)
    plot(curve, out / "curve.png")


def plot(curve: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = curve["points"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in sorted({k for p in pts for k in p["acceptance_length"]}):
        xs = [p["samples"] for p in pts if name in p["acceptance_length"]]
        ax.plot(
            xs,
            [p["acceptance_length"][name] for p in pts if name in p["acceptance_length"]],
            "o-",
            label=f"{name} measured",
        )
        ax.plot(
            xs,
            [p["predicted"][name] for p in pts if name in p["predicted"]],
            "x--",
            alpha=0.6,
            label=f"{name} predicted by validation",
        )
    finish_tau_plot(fig, ax, path, "τ against training data size", "acceptance length τ", 8)


def finish_tau_plot(fig, ax, path: Path, title: str, ylabel: str, legend_size: int) -> None:
    """The axes every τ-against-data plot shares (log samples, the 2.5 goal line), saved."""
    ax.axhline(2.5, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("training samples (synth answers)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
