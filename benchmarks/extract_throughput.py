"""Extraction throughput vs bare prefill on the same engine settings.

    .venv/bin/python benchmarks/extract_throughput.py --dataset results/default/prepare/dataset \
        --rows 64 --concurrency 8

(a) bare prefill: a vLLM server without capture answers each row's token ids as a 1-token
completion (what extraction costs at the least); (b) extraction: a server with the
extract_hidden_states method and the pipeline's connector, driven by the extract stage's client
(verification, next-token probe, checksums, shard journal); (c) on that same server, a minimal
client that only fetches each file and deletes it, in alternating rounds with (b): (c)/(a) is
what vLLM's capture costs, (b)/(c) what the pipeline's client adds. Prefix caching is off so
repeated rounds measure the same work. Prompt tokens/s of each, median over rounds, and the
ratios (goal (b)/(a) >= 0.90) are printed; server start-up is excluded.
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

from eagle3_pipeline import config as cfglib
from eagle3_pipeline import extract, target
from eagle3_pipeline.dummy_models import DUMMY_SHAPES, dummy_target
from eagle3_pipeline.provenance import package_versions
from eagle3_pipeline.runtime import Progress, setup_logging
from eagle3_pipeline.server import VllmServer
from eagle3_pipeline.serving import spec_from_config


async def minimal_client(base_url: str, model: str, rows: list[list[int]], concurrency: int):
    import fcntl
    import os

    import openai
    from speculators.data_generation.vllm_client import generate_hidden_states_async

    def fetch(path: str) -> None:
        with open(path + ".lock") as lf:
            fcntl.flock(lf, fcntl.LOCK_SH)
        os.unlink(path + ".lock")
        os.unlink(path)

    sem = asyncio.Semaphore(concurrency)
    async with openai.AsyncOpenAI(base_url=base_url, api_key="EMPTY", max_retries=0) as c:

        async def one(ids):
            async with sem:
                path, _ = await generate_hidden_states_async(c, model, {"input_ids": ids})
                await asyncio.to_thread(fetch, path)

        await asyncio.gather(*(one(r) for r in rows))


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
    ap.add_argument("--positions", type=int, help="extract.agreement_positions_per_sample")
    ap.add_argument(
        "--config", help="a pipeline config whose vllm section to use (e.g. config/gpu.yaml)"
    )
    ap.add_argument(
        "--dummy-shape",
        choices=sorted(DUMMY_SHAPES),
        help="serve a model of this shape with random weights (vLLM load_format dummy) instead "
        "of --target: the prefill of a real 8B target, the tokens of the dataset",
    )
    ap.add_argument(
        "--gpu-memory-utilization",
        help="override the config's share of GPU memory (an 8B target needs more than the "
        "135M configs leave it)",
    )
    ap.add_argument("--out")
    args = ap.parse_args()
    setup_logging(None)
    from datasets import load_from_disk

    info = target.load_info(args.target)
    extra = ["--no-enable-prefix-caching"]
    if args.dummy_shape:
        info = dummy_target(args.dummy_shape, Path(info["model_path"]), Path(tempfile.mkdtemp()))
        extra += ["--load-format", "dummy"]
    if args.gpu_memory_utilization:  # vLLM takes the last of repeated flags
        extra += ["--gpu-memory-utilization", args.gpu_memory_utilization]
    ds = load_from_disk(args.dataset).with_format(None).select(range(args.rows))
    rows = ds["input_ids"]
    tokens = sum(len(r) for r in rows)
    base = cfglib.load(args.config) if args.config else cfglib.validate({})
    cfg = cfglib.validate(
        {
            "vllm": base["vllm"],
            "extract": {"concurrency": args.concurrency, "storage": args.storage},
        }
    )
    if args.positions:
        cfg["extract"]["agreement_positions_per_sample"] = args.positions
    if args.omp_threads:
        cfg["vllm"]["env"]["OMP_NUM_THREADS"] = args.omp_threads
    rates = {"bare": [], "extract": [], "minimal": []}

    spec = spec_from_config(cfg["vllm"], info["model_path"], extra_args=extra)
    with VllmServer(spec, Path(tempfile.gettempdir()) / "extract-bench-bare.log") as s:
        asyncio.run(bare_prefill(s.base_url, s.model_name, rows[:2], 1))  # warm-up
        for _ in range(args.rounds):
            t0 = time.monotonic()
            asyncio.run(bare_prefill(s.base_url, s.model_name, rows, args.concurrency))
            rates["bare"].append(tokens / (time.monotonic() - t0))
            print(f"bare prefill  {rates['bare'][-1]:9.1f} tok/s", flush=True)

    arch = info["architecture"]
    _, captured, final = extract.resolve_layers(cfg["extract"], arch)
    with tempfile.TemporaryDirectory() as tmp:
        staging = Path(tmp) / "staging"
        spec = extract.server_spec(cfg["vllm"], info, [*captured, final], staging, cfg["extract"])
        spec.extra_args += extra
        probe = extract.NextTokenProbe(info["model_path"], arch)

        def full(server, r: int, todo: list[int]) -> float:
            root = Path(tmp) / f"hs{r}"
            book = extract.ShardBook(root, 64, range(args.rows))
            ex = extract.Extractor(
                ds, book, probe, [*captured, final], arch["hidden_size"], cfg["extract"], staging
            )
            t0 = time.monotonic()
            asyncio.run(
                ex.run(
                    server.base_url,
                    server.model_name,
                    todo,
                    Progress(len(todo), "extraction round", every_s=1e9),
                    server.check_alive,
                )
            )
            dt = time.monotonic() - t0
            print("  client seconds per phase:", {k: round(v, 2) for k, v in ex.timings.items()})
            book.close()
            shutil.rmtree(root)
            return dt

        with VllmServer(spec, Path(tempfile.gettempdir()) / "extract-bench-capture.log") as s:
            full(s, 0, [0, 1])  # warm-up
            # alternate the two clients (full, minimal, minimal, full, ...) against drift
            order = (["full", "minimal", "minimal", "full"] * args.rounds)[: 2 * args.rounds]
            for r, which in enumerate(order, start=1):
                t0 = time.monotonic()
                if which == "full":
                    full(s, r, list(range(args.rows)))
                    key, label = "extract", "extraction   "
                else:
                    asyncio.run(minimal_client(s.base_url, s.model_name, rows, args.concurrency))
                    key, label = "minimal", "capture only "
                rates[key].append(tokens / (time.monotonic() - t0))
                print(f"{label} {rates[key][-1]:9.1f} tok/s", flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    ratio = med["extract"] / med["bare"]
    print(
        f"\n{args.rows} rows, {tokens} tokens, concurrency {args.concurrency}, medians:\n"
        f"  extraction / bare prefill   {med['extract']:.1f} / {med['bare']:.1f} = {ratio:.3f}"
        " (goal >= 0.90)\n"
        f"  capture only / bare prefill {med['minimal']:.1f} / {med['bare']:.1f} = "
        f"{med['minimal'] / med['bare']:.3f} (what vLLM's capture costs)\n"
        f"  extraction / capture only   {med['extract'] / med['minimal']:.3f} "
        "(what the pipeline's client adds, same server, alternating rounds)"
    )
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "rates": rates,
                    "median": med,
                    "ratio": ratio,
                    "tokens": tokens,
                    "architecture": info["architecture"],
                    "args": vars(args),
                    "vllm": cfg["vllm"],
                    "versions": package_versions(),
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
