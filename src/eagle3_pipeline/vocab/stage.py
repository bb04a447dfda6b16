"""Draft vocabulary (stage ``vocab``): frequencies of the trained tokens, top-K map, coverage.

Counted are exactly the tokens the drafter is trained on: the tokens of the ``prepare`` stage's
data set where its ``loss_mask`` is 1 (a masked bincount over the Arrow columns, read memory
mapped), so ``token_freq.sum()`` equals ``tokens_trainable`` of ``prepare/stats.json``.

The map is the ``K`` most frequent tokens, in the format of speculators 0.9
(``speculators.train.vocab_mapping.build_vocab_mappings_from_distribution``, byte for byte):
``d2t`` int64 [K] offsets (target id = i + d2t[i], ids ascending) and ``t2d`` bool [V]. Ties are
broken by the smaller token id; when fewer than K tokens occur, the smallest unseen ids fill up
the map; K = V is the identity.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..prepare.stage import read_batches
from ..runtime.files import atomic_path, read_json, write_json
from ..runtime.provenance import provenance

log = logging.getLogger(__name__)

AUTO_K_MULTIPLE = 256
COVERAGE_POINTS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)


# --------------------------------------------------------------------------------------------
# Counting
# --------------------------------------------------------------------------------------------


def count_tokens(dataset_dir: str | os.PathLike, vocab_size: int) -> tuple[np.ndarray, dict]:
    """Counts (int64 [vocab_size]) of the loss-masked tokens of the prepared data set, and
    ``{"rows", "tokens_total", "tokens_counted"}``."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    rows = tokens_total = 0
    for batch in read_batches(dataset_dir):
        ids = batch.column("input_ids").flatten().to_numpy()
        trained = ids[batch.column("loss_mask").flatten().to_numpy() != 0]
        if trained.size and int(trained.max()) >= vocab_size:
            raise ValueError(
                f"token id {int(trained.max())} in {dataset_dir} is >= the target vocab size "
                f"{vocab_size}: the data was not made with this target's tokenizer"
            )
        counts += np.bincount(trained, minlength=vocab_size)
        rows += batch.num_rows
        tokens_total += ids.size
    stats = {"rows": rows, "tokens_total": tokens_total, "tokens_counted": int(counts.sum())}
    return counts, stats


# --------------------------------------------------------------------------------------------
# The map and its coverage
# --------------------------------------------------------------------------------------------


def top_k_ids(counts: np.ndarray, k: int) -> np.ndarray:
    """Ids of the ``k`` most frequent tokens, ascending. Ties go to the smaller id; unseen
    tokens (count 0) rank after all seen ones, smaller ids first - which is how speculators
    fills a map larger than the number of distinct tokens."""
    counts = np.asarray(counts, dtype=np.int64)
    if not 1 <= k <= counts.shape[0]:
        raise ValueError(
            f"draft vocab size {k} must be in [1, target vocab size {counts.shape[0]}]"
        )
    order = np.argsort(-counts, kind="stable")  # stable: equal counts keep ascending ids
    return np.sort(order[:k])


