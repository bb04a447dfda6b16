"""Extraction throughput vs bare prefill on the same engine settings.

    .venv/bin/python benchmarks/extract_throughput.py --dataset results/default/prepare/dataset \
        --rows 64 --concurrency 8

(a) bare prefill: a vLLM server without capture answers each row's token ids as a 1-token
completion (what extraction costs at the least); (b) extraction: a server with the
extract_hidden_states method and the pipeline's connector, driven by the extract stage's client
(verification, next-token probe, checksums, shard journal). Prefix caching is off on both so
repeated rounds measure the same work. Prompt tokens/s of each, median over rounds, and the
ratio (goal >= 0.90) are printed; server start-up is excluded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from eagle3_pipeline import config as cfglib, extract, target  # noqa: E402
from eagle3_pipeline.runtime import Progress, setup_logging  # noqa: E402
from eagle3_pipeline.server import VllmServer, spec_from_config  # noqa: E402


async def bare_prefill(base_url: str, model: str, rows: list[list[int]], concurrency: int):
    import openai

    sem = asyncio.Semaphore(concurrency)
    async with openai.AsyncOpenAI(base_url=base_url, api_key="EMPTY", max_retries=0) as c:
        async def one(ids):
            async with sem:
                await c.completions.create(model=model, prompt=ids, max_tokens=1)
        await asyncio.gather(*(one(r) for r in rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default=str(REPO / "results/default/prepare/dataset"))
    ap.add_argument("--target", default=str(REPO / "results/default/target/target.json"))
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--storage", default="bf16", choices=["bf16", "fp8"])
    ap.add_argument("--omp-threads", help="OMP_NUM_THREADS for the CPU server")
    ap.add_argument("--out")
    args = ap.parse_args()
    setup_logging(None)
    from datasets import load_from_disk

    info = target.load_info(args.target)
    ds = load_from_disk(args.dataset).with_format(None).select(range(args.rows))
    rows = ds["input_ids"]
    tokens = sum(len(r) for r in rows)
    cfg = cfglib.validate({"extract": {"concurrency": args.concurrency,
                                       "storage": args.storage}})
    if args.omp_threads:
        cfg["vllm"]["env"]["OMP_NUM_THREADS"] = args.omp_threads
    extra = ["--no-enable-prefix-caching"]
    rates = {"bare": [], "extract": []}

    spec = spec_from_config(cfg["vllm"], info["model_path"], extra_args=extra)
    with VllmServer(spec, Path(tempfile.gettempdir()) / "extract-bench-bare.log") as s:
        asyncio.run(bare_prefill(s.base_url, s.model_name, rows[:2], 1))  # warm-up
        for _ in range(args.rounds):
            t0 = time.monotonic()
            asyncio.run(bare_prefill(s.base_url, s.model_name, rows, args.concurrency))
            rates["bare"].append(tokens / (time.monotonic() - t0))
            print(f"bare prefill  {rates['bare'][-1]:9.1f} tok/s", flush=True)

    arch = info["architecture"]
    aux, final = extract.resolve_layers(cfg["extract"], arch)
    with tempfile.TemporaryDirectory() as tmp:
        staging = Path(tmp) / "staging"
        spec = extract.server_spec(cfg["vllm"], info, aux + [final], staging, cfg["extract"])
        spec.extra_args += extra
        probe = extract.NextTokenProbe(info["model_path"], arch)
        with VllmServer(spec, Path(tempfile.gettempdir()) / "extract-bench-capture.log") as s:
            for r in range(args.rounds + 1):  # round 0 warms up
                root = Path(tmp) / f"hs{r}"
                book = extract.ShardBook(root, 64, range(args.rows))
                ex = extract.Extractor(ds, book, probe, aux + [final], arch["hidden_size"],
                                       cfg["extract"], staging)
                todo = list(range(2)) if r == 0 else list(range(args.rows))
                t0 = time.monotonic()
                asyncio.run(ex.run(s.base_url, s.model_name, todo,
                                   Progress(len(todo), "x", every_s=1e9), s.check_alive))
                dt = time.monotonic() - t0
                book.close()
                shutil.rmtree(root)
                if r:
                    rates["extract"].append(tokens / dt)
                    print(f"extraction    {rates['extract'][-1]:9.1f} tok/s "
                          f"(agreement {ex.hits / max(ex.checked, 1):.4f})", flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    ratio = med["extract"] / med["bare"]
    print(f"\n{args.rows} rows, {tokens} tokens, concurrency {args.concurrency}: median "
          f"extraction {med['extract']:.1f} tok/s / bare prefill {med['bare']:.1f} tok/s = "
          f"{ratio:.3f} (goal >= 0.90)")
    if args.out:
        Path(args.out).write_text(json.dumps({"rates": rates, "median": med, "ratio": ratio,
                                              "tokens": tokens, "args": vars(args)}, indent=2))


if __name__ == "__main__":
    main()
