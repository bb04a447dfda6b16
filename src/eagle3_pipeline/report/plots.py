"""The report's benchmark plots: acceptance length, acceptance per position and throughput
per drafter, k and prompt set, with the spread of the bench rounds."""

from __future__ import annotations

from pathlib import Path


def _label(r: dict, methods: int, sep: str = " ") -> str:
    """A run's label: method (when several are compared), prompt set, k, T, concurrency."""
    who = f"{r['method']}{sep}" if methods > 1 else ""
    return f"{who}{r['prompt_set']}{sep}k={r['k']} T={r['temperature']} c={r['concurrency']}"


def plot_bench(runs: list[dict], plots_dir: Path) -> dict[str, Path]:
    """The benchmark plots of every method's runs side by side (``runs`` carry ``method``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots_dir.mkdir(parents=True, exist_ok=True)
    runs = [r for r in runs if r.get("acceptance_length") is not None]
    out: dict[str, Path] = {}
    if not runs:
        return out
    n_methods = len({r["method"] for r in runs})

    def save(fig, key: str) -> None:
        fig.tight_layout()
        out[key] = plots_dir / f"{key}.png"
        fig.savefig(out[key], dpi=110)
        plt.close(fig)

    # Per-position acceptance: one group of bars per draft position, one bar per run.
    fig, ax = plt.subplots(figsize=(8, 4.2))
    width = 0.8 / len(runs)
    longest = max(len(r["per_position"] or []) for r in runs)
    for j, r in enumerate(runs):
        pos = r["per_position"] or []
        ax.bar([i + j * width for i in range(len(pos))], pos, width, label=_label(r, n_methods))
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate (accepted / drafts)")
    ax.set_title("Per-position acceptance")
    ax.set_ylim(0, 1)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(longest)])
    ax.set_xticklabels([str(i + 1) for i in range(longest)])
    ax.legend(fontsize=7)
    save(fig, "acceptance_per_position")

    # Acceptance length, measured next to what training validation predicts.
    fig, ax = plt.subplots(figsize=(8, 4.2))
    xs = range(len(runs))
    ax.bar(xs, [r["acceptance_length"] for r in runs], 0.4, label="measured")
    predicted = [r.get("predicted_acceptance_length") or 0 for r in runs]
    ax.bar([x + 0.4 for x in xs], predicted, 0.4, label="predicted by validation", alpha=0.8)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks([x + 0.2 for x in xs])
    ax.set_xticklabels([_label(r, n_methods, "\n") for r in runs], fontsize=7)
    ax.set_ylabel("acceptance length τ (tokens per step)")
    ax.set_title("Acceptance length per prompt set")
    ax.legend(fontsize=8)
    save(fig, "acceptance_length")

    # Throughput: per prompt set (and T, concurrency) the shared baseline, then every drafter
    # (method, k), each with its speedup over that baseline.
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["prompt_set"], r["temperature"], r["concurrency"]), []).append(r)
    bars = 1 + max(len(g) for g in groups.values())
    width = 0.8 / bars
    fig, ax = plt.subplots(figsize=(8, 4.2))
    drafters = sorted({(r["method"], r["k"]) for r in runs}, key=str)
    colors = {d: f"C{i + 1}" for i, d in enumerate(drafters)}
    for gi, group in enumerate(groups.values()):
        base = group[0]
        ax.bar(
            gi,
            base["baseline_tokens_per_s"],
            width,
            color="C0",
            yerr=_spread(base["baseline_tokens_per_s"], base.get("baseline_tokens_per_s_rounds")),
        )
        for j, r in enumerate(group, 1):
            x = gi + j * width
            ax.bar(
                x,
                r["tokens_per_s"],
                width,
                color=colors[(r["method"], r["k"])],
                yerr=_spread(r["tokens_per_s"], r.get("tokens_per_s_rounds")),
            )
            ax.text(
                x, r["tokens_per_s"], f"{r['speedup']:.2f}x", ha="center", va="bottom", fontsize=7
            )
    ax.bar([], [], color="C0", label="without drafter")
    for d, color in colors.items():
        ax.bar([], [], color=color, label=f"{d[0]} k={d[1]}")
    ax.set_xticks([gi + (bars - 1) * width / 2 for gi in range(len(groups))])
    ax.set_xticklabels([f"{n}\nT={t} c={c}" for n, t, c in groups], fontsize=7)
    ax.set_ylabel("output tokens/s")
    ax.set_title("Throughput with and without each drafter (median, min-max of the rounds)")
    ax.legend(fontsize=8)
    save(fig, "throughput")
    return out


def _spread(mid: float, rounds: list[float] | None) -> list[list[float]] | None:
    """Error bar from the median to the min and max of the rounds (None: one round)."""
    if not rounds or len(rounds) < 2:
        return None
    return [[mid - min(rounds)], [max(rounds) - mid]]
