"""Throughput of the vocab stage's token counting, end to end (zstd + JSON parsing + counting).

    .venv/bin/python benchmarks/vocab_count_throughput.py --tokens 20000000

Makes (once, then reuses) a synthetic synth.jsonl.zst shaped like the synth stage's output:
rows with a prompt of 32-2048 and a completion of 128-4096 tokens (log-uniform), ids drawn
Zipf-Mandelbrot-like over a 163840-token vocabulary (Kimi's size) and scattered over the id
range by a fixed permutation (so most ids have 5-6 digits, as in a real BPE vocabulary), plus
the text fields (messages, content: ~4 characters per token). Then it counts the completion
tokens with each approach below, checks that all agree with the library's exact way, and prints
tokens/s side by side:

  decompress only   zstd + splitting into lines, no parsing: the ceiling
  json              stdlib json per line (the library's exact way, eagle3_pipeline.vocab)
  msgspec-list      msgspec decodes the id arrays into Python lists, numpy bincount
  polars-ndjson     polars' NDJSON reader on each decompressed chunk (list columns), bincount
  pyarrow-json      pyarrow.json.read_json on each chunk (explicit schema), bincount
  msgspec-raw+np    msgspec hands over the raw array bytes, numpy.fromstring parses the digits
  fast              the library's fast way: msgspec raw arrays + a numba kernel, zstd in a
                    background thread (2 threads)
  fast (1 thread)   the same without the background decompression thread
  fast (3 threads)  the same with msgspec in a third thread (the numba step releases the GIL)

Tokens/s counts completion tokens counted (the benchmark's seq_length keeps them all), per wall
second; "tok/CPU-s" divides by the process CPU time instead: the speed of one free core, less
sensitive to other load on a shared machine (below the wall speed when threads overlap, as their
CPU seconds add up). The load average is printed before and after: on a busy machine the wall
numbers drop.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from eagle3_pipeline import fileio, vocab  # noqa: E402
from eagle3_pipeline.prepare import iter_line_chunks, truncate_lengths  # noqa: E402

VOCAB = 163840


# ------------------------------------------------------------------------------------------
# Corpus
# ------------------------------------------------------------------------------------------


def make_corpus(path: Path, tokens: int, seed: int) -> dict:
    """Write rows until ``tokens`` completion tokens; return a summary (kept beside the file)."""
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, VOCAB + 1, dtype=np.float64)
    p = 1.0 / (ranks + 2.7) ** 1.07
    cdf = np.cumsum(p / p.sum())
    perm = rng.permutation(VOCAB)
    words = (
        "the of and to in is that for it as with was on be by this are or an which "
        "model token function return value data number example because however "
        "\\n def class import print"
    ).split()
    text = " ".join(rng.choice(words, 500_000))
    summary = {"rows": 0, "completion_tokens": 0, "prompt_tokens": 0}

    def rows():
        i = 0
        while summary["completion_tokens"] < tokens:
            n_p = int(np.exp(rng.uniform(np.log(32), np.log(2048))))
            n_c = int(np.exp(rng.uniform(np.log(128), np.log(4096))))
            ids = perm[np.searchsorted(cdf, rng.random(n_p + n_c))].tolist()
            o = int(rng.integers(0, len(text) - 4 * (n_p + n_c)))
            yield {
                "id": f"bench-{i}",
                "source": "bench",
                "messages": [
                    {"role": "system", "content": "You are helpful."},
                    {"role": "user", "content": text[o : o + 4 * n_p]},
                ],
                "prompt_token_ids": ids[:n_p],
                "completion_token_ids": ids[n_p:],
                "content": text[o + 4 * n_p : o + 4 * (n_p + n_c)],
                "reasoning": None,
                "finish_reason": "stop",
                "latency_s": 1.25,
            }
            summary["rows"] += 1
            summary["completion_tokens"] += n_c
            summary["prompt_tokens"] += n_p
            i += 1

    t0 = time.perf_counter()
    fileio.write_jsonl_zst(path, rows())
    summary.update(
        seed=seed,
        target_tokens=tokens,
        bytes=path.stat().st_size,
        seconds=round(time.perf_counter() - t0, 1),
    )
    fileio.write_json(path.with_suffix(".json"), summary)
    return summary


def corpus(args) -> tuple[Path, dict]:
    default = f"/tmp/eagle3-vocab-bench/synth-{args.tokens}-s{args.seed}.jsonl.zst"
    path = Path(args.corpus or default)
    meta = path.with_suffix(".json")
    if path.exists() and meta.exists():
        return path, fileio.read_json(meta)
    print(f"writing corpus {path} ({args.tokens:,} completion tokens) ...", flush=True)
    return path, make_corpus(path, args.tokens, args.seed)


# ------------------------------------------------------------------------------------------
# Approaches. Each returns int64 counts [VOCAB] of the completion tokens after truncation.
# The alternatives assume well-formed rows (the corpus is); the library's ways check rows.
# ------------------------------------------------------------------------------------------


def decompress_only(path, seq_length, chunk_bytes):
    n = 0
    for chunk in vocab.prefetch(iter_line_chunks(path, chunk_bytes), 32):
        n += chunk.count(b"\n")
    return None


def lib_json(path, seq_length, chunk_bytes):
    return vocab.count_tokens(path, VOCAB, seq_length, method="json", chunk_bytes=chunk_bytes)[0]


def lib_fast(path, seq_length, chunk_bytes):
    return vocab.count_tokens(path, VOCAB, seq_length, method="fast", chunk_bytes=chunk_bytes)[0]


def lib_fast_1thread(path, seq_length, chunk_bytes):
    return vocab.count_tokens(
        path, VOCAB, seq_length, method="fast", chunk_bytes=chunk_bytes, prefetch_chunks=0
    )[0]


def fast_3threads(path, seq_length, chunk_bytes):
    """The fast way with the msgspec step in a thread of its own as well (not what the library
    does: measured slower on two cores)."""
    tools = vocab._fast_tools()
    tally = vocab._Tally(VOCAB)
    chunks = vocab.prefetch(iter_line_chunks(path, chunk_bytes), 32)
    decoded_chunks = ((c, vocab._decode_chunk(c, tools)) for c in chunks)
    for chunk, decoded in vocab.prefetch(decoded_chunks, 32):
        if not vocab._count_decoded(decoded, seq_length, tally, tools):
            vocab._count_chunk_exact(chunk, seq_length, tally)
    return tally.counts


def _bincount_rows(prompt_lens, completions, seq_length, counts):
    _, keep = truncate_lengths(
        np.asarray(prompt_lens), np.array([len(c) for c in completions]), seq_length
    )
    ids = np.concatenate([np.asarray(c[:k], dtype=np.int64) for c, k in zip(completions, keep)])
    counts += np.bincount(ids, minlength=VOCAB)


def msgspec_list(path, seq_length, chunk_bytes):
    import msgspec

    row = msgspec.defstruct(
        "Row", [("prompt_token_ids", list[int]), ("completion_token_ids", list[int])]
    )
    dec = msgspec.json.Decoder(row)
    counts = np.zeros(VOCAB, dtype=np.int64)
    for chunk in vocab.prefetch(iter_line_chunks(path, chunk_bytes), 32):
        rows = dec.decode_lines(chunk)
        _bincount_rows(
            [len(r.prompt_token_ids) for r in rows],
            [r.completion_token_ids for r in rows],
            seq_length,
            counts,
        )
    return counts


def _count_lists(n_prompt, completion_col, seq_length, counts):
    """completion_col: an Arrow/polars-like list column given as (offsets, values)."""
    offsets, values = completion_col
    n_c = np.diff(offsets)
    _, keep = truncate_lengths(n_prompt, n_c, seq_length)
    if (keep == n_c).all():
        ids = values[offsets[0] : offsets[-1]]
    else:
        pos = np.arange(offsets[-1] - offsets[0]) - np.repeat(offsets[:-1] - offsets[0], n_c)
        ids = values[offsets[0] : offsets[-1]][pos < np.repeat(keep, n_c)]
    counts += np.bincount(ids, minlength=VOCAB)


def polars_ndjson(path, seq_length, chunk_bytes):
    import io

    import polars as pl

    schema = {"prompt_token_ids": pl.List(pl.Int64), "completion_token_ids": pl.List(pl.Int64)}
    counts = np.zeros(VOCAB, dtype=np.int64)
    for chunk in vocab.prefetch(iter_line_chunks(path, chunk_bytes), 32):
        df = pl.read_ndjson(io.BytesIO(chunk), schema=schema)
        n_prompt = df["prompt_token_ids"].list.len().to_numpy()
        comp = df["completion_token_ids"].to_arrow()
        _count_lists(
            n_prompt, (np.asarray(comp.offsets), np.asarray(comp.values)), seq_length, counts
        )
    return counts


def pyarrow_json(path, seq_length, chunk_bytes):
    import io

    import pyarrow as pa
    import pyarrow.json as pj

    schema = pa.schema(
        [("prompt_token_ids", pa.list_(pa.int64())), ("completion_token_ids", pa.list_(pa.int64()))]
    )
    parse = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    read = pj.ReadOptions(block_size=max(chunk_bytes, 1 << 20), use_threads=True)
    counts = np.zeros(VOCAB, dtype=np.int64)
    for chunk in vocab.prefetch(iter_line_chunks(path, max(chunk_bytes, 4 << 20)), 4):
        table = pj.read_json(io.BytesIO(chunk), read_options=read, parse_options=parse)
        n_prompt = pa.compute.list_value_length(table["prompt_token_ids"]).to_numpy()
        comp = table["completion_token_ids"].combine_chunks()
        _count_lists(
            n_prompt, (np.asarray(comp.offsets), np.asarray(comp.values)), seq_length, counts
        )
    return counts


def msgspec_raw_numpy(path, seq_length, chunk_bytes):
    import msgspec

    row = msgspec.defstruct(
        "Row", [("prompt_token_ids", msgspec.Raw), ("completion_token_ids", msgspec.Raw)]
    )
    dec = msgspec.json.Decoder(row)
    to_commas = bytes.maketrans(b"[]", b" ,")
    counts = np.zeros(VOCAB, dtype=np.int64)
    for chunk in vocab.prefetch(iter_line_chunks(path, chunk_bytes), 32):
        rows = dec.decode_lines(chunk)
        n_prompt = np.array([bytes(r.prompt_token_ids).count(b",") + 1 for r in rows])
        raw = [bytes(r.completion_token_ids) for r in rows]
        n_c = np.array([c.count(b",") + 1 for c in raw])
        values = np.fromstring(b"".join(raw).translate(to_commas), dtype=np.int64, sep=",")
        offsets = np.concatenate([[0], np.cumsum(n_c)])
        _count_lists(n_prompt, (offsets, values), seq_length, counts)
    return counts


APPROACHES = {
    "decompress only": decompress_only,
    "json": lib_json,
    "msgspec-list": msgspec_list,
    "polars-ndjson": polars_ndjson,
    "pyarrow-json": pyarrow_json,
    "msgspec-raw+np": msgspec_raw_numpy,
    "fast (1 thread)": lib_fast_1thread,
    "fast (3 threads)": fast_3threads,
    "fast": lib_fast,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--tokens",
        type=int,
        default=20_000_000,
        help="completion tokens in the corpus (default 20M)",
    )
    ap.add_argument("--corpus", help="corpus path (default /tmp/eagle3-vocab-bench/...)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--seq-length",
        type=int,
        default=8192,
        help="truncation; the default keeps every completion token",
    )
    ap.add_argument("--chunk-bytes", type=int, default=vocab.COUNT_CHUNK_BYTES)
    ap.add_argument("--repeat", type=int, default=3, help="runs per approach (best and median)")
    ap.add_argument("--only", nargs="*", choices=list(APPROACHES), help="run only these")
    ap.add_argument("--json-out", help="also write the results here")
    args = ap.parse_args()

    path, meta = corpus(args)
    print(
        f"corpus: {path} ({meta['bytes'] / 1e6:.0f} MB zstd, {meta['rows']:,} rows, "
        f"{meta['completion_tokens']:,} completion + {meta['prompt_tokens']:,} prompt tokens)"
    )
    t0 = time.perf_counter()
    tools_ok = vocab.fast_available()
    print(
        f"msgspec+numba available: {tools_ok} (import + JIT/cache load "
        f"{time.perf_counter() - t0:.2f} s, not timed below)"
    )
    load_start = os.getloadavg()[0]
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"load average {load_start:.2f} at start"
    )

    reference, ref_stats = vocab.count_tokens(
        path, VOCAB, args.seq_length, method="fast" if tools_ok else "json"
    )
    tokens = ref_stats["tokens_counted"]
    names = args.only or list(APPROACHES)
    results = []
    header = (
        f"{'approach':18s} {'best tok/s':>12s} {'median tok/s':>13s} {'tok/CPU-s':>11s} "
        f"{'best s':>7s}  check"
    )
    print(
        f"\ncounting {tokens:,} tokens, seq_length {args.seq_length}, chunks of "
        f"{args.chunk_bytes // 1024} KiB, best of {args.repeat}\n{header}\n{'-' * len(header)}"
    )
    for name in names:
        fn = APPROACHES[name]
        if name.startswith("fast") and not tools_ok:
            continue
        walls, cpus, check = [], [], "-"
        for _ in range(args.repeat):
            c0, w0 = time.process_time(), time.perf_counter()
            try:
                counts = fn(path, args.seq_length, args.chunk_bytes)
            except ImportError as exc:
                check = f"skipped ({exc.name} missing)"
                break
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
            if counts is not None:
                check = "same counts" if np.array_equal(counts, reference) else "DIFFERENT"
        if not walls:
            print(f"{name:18s} {check}")
            continue
        best, med, cpu = min(walls), statistics.median(walls), min(cpus)
        row = {
            "approach": name,
            "best_tok_s": tokens / best,
            "median_tok_s": tokens / med,
            "tok_per_cpu_s": tokens / cpu,
            "best_s": best,
            "check": check,
        }
        results.append(row)
        print(
            f"{name:18s} {tokens / best / 1e6:10.1f} M {tokens / med / 1e6:11.1f} M "
            f"{tokens / cpu / 1e6:9.1f} M {best:7.2f}  {check}",
            flush=True,
        )
    load_end = os.getloadavg()[0]
    print(f"\nload average at end {load_end:.2f}")
    if args.json_out:
        fileio.write_json(
            args.json_out,
            {
                "corpus": meta | {"path": str(path)},
                "tokens": tokens,
                "seq_length": args.seq_length,
                "chunk_bytes": args.chunk_bytes,
                "cpus": os.cpu_count(),
                "load_average": [load_start, load_end],
                "results": results,
            },
        )


if __name__ == "__main__":
    main()
