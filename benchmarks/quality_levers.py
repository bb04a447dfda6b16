"""What moved τ by how much: each quality lever measured on the packaged ShareGPT prompts
(19k rows, SmolLM2-135M target, EAGLE-3 at k = 3 on an H200), against the greedy-answer drafter
of `config/gpu-quality.yaml`, in one table and one plot.

    PYTHONPATH=src .venv/bin/python benchmarks/quality_levers.py \
        --out benchmarks/results/quality_vs_data/quality_levers.json

Every drafter was measured by `lab/drafter_tau.py` (80 prompts a set, concurrency 8, 192 tokens,
one pass per temperature) and trained for 3 epochs from the same prompts; one thing differs
from the greedy drafter in each row:
- `sampled at T = 1`: the synth answers sampled at T = 1 (`lab/configs/gpu_quality_t1.yaml`);
- `on-policy`: later turns answered with the target's own earlier answers as their context
  (`lab/configs/gpu_quality_on_policy.yaml`);
- `on-policy, TTT depth 4`: the same data, trained at test-time-training depth 4
  (`lab/configs/gpu_quality_ttt4.yaml`), still served at k = 3;
- `data`: the previous doubling of the rows (9,886 -> 19,131 greedy samples), on MT-Bench only
  (the held-out sets differ between those runs).
The reference spread is how far the greedy drafter's τ at T = 0 and at T = 0.01 lie apart on
each set: two passes at almost equal settings, the closest thing to a repeat in these files.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tau_curve_plot import RESULTS, K, measured  # a neighbour: run as a script

from eagle3_lab.results import write_result
from eagle3_pipeline import methods

QV = "quality_vs_data"
BASELINE = (
    "greedy answers",
    f"{QV}/h200_quality_t0_tau.json",
    "gpu_runs/quality-train-t0/gpu-quality/drafter/eagle3/metrics.json",
)
LEVERS = (
    (
        "sampled at T = 1",
        f"{QV}/h200_quality_t1_tau.json",
        "gpu_runs/quality-train-t1/gpu-quality-t1/drafter/eagle3/metrics.json",
    ),
    (
        "on-policy",
        f"{QV}/h200_quality_on_policy_eagle3_tau.json",
        "gpu_runs/quality-on-policy/gpu-quality-on-policy/drafter/eagle3/metrics.json",
    ),
    (
        "on-policy, TTT depth 4",
        f"{QV}/h200_quality_on_policy_eagle3_ttt4_tau.json",
        "gpu_runs/quality-on-policy/gpu-quality-on-policy/drafter/eagle3_ttt4/metrics.json",
    ),
)
SETS = ("mtbench", "humaneval", "heldout")
TEMPERATURES = (0.0, 1.0)
DATA_FILE = f"{QV}/tau_vs_data_all.json"


def drafter_row(name: str, tau_file: str, metrics_file: str) -> dict:
    tau = measured(RESULTS / tau_file)
    drafter = json.loads((RESULTS / metrics_file).read_text())
    val = next(e["val"] for e in drafter["epochs"] if e["epoch"] == drafter["best_epoch"])
    return {
        "lever": name,
        "tau": {f"{s}@T={t:g}": tau[(s, t)]["tau"] for s in SETS for t in TEMPERATURES},
        "tau_mtbench_two_turns@T=0": tau.get(("mtbench_multi", 0.0), {}).get("tau"),
        "val_first_step_acc": val["full_acc"][0],
        "predicted_tau": methods.predicted_acceptance_length(drafter["prediction"], K),
        "files": [tau_file, metrics_file],
    }


def data_doubling() -> dict:
    """τ on MT-Bench at T = 0 on the H200 of the two largest greedy runs."""
    points = json.loads((RESULTS / DATA_FILE).read_text())["points"]
    mt = sorted(
        (p["samples"], p["tau"])
        for p in points
        if (p["trained_on"], p["measured_on"], p["prompt_set"]) == ("H200", "H200", "mtbench")
        and p["temperature"] == 0.0
        and p["synth_temperature"] == 0.0
    )
    (small, tau_small), (large, tau_large) = mt[-2], mt[-1]
    return {
        "lever": f"data: {small:,} -> {large:,} samples",
        "delta": {"mtbench@T=0": tau_large - tau_small},
        "files": [DATA_FILE],
    }


def plot(rows: list[dict], spread: dict[str, float], data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [f"{s}@T=0" for s in SETS]
    labels = [r["lever"] for r in rows] + [data["lever"]]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.25
    for i, key in enumerate(keys):
        values = [r["delta"][key] for r in rows] + [data["delta"].get(key, float("nan"))]
        xs = [j + (i - 1) * width for j in range(len(labels))]
        # whiskers: the reference spread of this set (T = 0 against T = 0.01)
        ax.bar(
            xs,
            values,
            width,
            label=key.replace("@T=0", ""),
            color=f"C{i}",
            yerr=spread[key],
            capsize=2,
            ecolor="grey",
        )
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel("change of τ at k = 3, T = 0, vs greedy answers")
    ax.set_title("What moved τ (SmolLM2-135M target, 19k packaged prompts, H200)")
    ax.legend(fontsize=8, title="prompt set (whiskers: T=0 vs T=0.01 spread)", title_fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="JSON; the plot beside it (.png)")
    args = ap.parse_args()
    base = drafter_row(*BASELINE)
    base_tau = measured(RESULTS / BASELINE[1])
    spread = {f"{s}@T=0": abs(base_tau[(s, 0.0)]["tau"] - base_tau[(s, 0.01)]["tau"]) for s in SETS}
    rows = []
    for lever in LEVERS:
        row = drafter_row(*lever)
        row["delta"] = {key: row["tau"][key] - base["tau"][key] for key in row["tau"]}
        rows.append(row)
    data = data_doubling()
    write_result(
        args.out,
        {"k": K, "baseline": base, "levers": rows, "data": data, "reference_spread": spread},
    )
    plot(rows, spread, data, args.out.with_suffix(".png"))
    print(f"{'lever':28s} " + " ".join(f"{k:>14s}" for k in base["tau"]) + "  val acc1  pred")
    for r in [base, *rows]:
        cells = " ".join(f"{v:14.3f}" for v in r["tau"].values())
        print(f"{r['lever']:28s} {cells}  {r['val_first_step_acc']:.3f}  {r['predicted_tau']:.2f}")
    for r in rows:
        cells = " ".join(f"{v:+14.3f}" for v in r["delta"].values())
        print(f"{'  change: ' + r['lever']:28s} {cells}")
    print(f"{data['lever']}: {data['delta']['mtbench@T=0']:+.3f} on MT-Bench at T = 0")
    print(
        "reference spread (T=0 vs T=0.01): " + ", ".join(f"{k} {v:.3f}" for k, v in spread.items())
    )


if __name__ == "__main__":
    main()
