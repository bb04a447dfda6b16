"""Draft vocabulary (stage ``vocab``): frequencies of the trained tokens, top-K map, coverage.

Counted are exactly the tokens the drafter is trained on: the loss-masked (completion) tokens of
the rows the ``prepare`` stage keeps, after its truncation to ``seq_length``. Both stages use
:func:`eagle3_pipeline.prepare.rows_of_chunk` (the exact way) and
:func:`eagle3_pipeline.prepare.truncate_lengths` (also in the fast way), so
``token_freq.sum()`` equals ``tokens_trainable`` of ``prepare/stats.json``.

The map is the ``K`` most frequent tokens, in the format of speculators 0.9
(``speculators.train.vocab_mapping.build_vocab_mappings_from_distribution``, byte for byte):
``d2t`` int64 [K] offsets (target id = i + d2t[i], ids ascending) and ``t2d`` bool [V]. Ties are
broken by the smaller token id; when fewer than K tokens occur, the smallest unseen ids fill up
the map; K = V is the identity.

Counting streams the zstd JSONL in chunks of whole lines. Two ways, same result:

- ``json``: the stdlib ``json`` per line, then the shared row checks - exact for any input.
- ``fast`` (needs ``msgspec`` and ``numba``): msgspec decodes each line's structure and hands over
  the two id arrays as raw JSON bytes, a numba kernel reads the digits and counts. It accepts only
  the well-formed case (arrays of 1..9-digit non-negative integers); any chunk with anything else
  (a malformed row, an id >= V, a 10-digit id) is redone with the ``json`` way, which decides it.

Decompression runs in a background thread (zstd releases the GIL), ahead of the parsing.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import queue
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .fileio import atomic_path, read_json, write_json
from .prepare import NO_TRAINABLE, iter_line_chunks, rows_of_chunk, truncate_lengths
from .provenance import provenance
from .runtime import Progress

log = logging.getLogger(__name__)

AUTO_K_MULTIPLE = 256
COVERAGE_POINTS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
COUNT_METHODS = ("auto", "fast", "json")
# Decompressed bytes per chunk: small enough to stay in the CPU cache between the steps.
COUNT_CHUNK_BYTES = 128 << 10
# Numbers of more digits than this send their chunk to the exact path (no real id is that large).
MAX_FAST_DIGITS = 9


# --------------------------------------------------------------------------------------------
# Counting
# --------------------------------------------------------------------------------------------


class _Tally:
    """Token counts plus the row bookkeeping of one counting pass."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self.counts = np.zeros(vocab_size, dtype=np.int64)
        self.rows_in = 0
        self.rows_counted = 0
        self.dropped: Counter[str] = Counter()
        self.chunks_fast = 0
        self.chunks_exact = 0

    def check_ids(self, ids: np.ndarray) -> None:
        if ids.size and int(ids.max()) >= self.vocab_size:
            raise ValueError(
                f"token id {int(ids.max())} in a completion is >= the target vocab size "
                f"{self.vocab_size}: the synth records were not made with this target's tokenizer"
            )

    def summary(self) -> dict[str, Any]:
        return {
            "rows_in": self.rows_in,
            "rows_counted": self.rows_counted,
            "rows_dropped": int(sum(self.dropped.values())),
            "dropped_by_reason": dict(sorted(self.dropped.items())),
            "tokens_counted": int(self.counts.sum()),
            "chunks_fast": self.chunks_fast,
            "chunks_exact": self.chunks_exact,
        }


def _count_chunk_exact(chunk: bytes, seq_length: int, tally: _Tally) -> None:
    """The reference way: the rows exactly as the prepare stage makes them."""
    parts: list[list[int]] = []
    for row in rows_of_chunk(chunk, seq_length):
        tally.rows_in += 1
        if isinstance(row, str):
            tally.dropped[row] += 1
            continue
        tally.rows_counted += 1
        parts.append(row.completion[: row.n_trainable])
    ids = np.fromiter(itertools.chain.from_iterable(parts), dtype=np.int64)
    tally.check_ids(ids)
    tally.counts += np.bincount(ids, minlength=tally.vocab_size)
    tally.chunks_exact += 1


