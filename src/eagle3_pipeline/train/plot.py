"""The loss and validation-accuracy plot of a training run (``drafter/loss.png``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import methods
from ..runtime.files import atomic_path


def plot(metrics: dict[str, Any], records: list[dict[str, Any]], out: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def num(x):
        return float("nan") if x is None else float(x)

    epochs = metrics["epochs"]
    method = metrics.get("method")
    own = methods.get(method)
    n = metrics["config"]["positions"]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(12, 4.6))

    train = {int(r["global_step"]): r for r in records if r["kind"] == "train"}
    steps_per_epoch: dict[int, list[int]] = {}
    for g, r in sorted(train.items()):
        steps_per_epoch.setdefault(int(r["epoch"]), []).append(g)
    xs, ys = [], []
    for g, r in sorted(train.items()):
        e = int(r["epoch"])
        gs = steps_per_epoch[e]
        frac = (gs.index(g) + 1) / len(gs)
        xs.append(e + frac)
        ys.append(num(r["train"].get("loss")))
    if xs:
        ax_loss.plot(xs, ys, color="tab:blue", alpha=0.25, lw=1, label="train (logged steps)")
    ex = [e["epoch"] + 1 for e in epochs]
    ax_loss.plot(
        ex,
        [num(e["train"]["loss"]) for e in epochs],
        "o-",
        color="tab:blue",
        label="train (epoch mean)",
    )
    vx = [e["epoch"] + 1 for e in epochs if "val" in e]
    ax_loss.plot(
        vx,
        [num(e["val"]["loss"]) for e in epochs if "val" in e],
        "s-",
        color="tab:red",
        label="validation",
    )
    if metrics.get("best_epoch") is not None:
        ax_loss.axvline(
            metrics["best_epoch"] + 1,
            color="gray",
            ls=":",
            lw=1,
            label=f"exported (epoch {metrics['best_epoch'] + 1}, {metrics.get('best_by', '')})",
        )
    finite = [y for y in ys if y == y and y > 0]
    if finite and max(finite) / min(finite) > 8:  # early spikes would flatten the rest
        ax_loss.set_yscale("log")
    ax_loss.set_xlabel("epoch")
    ax_loss.set_ylabel(own.loss_label(n))
    ax_loss.set_title(f"Loss ({own.name})")
    ax_loss.grid(alpha=0.3)
    ax_loss.legend(fontsize=8)

    colors = plt.cm.viridis([i / max(1, n - 1) * 0.85 for i in range(n)])
    for style, (field, label) in zip(("o-", "o--"), own.accuracy_series, strict=False):
        for k in range(n):
            ys_acc = [num(e["val"][field][k]) for e in epochs if "val" in e]
            alpha = 1.0 if style == "o-" else 0.6
            ax_acc.plot(vx, ys_acc, style, color=colors[k], alpha=alpha, label=label.format(k + 1))
    ax_acc.set_xlabel("epoch")
    ax_acc.set_ylabel("validation accuracy")
    ax_acc.set_ylim(0, 1)
    ax_acc.set_title(f"Validation accuracy per {own.position_label}")
    ax_acc.grid(alpha=0.3)
    ax_acc.legend(fontsize=8, ncol=2)
    for ax in (ax_loss, ax_acc):
        ax.xaxis.get_major_locator().set_params(integer=True)
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
