"""Training rows for speculators from the synth records (stage ``prepare``).

One synth record becomes one training row::

    input_ids = prompt_token_ids + completion_token_ids      (exactly as stored by synth)
    loss_mask = [0] * len(prompt_token_ids) + [1] * len(completion_token_ids)

truncated to ``seq_length`` tokens (and, with ``cut_loops: n``, cut where the completion first
repeats an n-gram of its own: see :func:`loop_start`). Only the completion is trained: it is the
one part of the sequence the target model generated itself. In a multi-turn record the stored
prompt also holds earlier assistant turns, but those came from the prompt source (a data set), not
from the target, so they are context, never training targets - training on them would teach the
drafter to predict some other model's answers. (With ``synth.context: on_policy`` they are the
target's own earlier answers, trained in the records of their own turns where the pool has
them.) System and user turns and the chat template tokens are context for the same reason.

A row is dropped, and counted by reason in ``stats.json``, when it is malformed (see
:func:`check_record`) or when no trainable token survives truncation (the prompt alone fills
``seq_length``). The ``vocab`` stage counts the loss-masked tokens of this data set itself
(:func:`read_batches`), so its counts are exactly the tokens trained on.

The data set is an HF Arrow data set (``datasets.save_to_disk``) in the layout
``speculators.train.data.ArrowDataset`` reads: columns ``input_ids`` and ``loss_mask``
(int64 lists), ``seq_len`` (int64), ``sample_id`` (the synth record id), torch format. Rows are
shuffled with ``seed``; row ``i`` is hidden-state sample ``i`` of the extract stage.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ..runtime import Progress
from ..runtime.files import (
    iter_lines,
    remove_stale_temporaries,
    sha256_file,
    stable_hash,
    temporary_path,
    write_json,
)
from ..runtime.provenance import provenance
from ..stats import percentiles

log = logging.getLogger(__name__)

PROMPT_KEY = "prompt_token_ids"
COMPLETION_KEY = "completion_token_ids"
# Token ids must fit the int64 columns and any real vocabulary; larger ones are malformed.
MAX_TOKEN_ID = 2**31 - 1
# Rows per Arrow record batch while writing (bounded memory: a batch of rows, not the data set).
WRITE_BATCH_ROWS = 1024


# --------------------------------------------------------------------------------------------
# Row logic
# --------------------------------------------------------------------------------------------


def check_record(rec: Any) -> tuple[list[int], list[int]] | str:
    """``(prompt_ids, completion_ids)`` of a synth record, or the reason it is malformed.

    Valid: a JSON object with a string ``id`` and non-empty lists of integer token ids
    (not booleans) in ``[0, MAX_TOKEN_ID]`` for both ``prompt_token_ids`` and
    ``completion_token_ids``.
    """
    if not isinstance(rec, dict):
        return "not_an_object"
    if not isinstance(rec.get("id"), str):
        return "missing_id"
    out = []
    for key in (PROMPT_KEY, COMPLETION_KEY):
        ids = rec.get(key)
        if not isinstance(ids, list):
            return f"missing_{key}"
        if not ids:
            return f"empty_{key}"
        # `type(t) is int` rejects bool (a subclass of int) and floats such as 3.0.
        if any(type(t) is not int for t in ids):
            return "non_int_token_ids"
        if min(ids) < 0 or max(ids) > MAX_TOKEN_ID:
            return "token_id_out_of_range"
        out.append(ids)
    return out[0], out[1]


def truncate_lengths(n_prompt, n_completion, seq_length: int):
    """``(seq_len, n_trainable)`` of rows after truncation to ``seq_length`` tokens.

    Works element-wise on numpy arrays as well as on ints. The row keeps its first
    ``seq_len`` tokens; its trainable tokens are the first ``n_trainable`` completion tokens.
    A row with ``n_trainable == 0`` is dropped.
    """
    seq_len = np.minimum(np.asarray(n_prompt) + np.asarray(n_completion), seq_length)
    n_trainable = np.maximum(seq_len - np.asarray(n_prompt), 0)
    return seq_len, n_trainable


NO_TRAINABLE = "no_trainable_tokens"


def loop_start(ids: list[int], n: int) -> int | None:
    """Where ``ids`` starts repeating itself: the start of the first n-gram that already
    occurred earlier in ``ids`` (None when none does). A small target decoding greedily often
    falls into a loop and repeats it until ``max_tokens``; a drafter trained on that learns to
    copy, and its validation accuracy then overstates what it does on real text."""
    seen: set[tuple[int, ...]] = set()
    for end in range(n, len(ids) + 1):
        gram = tuple(ids[end - n : end])
        if gram in seen:
            return end - n
        seen.add(gram)
    return None


class Row(NamedTuple):
    """A training row before it is written: ``(prompt + completion)[:seq_len]``, with the first
    ``n_trainable`` completion tokens trained; ``loop_cut``: completion tokens cut off as a
    loop (:func:`loop_start`)."""

    sample_id: str
    prompt: list[int]
    completion: list[int]
    seq_len: int
    n_trainable: int
    loop_cut: int = 0


def row_of_line(line: str, seq_length: int, cut_loops: int | None = None) -> Row | str | None:
    """The training :class:`Row` of one synth record line, why it is dropped (``invalid_json``,
    a :func:`check_record` reason, or ``no_trainable_tokens``), or None for a blank line.
    ``cut_loops``: n-gram length at which a repeating completion is cut (None: never)."""
    if not line.strip():
        return None
    try:
        rec = json.loads(line)
    except ValueError:
        return "invalid_json"
    checked = check_record(rec)
    if isinstance(checked, str):
        return checked
    prompt, completion = checked
    cut = loop_start(completion, cut_loops) if cut_loops else None
    loop_cut = 0 if cut is None else len(completion) - cut
    if loop_cut:
        completion = completion[:cut]
    seq_len, n_trainable = truncate_lengths(len(prompt), len(completion), seq_length)
    if n_trainable == 0:
        return NO_TRAINABLE
    return Row(rec["id"], prompt, completion, int(seq_len), int(n_trainable), loop_cut)


def read_batches(dataset_dir: str | os.PathLike) -> Iterator[Any]:
    """The rows of a data set this stage wrote, as pyarrow record batches in row order, memory
    mapped: neither ``datasets`` nor torch (its format) is imported. ``save_to_disk`` lists the
    Arrow stream files in ``state.json`` and writes the rows in dataset order (no index map)."""
    import pyarrow as pa

    dataset_dir = Path(dataset_dir)
    state = json.loads((dataset_dir / "state.json").read_text())
    for entry in state["_data_files"]:
        with pa.memory_map(str(dataset_dir / entry["filename"])) as source:
            yield from pa.ipc.open_stream(source)


# --------------------------------------------------------------------------------------------
# The stage
# --------------------------------------------------------------------------------------------


def _arrow_schema():
    import datasets

    features = datasets.Features(
        {
            "input_ids": datasets.List(datasets.Value("int64")),
            "loss_mask": datasets.List(datasets.Value("int64")),
            "seq_len": datasets.Value("int64"),
            "sample_id": datasets.Value("string"),
        }
    )
    return features.arrow_schema


def _write_rows(
    records_path: Path, arrow_path: Path, seq_length: int, cut_loops: int | None = None
) -> dict[str, Any]:
    """Stream valid, truncated rows into an Arrow stream file; return the counts."""
    import pyarrow as pa

    schema = _arrow_schema()
    dropped: Counter[str] = Counter()
    rows_in = truncated = tokens_trainable = loops_cut = loop_tokens = 0
    seq_lens: list[np.ndarray] = []
    batch: dict[str, list] = {name: [] for name in schema.names}
    progress = Progress(
        records_path.stat().st_size, "prepare: synth records", unit="bytes", every_s=30, logger=log
    )

    def flush(writer) -> None:
        if not batch["seq_len"]:
            return
        writer.write_batch(pa.record_batch(batch, schema=schema))
        seq_lens.append(np.asarray(batch["seq_len"], dtype=np.int64))
        for v in batch.values():
            v.clear()

    with pa.OSFile(str(arrow_path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        # errors="replace": a line that is not UTF-8 is counted as invalid_json, not fatal
        for line in iter_lines(records_path, progress.update, errors="replace"):
            row = row_of_line(line, seq_length, cut_loops)
            if row is None:
                continue
            rows_in += 1
            if isinstance(row, str):
                dropped[row] += 1
                continue
            truncated += len(row.prompt) + len(row.completion) > row.seq_len
            loops_cut += row.loop_cut > 0
            loop_tokens += row.loop_cut
            tokens_trainable += row.n_trainable
            batch["input_ids"].append((row.prompt + row.completion)[: row.seq_len])
            batch["loss_mask"].append([0] * len(row.prompt) + [1] * row.n_trainable)
            batch["seq_len"].append(row.seq_len)
            batch["sample_id"].append(row.sample_id)
            if len(batch["seq_len"]) >= WRITE_BATCH_ROWS:
                flush(writer)
        flush(writer)

    lens = np.concatenate(seq_lens) if seq_lens else np.zeros(0, dtype=np.int64)
    return {
        "rows_in": rows_in,
        "rows_kept": len(lens),
        "rows_dropped": int(sum(dropped.values())),
        "dropped_by_reason": dict(sorted(dropped.items())),
        "rows_truncated": int(truncated),
        "tokens_total": int(lens.sum()),
        "tokens_trainable": int(tokens_trainable),
        "loops_cut": {"ngram": cut_loops, "rows": loops_cut, "tokens": loop_tokens},
        "seq_len": percentiles(lens, (0, 5, 25, 50, 75, 95, 99, 100)),
    }


def build_dataset(
    records_path: str | os.PathLike,
    dataset_dir: str | os.PathLike,
    stats_out: str | os.PathLike,
    seq_length: int,
    seed: int,
    cut_loops: int | None = None,
) -> dict[str, Any]:
    """Build the shuffled training data set from the synth records; return the stats.

    Built in a temporary directory beside ``dataset_dir`` and renamed into place at the end,
    so ``dataset_dir`` is either absent or complete.
    """
    import datasets

    records_path, dataset_dir = Path(records_path), Path(dataset_dir)
    if seq_length < 1:
        raise ValueError(f"seq_length must be >= 1, got {seq_length}")
    dataset_dir.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(dataset_dir)
    tmp = temporary_path(dataset_dir)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        stats = _write_rows(records_path, tmp / "rows.arrow", seq_length, cut_loops)
        if stats["rows_kept"] == 0:
            raise ValueError(
                f"no training rows left from {records_path} ({stats['rows_in']} records, "
                f"dropped by reason: {stats['dropped_by_reason']})"
            )
        log.info(
            "prepare: %d of %d rows kept (%s dropped), %d trainable of %d tokens",
            stats["rows_kept"],
            stats["rows_in"],
            stats["dropped_by_reason"],
            stats["tokens_trainable"],
            stats["tokens_total"],
        )
        bars = datasets.is_progress_bar_enabled()
        datasets.disable_progress_bars()  # tqdm bars make unreadable job logs
        try:
            ds = datasets.Dataset.from_file(str(tmp / "rows.arrow"))
            # datasets gives a data set loaded from a file a random fingerprint, which lands in
            # state.json: a fingerprint of the content keeps the output byte-identical for
            # identical inputs (a re-run then looks unchanged to everything downstream).
            content = stable_hash({"rows": sha256_file(tmp / "rows.arrow"), "seed": seed})
            ds = ds.shuffle(
                seed=seed,
                indices_cache_file_name=str(tmp / "shuffle-indices.arrow"),
                new_fingerprint=content,
            )
            # speculators' preprocessing saves its data sets in torch format; ArrowDataset relies
            # on it (`self.data[i]["input_ids"]` is compared with torch.equal).
            ds.set_format(type="torch")
            ds.save_to_disk(str(tmp / "dataset"))
            del ds
        finally:
            if bars:
                datasets.enable_progress_bars()
        if dataset_dir.exists():
            shutil.rmtree(dataset_dir)
        os.replace(tmp / "dataset", dataset_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    stats["seq_length"] = seq_length
    stats["seed"] = seed
    stats["provenance"] = provenance(
        {"seq_length": seq_length, "seed": seed, "cut_loops": cut_loops},
        {"records": records_path},
    )
    write_json(stats_out, stats)
    return stats