# Plain Python; compiled with numba by _fast_tools(). Also the readable reference of the kernels.
def _parse_id_arrays(buf, budget, ids, lengths):
    """Read ``len(lengths)`` JSON arrays of non-negative integers written back to back
    (``[1,2][30]...``, the bytes of ``buf``). Store the length of array r in ``lengths[r]`` and
    its first ``budget[r]`` values in ``ids``, one array after the other. Return how many values
    were stored, or -1 when ``buf`` is anything else: other bytes (spaces, signs, dots, letters),
    nesting, an empty array, a number of more than MAX_FAST_DIGITS digits, a wrong array count.
    """
    n_rows = lengths.shape[0]
    row = -1
    inside = False
    k = 0
    val = 0
    digits = 0
    m = 0
    for i in range(buf.shape[0]):
        c = int(buf[i])
        if 48 <= c <= 57:  # digit
            if not inside or digits == MAX_FAST_DIGITS:
                return -1
            val = val * 10 + (c - 48)
            digits += 1
        elif c == 44 or c == 93:  # ',' or ']' ends a number
            if not inside or digits == 0:
                return -1
            if k < budget[row]:
                ids[m] = val
                m += 1
            k += 1
            val = 0
            digits = 0
            if c == 93:
                lengths[row] = k
                inside = False
        elif c == 91:  # '[' starts the next array
            if inside or row + 1 >= n_rows:
                return -1
            row += 1
            inside = True
            k = 0
        else:
            return -1
    if inside or row != n_rows - 1:
        return -1
    return m


def _add_counts(counts, ids, m):
    """Count ``ids[:m]``; False (and nothing counted) if one is not below ``len(counts)``."""
    for i in range(m):
        if ids[i] >= counts.shape[0]:
            return False
    for i in range(m):
        counts[ids[i]] += 1
    return True


@functools.cache
def _fast_tools():
    """(msgspec decoder, compiled kernels), or None when msgspec or numba is missing."""
    try:
        import msgspec
        import numba
    except ImportError:
        return None

    # Only these fields are decoded; the id arrays stay raw JSON bytes, other fields are skipped.
    ids_struct = msgspec.defstruct(
        "SynthIds",
        [("id", str), ("prompt_token_ids", msgspec.Raw), ("completion_token_ids", msgspec.Raw)],
    )
    jit = numba.njit(nogil=True, cache=True)
    return {
        "decoder": msgspec.json.Decoder(ids_struct),
        "error": msgspec.DecodeError,
        "parse": jit(_parse_id_arrays),
        "add": jit(_add_counts),
    }


def fast_available() -> bool:
    return _fast_tools() is not None


def _decode_chunk(chunk: bytes, tools: dict) -> tuple[int, np.ndarray, np.ndarray] | None:
    """Fast way, step 1: the row count and the raw id arrays of all rows,
    prompts and completions each back to back; None if msgspec refuses the chunk."""
    try:
        rows = tools["decoder"].decode_lines(chunk)
    except tools["error"]:
        return None
    prompts = np.frombuffer(b"".join([r.prompt_token_ids for r in rows]), dtype=np.uint8)
    completions = np.frombuffer(b"".join([r.completion_token_ids for r in rows]), dtype=np.uint8)
    return len(rows), prompts, completions


