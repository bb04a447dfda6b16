"""Throughput of the vocab stage's token counting: the loss-masked tokens of prepare's data set.

    .venv/bin/python benchmarks/vocab_count_throughput.py --tokens 20000000 \
        --out benchmarks/results/efficiency/vocab_count_throughput.json

Makes (once, then reuses, under /tmp) a synthetic synth.jsonl.zst shaped like the synth stage's
output - prompts of 32-2048 and completions of 128-4096 tokens (log-uniform), ids drawn
Zipf-Mandelbrot-like over a 163840-token vocabulary (Kimi's size) - and turns it into the
training data set with the prepare stage itself (``prepare.build_dataset``, seq_length 8192, so
nothing is truncated). Then it runs the stage's counter, ``vocab.count_tokens`` (read the Arrow
file memory mapped, masked bincount), ``--repeat`` times and checks every result against the
counts of the completion ids taken while the corpus was written.

Tokens/s counts the loss-masked (completion) tokens per wall second; "tok/CPU-s" divides by the
process CPU time instead (less sensitive to other load on a shared machine). The first run
includes importing pyarrow and reading the file from disk if it is not in the page cache.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from eagle3_lab.results import write_result
from eagle3_pipeline.prepare import stage as prepare
from eagle3_pipeline.runtime import files as fileio
from eagle3_pipeline.vocab import stage as vocab

VOCAB = 163840
SEQ_LENGTH = 8192
GOAL_TOKENS_PER_S = 20e6


def make_corpus(records: Path, tokens: int, seed: int) -> dict:
    """Write synth records until ``tokens`` completion tokens; return a summary. The expected
    counts (every completion id once) go beside the file."""
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, VOCAB + 1, dtype=np.float64)
    p = 1.0 / (ranks + 2.7) ** 1.07
    cdf = np.cumsum(p / p.sum())
    perm = rng.permutation(VOCAB)  # frequent ids scattered over the range, as in a BPE vocab
    expected = np.zeros(VOCAB, dtype=np.int64)
    summary = {"rows": 0, "completion_tokens": 0, "prompt_tokens": 0}

    def rows():
        while summary["completion_tokens"] < tokens:
            n_p = int(np.exp(rng.uniform(np.log(32), np.log(2048))))
            n_c = int(np.exp(rng.uniform(np.log(128), np.log(4096))))
            ids = perm[np.searchsorted(cdf, rng.random(n_p + n_c))]
            expected[:] += np.bincount(ids[n_p:], minlength=VOCAB)
            yield {
                "id": f"bench-{summary['rows']}",
                "source": "bench",
                "messages": [{"role": "user", "content": "x"}],
                "prompt_token_ids": ids[:n_p].tolist(),
                "completion_token_ids": ids[n_p:].tolist(),
                "content": "",
                "reasoning": None,
                "finish_reason": "stop",
                "latency_s": 1.0,
            }
            summary["rows"] += 1
            summary["completion_tokens"] += n_c
            summary["prompt_tokens"] += n_p

    fileio.write_jsonl_zst(records, rows())
    np.save(records.with_suffix(".expected.npy"), expected)
    return summary


def dataset(args) -> tuple[Path, np.ndarray, dict]:
    """The prepared data set (built once), the expected counts and the corpus summary."""
    base = Path(args.work) / f"vocab-bench-{args.tokens}-s{args.seed}"
    records, ds_dir, meta = base / "synth.jsonl.zst", base / "dataset", base / "corpus.json"
    if not meta.exists():
        base.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        print(f"writing {records} ({args.tokens:,} completion tokens) ...", flush=True)
        summary = make_corpus(records, args.tokens, args.seed)
        t1 = time.perf_counter()
        print("building the data set with prepare.build_dataset ...", flush=True)
        stats = prepare.build_dataset(records, ds_dir, base / "prepare.json", SEQ_LENGTH, 0)
        assert stats["tokens_trainable"] == summary["completion_tokens"], "nothing truncated"
        summary.update(
            write_s=round(t1 - t0, 1),
            prepare_s=round(time.perf_counter() - t1, 1),
            dataset_bytes=sum(f.stat().st_size for f in ds_dir.iterdir()),
        )
        fileio.write_json(meta, summary)
    return ds_dir, np.load(records.with_suffix(".expected.npy")), fileio.read_json(meta)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=20_000_000, help="completion tokens at least")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=5, help="counting runs (best and median)")
    ap.add_argument("--work", default="/tmp", help="where the corpus and data set are kept")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()

    ds_dir, expected, corpus = dataset(args)
    load_before = os.getloadavg()
    runs = []
    for _ in range(args.repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        counts, stats = vocab.count_tokens(ds_dir, VOCAB)
        runs.append((time.perf_counter() - w0, time.process_time() - c0))
        assert np.array_equal(counts, expected), "counts differ from the corpus' completion ids"
    tokens = stats["tokens_counted"]
    walls = [w for w, _ in runs]
    result = {
        "tokens_counted": tokens,
        "tokens_total": stats["tokens_total"],
        "rows": stats["rows"],
        "first_run_tok_s": tokens / walls[0],
        "best_tok_s": tokens / min(walls),
        "median_tok_s": tokens / statistics.median(walls),
        "tok_per_cpu_s": tokens / min(c for _, c in runs),
        "goal_tok_s": GOAL_TOKENS_PER_S,
        "meets_goal": tokens / statistics.median(walls) >= GOAL_TOKENS_PER_S,
        "runs_wall_s": [round(w, 4) for w in walls],
        "corpus": corpus,
        "loadavg_before_after": [load_before, os.getloadavg()],
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "args": vars(args),
    }
    print(
        f"{tokens:,} loss-masked tokens of {stats['tokens_total']:,} in {stats['rows']:,} rows "
        f"({corpus['dataset_bytes'] / 2**20:,.0f} MiB of Arrow)\n"
        f"first run {result['first_run_tok_s'] / 1e6:7.1f} M tok/s\n"
        f"best      {result['best_tok_s'] / 1e6:7.1f} M tok/s\n"
        f"median    {result['median_tok_s'] / 1e6:7.1f} M tok/s  (goal >= 20 M tok/s: "
        f"{'met' if result['meets_goal'] else 'NOT met'})\n"
        f"per CPU-s {result['tok_per_cpu_s'] / 1e6:7.1f} M tok/s\n"
        f"load average before/after: {load_before[0]:.2f} / {os.getloadavg()[0]:.2f}"
    )
    if args.out:
        write_result(args.out, result)


if __name__ == "__main__":
    main()