def build_vocab_mappings(
    counts: np.ndarray, draft_vocab_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(d2t int64 [K], t2d bool [V])`` as speculators builds them from these counts."""
    selected = top_k_ids(counts, draft_vocab_size)
    d2t = selected - np.arange(draft_vocab_size, dtype=np.int64)
    t2d = np.zeros(len(counts), dtype=bool)
    t2d[selected] = True
    return d2t, t2d


def coverage_curve(counts: np.ndarray) -> np.ndarray:
    """``curve[K-1]`` = share of the counted tokens that the top-K tokens cover."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        raise ValueError("no tokens counted")
    return np.cumsum(np.sort(counts)[::-1]) / total


def choose_k(
    counts: np.ndarray, draft_vocab_size: int | str, target_coverage: float
) -> tuple[int, str, int]:
    """``(K, "fixed"|"auto", smallest K reaching target_coverage)``.

    ``auto``: that smallest K rounded up to a multiple of AUTO_K_MULTIPLE, capped at V.
    """
    curve = coverage_curve(counts)
    vocab_size = len(curve)
    k_needed = int(np.searchsorted(curve, target_coverage, side="left")) + 1
    k_needed = min(k_needed, vocab_size)
    if draft_vocab_size == "auto":
        k = -(-k_needed // AUTO_K_MULTIPLE) * AUTO_K_MULTIPLE
        return min(k, vocab_size), "auto", k_needed
    k = int(draft_vocab_size)
    if not 1 <= k <= vocab_size:
        raise ValueError(
            f"vocab.draft_vocab_size {k} must be in [1, target vocab size {vocab_size}] (or 'auto')"
        )
    return k, "fixed", k_needed


def _save_npy(path: str | os.PathLike, arr: np.ndarray) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.save(fh, arr)


def plot_coverage(
    curve: np.ndarray,
    k: int,
    how: str,
    target_coverage: float,
    out: str | os.PathLike,
    title_note: str = "",
) -> None:
    """Cumulative coverage against K (log x), K marked and its coverage written beside it."""
    from matplotlib.figure import Figure

    vocab_size = len(curve)
    ks = np.arange(1, vocab_size + 1)
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.subplots()
    ax.plot(ks, 100 * curve, color="tab:blue", lw=2, label="top-K coverage")
    ax.set_xscale("log")
    ax.set_xlim(1, vocab_size)
    ax.set_ylim(0, 102)
    ax.axvline(k, color="tab:red", ls="--", lw=1.5, label=f"draft vocab K = {k:,} ({how})")
    ax.axhline(
        100 * target_coverage,
        color="gray",
        ls=":",
        lw=1.2,
        label=f"target coverage {100 * target_coverage:.1f} %",
    )
    cov = float(curve[k - 1])
    ax.plot([k], [100 * cov], "o", color="tab:red")
    # The curve rises and bends down: below right of the point is free, unless at the edge.
    left = np.log(k) > 0.8 * np.log(vocab_size)
    ax.annotate(
        f"K = {k:,}\n{100 * cov:.2f} % covered",
        xy=(k, 100 * cov),
        xytext=(-12 if left else 12, -14),
        textcoords="offset points",
        ha="right" if left else "left",
        va="top",
        fontsize=11,
        color="tab:red",
        bbox={"boxstyle": "round", "fc": "white", "ec": "tab:red", "alpha": 0.9},
    )
    ax.set_xlabel(
        f"draft vocabulary size K (most frequent tokens first; target vocab {vocab_size:,})",
        fontsize=11,
    )
    ax.set_ylabel("trained tokens covered (%)", fontsize=11)
    ax.set_title(
        "Draft vocabulary coverage of the trained (completion) tokens"
        + (f"\n{title_note}" if title_note else ""),
        fontsize=12,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize=10)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=120)


def build(
    dataset_dir: str | os.PathLike,
    target_json: str | os.PathLike,
    d2t_out: str | os.PathLike,
    t2d_out: str | os.PathLike,
    freq_out: str | os.PathLike,
    coverage_out: str | os.PathLike,
    plot_out: str | os.PathLike,
    draft_vocab_size: int | str,
    target_coverage: float,
) -> dict[str, Any]:
    """The stage: count, choose K, write the map, the counts, coverage.json and the plot."""
    vocab_size = int(read_json(target_json)["architecture"]["vocab_size"])
    dataset_dir = Path(dataset_dir)
    counts, count_stats = count_tokens(dataset_dir, vocab_size)
    if count_stats["tokens_counted"] == 0:
        raise ValueError(f"no trainable tokens in {dataset_dir}: {count_stats}")
    k, how, k_needed = choose_k(counts, draft_vocab_size, target_coverage)
    d2t, t2d = build_vocab_mappings(counts, k)
    curve = coverage_curve(counts)
    coverage = {
        "draft_vocab_size": k,
        "selection": how,
        "configured_draft_vocab_size": draft_vocab_size,
        "target_coverage": target_coverage,
        "k_for_target_coverage": k_needed,
        "coverage": float(curve[k - 1]),
        "target_vocab_size": vocab_size,
        "tokens_counted": count_stats["tokens_counted"],
        "distinct_tokens": int(np.count_nonzero(counts)),
        "coverage_at": {str(p): float(curve[p - 1]) for p in COVERAGE_POINTS if p <= vocab_size},
        "counting": count_stats,
        "provenance": provenance(
            {"draft_vocab_size": draft_vocab_size, "target_coverage": target_coverage},
            {"dataset": dataset_dir, "target": target_json},
        ),
    }
    log.info(
        "vocab: K=%d (%s), coverage %.4f of %d tokens (%d distinct)",
        k,
        how,
        coverage["coverage"],
        coverage["tokens_counted"],
        coverage["distinct_tokens"],
    )
    _save_npy(d2t_out, d2t)
    _save_npy(t2d_out, t2d)
    _save_npy(freq_out, counts)
    plot_coverage(
        curve,
        k,
        how,
        target_coverage,
        plot_out,
        title_note=f"{coverage['tokens_counted']:,} tokens, "
        f"{coverage['distinct_tokens']:,} distinct",
    )
    write_json(coverage_out, coverage)
    return coverage