def _count_decoded(
    decoded: tuple[int, np.ndarray, np.ndarray] | None, seq_length: int, tally: _Tally, tools: dict
) -> bool:
    """Fast way, step 2 (numba): count; False (and nothing counted) unless
    every row is well-formed and every counted id is below the vocab size."""
    if decoded is None:
        return False
    n, prompts, completions = decoded
    if n == 0:
        return True
    n_prompt = np.empty(n, dtype=np.int64)
    if (
        tools["parse"](prompts, np.zeros(n, dtype=np.int64), np.empty(0, dtype=np.int64), n_prompt)
        < 0
    ):
        return False
    # What truncation leaves of a completion that fills the window: its trainable budget.
    _, budget = truncate_lengths(n_prompt, seq_length, seq_length)
    ids = np.empty(completions.shape[0] // 2 + 1, dtype=np.int64)
    n_completion = np.empty(n, dtype=np.int64)
    m = tools["parse"](completions, budget.astype(np.int64, copy=False), ids, n_completion)
    if m < 0:
        return False
    _, n_trainable = truncate_lengths(n_prompt, n_completion, seq_length)
    assert m == int(n_trainable.sum()), "kernel disagrees with truncate_lengths"
    if not tools["add"](tally.counts, ids, m):
        return False  # an id >= vocab size: the exact way reports it
    tally.rows_in += n
    no_train = int(np.count_nonzero(n_trainable == 0))
    tally.rows_counted += n - no_train
    if no_train:
        tally.dropped[NO_TRAINABLE] += no_train
    tally.chunks_fast += 1
    return True


def prefetch(items: Iterable, depth: int = 8) -> Iterator:
    """Iterate ``items`` in a background thread, ``depth`` items ahead of the consumer."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    end = object()

    def put(entry) -> bool:
        """Queue ``entry`` unless the consumer has gone; False once it has."""
        while not stop.is_set():
            try:
                q.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put((True, item)):
                    return
            put((True, end))
        except BaseException as exc:  # handed to the consumer
            put((False, exc))

    thread = threading.Thread(target=produce, name="prefetch", daemon=True)
    thread.start()
    try:
        while True:
            ok, item = q.get()
            if not ok:
                raise item
            if item is end:
                return
            yield item
    finally:
        stop.set()


def count_tokens(
    records_path: str | os.PathLike,
    vocab_size: int,
    seq_length: int,
    method: str = "auto",
    chunk_bytes: int = COUNT_CHUNK_BYTES,
    progress: Progress | None = None,
    prefetch_chunks: int = 32,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Counts (int64 [vocab_size]) of the trainable tokens of the synth records, and stats.

    ``method``: "fast", "json" or "auto" (fast when msgspec and numba are there).
    ``prefetch_chunks``: decompressed chunks read ahead by a background thread (0: no thread).
    """
    if method not in COUNT_METHODS:
        raise ValueError(f"method must be one of {COUNT_METHODS}, got {method!r}")
    tools = _fast_tools() if method in ("auto", "fast") else None
    if method == "fast" and tools is None:
        raise RuntimeError("the fast way needs msgspec and numba")
    tally = _Tally(vocab_size)
    chunks = iter_line_chunks(records_path, chunk_bytes, progress)
    if prefetch_chunks > 0:
        # zstd releases the GIL: decompression overlaps with the parsing. (A third thread for
        # the numba step was measured too: slower on two cores.)
        chunks = prefetch(chunks, prefetch_chunks)
    for chunk in chunks:
        if tools is None or not _count_decoded(
            _decode_chunk(chunk, tools), seq_length, tally, tools
        ):
            _count_chunk_exact(chunk, seq_length, tally)
    stats = tally.summary()
    stats["method"] = "fast" if tools is not None else "json"
    return tally.counts, stats


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
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
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
    records_path: str | os.PathLike,
    target_json: str | os.PathLike,
    d2t_out: str | os.PathLike,
    t2d_out: str | os.PathLike,
    freq_out: str | os.PathLike,
    coverage_out: str | os.PathLike,
    plot_out: str | os.PathLike,
    draft_vocab_size: int | str,
    target_coverage: float,
    seq_length: int,
    method: str = "auto",
) -> dict[str, Any]:
    """The stage: count, choose K, write the map, the counts, coverage.json and the plot."""
    vocab_size = int(read_json(target_json)["architecture"]["vocab_size"])
    records_path = Path(records_path)
    progress = Progress(
        records_path.stat().st_size, "vocab: counting tokens", unit="bytes", every_s=30, logger=log
    )
    counts, count_stats = count_tokens(
        records_path, vocab_size, seq_length, method=method, progress=progress
    )
    if count_stats["tokens_counted"] == 0:
        raise ValueError(f"no trainable tokens in {records_path}: {count_stats}")
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
        "seq_length": seq_length,
        "counting": count_stats,
        "provenance": provenance(
            {
                "draft_vocab_size": draft_vocab_size,
                "target_coverage": target_coverage,
                "seq_length": seq_length,
            },
            {"records": records_path, "target": target_json},
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
