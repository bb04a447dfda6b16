"""Synth client throughput vs a bare async client, same server, prompts and concurrency.

    .venv/bin/python benchmarks/synth_throughput.py --prompts 64 --concurrency 16 --max-tokens 64

Starts one vLLM server on the target (default: the packaged SmolLM2, materialized under
tests/.cache) with prefix caching off, then alternates runs of (a) the pipeline's synth client
(the openai client with retries, journaling every record, progress) and (b) a bare aiohttp
client firing the same requests, in the order a b b a ..., and reports completion tokens/s of
each and the ratio, and the CPU time each client spends per request (the server is another
process: on a GPU host, where the server is fast, a client's CPU per request caps its rate).
--profile adds one unmeasured pipeline run under cProfile and prints where its CPU time goes.
Goal: ratio >= 0.95.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from eagle3_pipeline import config as cfglib
from eagle3_pipeline import prompts, synth, target
from eagle3_pipeline.fileio import AppendLog
from eagle3_pipeline.provenance import package_versions as versions
from eagle3_pipeline.runtime import Progress, setup_logging
from eagle3_pipeline.server import Endpoint, VllmServer
from eagle3_pipeline.serving import spec_from_config


async def bare(endpoint: Endpoint, rows: list[dict], cfg: dict) -> int:
    import aiohttp

    sem = asyncio.Semaphore(cfg["concurrency"])

    async def one(session, row):
        async with (
            sem,
            session.post(
                f"{endpoint.base_url}/chat/completions",
                json=synth.request_body(row, endpoint.model, cfg),
            ) as r,
        ):
            # a prompt the server rejects (too long for max_model_len) counts no tokens, as
            # in the pipeline's client
            return (await r.json()).get("usage", {}).get("completion_tokens", 0)

    conn = aiohttp.TCPConnector(limit=cfg["concurrency"])
    async with aiohttp.ClientSession(connector=conn) as s:
        return sum(await asyncio.gather(*(one(s, r) for r in rows)))


def pipeline(endpoint: Endpoint, rows: list[dict], cfg: dict) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        journal = AppendLog(Path(tmp) / "journal.jsonl")
        journal.open()
        outcome = asyncio.run(
            synth.generate(endpoint, rows, cfg, journal, Progress(len(rows), "synth", every_s=1e9))
        )
        journal.close()
    return outcome["completion_tokens"]


def profiled(run, top: int = 25) -> str:
    """The functions where ``run`` spent its CPU time (cProfile, own time first)."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile(time.process_time)
    prof.runcall(run)
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="HF model dir (default: the packaged SmolLM2)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2, help="pairs of runs (a b b a per two)")
    ap.add_argument(
        "--config", help="a pipeline config whose vllm section to use (e.g. config/gpu.yaml)"
    )
    ap.add_argument("--profile", action="store_true", help="profile one extra pipeline run")
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args()
    setup_logging(None)

    base = cfglib.load(args.config) if args.config else cfglib.validate({})
    cfg = cfglib.validate(
        {
            "vllm": base["vllm"],
            "synth": {"concurrency": args.concurrency, "max_tokens": args.max_tokens},
        }
    )
    model = args.model
    if not model:
        dtype = "float32" if cfg["vllm"]["device"] == "cpu" else "bfloat16"
        tj = REPO / "tests" / ".cache" / f"target-{dtype}" / "target.json"
        if not tj.exists():
            target.materialize({"source": "packaged", "dtype": dtype, "path": None}, tj)
        model = target.load_info(tj)["model_path"]
    with tempfile.TemporaryDirectory() as tmp:
        prompts.build_train(
            {**cfg["prompts"], "train": [{"source": "sharegpt", "n": args.prompts}], "heldout": 0},
            train_out=Path(tmp) / "p.jsonl.zst",
            stats_out=Path(tmp) / "s.json",
        )
        from eagle3_pipeline.fileio import iter_jsonl

        rows = list(iter_jsonl(Path(tmp) / "p.jsonl.zst"))

    spec = spec_from_config(cfg["vllm"], model, extra_args=["--no-enable-prefix-caching"])
    figures = {"bare": [], "pipeline": []}
    cpu_ms = {"bare": [], "pipeline": []}  # client CPU milliseconds per request
    profile = None
    with VllmServer(spec, Path(tempfile.gettempdir()) / "synth-bench-server.log") as server:
        ep = Endpoint(base_url=server.base_url, model=server.model_name, server=server)
        asyncio.run(bare(ep, rows[:4], cfg["synth"]))  # warm-up
        order = (["pipeline", "bare", "bare", "pipeline"] * args.rounds)[: 2 * args.rounds]
        for which in order:
            t0, c0 = time.monotonic(), time.process_time()
            tokens = (
                pipeline(ep, rows, cfg["synth"])
                if which == "pipeline"
                else asyncio.run(bare(ep, rows, cfg["synth"]))
            )
            rate = tokens / (time.monotonic() - t0)
            figures[which].append(rate)
            cpu_ms[which].append(1000 * (time.process_time() - c0) / len(rows))
            print(
                f"{which:9s} {tokens:7d} tokens  {rate:8.1f} tok/s  "
                f"client CPU {cpu_ms[which][-1]:.2f} ms/request",
                flush=True,
            )
        if args.profile:
            profile = profiled(lambda: pipeline(ep, rows, cfg["synth"]))
    med = {k: statistics.median(v) for k, v in figures.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu_ms.items()}
    ratio = med["pipeline"] / med["bare"]
    print(
        f"\nmedian tok/s: pipeline {med['pipeline']:.1f}, bare {med['bare']:.1f}; "
        f"ratio {ratio:.3f} (goal >= 0.95)\n"
        f"client CPU per request: pipeline {med_cpu['pipeline']:.2f} ms, "
        f"bare {med_cpu['bare']:.2f} ms"
    )
    if profile:
        print(profile)
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "runs": figures,
                    "median": med,
                    "ratio": ratio,
                    "client_cpu_ms_per_request": cpu_ms,
                    "profile_top": profile,
                    "args": vars(args),
                    "vllm": cfg["vllm"],
                    "versions": versions(),
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
