"""Synth client throughput vs a bare async client, same server, prompts and concurrency.

    .venv/bin/python benchmarks/synth_throughput.py --prompts 64 --concurrency 16 --max-tokens 64

Starts one vLLM server on the target (default: the packaged SmolLM2, materialized under
tests/.cache) with prefix caching off, then runs --rounds rounds (at least 3) of (a) the
pipeline's synth client (the openai client over aiohttp with retries, journaling every record,
progress) and (b) a bare aiohttp client firing the same requests, the order reversed every
round (eagle3_lab.rounds); with --httpx-transport also (c), the pipeline's client
over the openai client's default httpx transport. It reports completion tokens/s of each with
its spread (median, min-max), the ratio, and the CPU time each client spends per request
(the server is another process: on a GPU host, where the server is fast, a client's CPU per
request caps its rate). The result records what else ran on the machine (GPU processes and
utilization, load average) before and after every round; a GPU that other processes use is
refused unless --allow-shared-gpu. --profile adds one unmeasured pipeline run under cProfile
and prints where its CPU time goes. Goal: ratio >= 0.95.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from eagle3_lab import rounds as rounds_lib
from eagle3_lab.dummy_models import packaged_target_json
from eagle3_lab.results import write_result
from eagle3_pipeline import config as cfglib
from eagle3_pipeline import prompts, synth, target
from eagle3_pipeline.engine.spec import spec_from_config
from eagle3_pipeline.runtime import Progress, setup_logging
from eagle3_pipeline.runtime.files import AppendLog
from eagle3_pipeline.runtime.provenance import package_versions as versions
from eagle3_pipeline.server import Endpoint, VllmServer

REPO = Path(__file__).resolve().parents[1]
# the pipeline's client variants and their HTTP transports
# (eagle3_pipeline.server.client.async_client)
TRANSPORT_OF = {"pipeline": "aiohttp", "pipeline_httpx": "httpx"}


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


def pipeline(endpoint: Endpoint, rows: list[dict], cfg: dict, transport: str = "aiohttp") -> int:
    with tempfile.TemporaryDirectory() as tmp:
        journal = AppendLog(Path(tmp) / "journal.jsonl")
        journal.open()
        progress = Progress(len(rows), "synth", every_s=1e9)
        outcome = asyncio.run(
            synth.generate(endpoint, rows, cfg, journal, progress, transport=transport)
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
    ap.add_argument("--rounds", type=int, default=3, help="rounds of both clients (>= 3)")
    ap.add_argument(
        "--allow-shared-gpu",
        action="store_true",
        help="measure even when other processes use the GPU (recorded in the result)",
    )
    ap.add_argument(
        "--config", help="a pipeline config whose vllm section to use (e.g. config/gpu.yaml)"
    )
    ap.add_argument("--profile", action="store_true", help="profile one extra pipeline run")
    ap.add_argument(
        "--httpx-transport",
        action="store_true",
        help="also run (c): the pipeline's client over httpx instead of aiohttp",
    )
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args()
    if args.rounds < 3:
        ap.error("--rounds: at least 3 (a spread needs them)")
    setup_logging(None)
    before = rounds_lib.refuse_shared_gpu(args.allow_shared_gpu)

    base = cfglib.load(args.config) if args.config else cfglib.validate({})
    cfg = cfglib.validate(
        {
            "vllm": base["vllm"],
            "synth": {"concurrency": args.concurrency, "max_tokens": args.max_tokens},
        }
    )
    model = args.model
    if not model:
        tj = packaged_target_json(cfg["vllm"]["device"], REPO / "tests" / ".cache")
        model = target.load_info(tj)["model_path"]
    with tempfile.TemporaryDirectory() as tmp:
        prompts.build_train(
            {**cfg["prompts"], "train": [{"source": "sharegpt", "n": args.prompts}], "heldout": 0},
            train_out=Path(tmp) / "p.jsonl.zst",
            stats_out=Path(tmp) / "s.json",
        )
        from eagle3_pipeline.runtime.files import iter_jsonl

        rows = list(iter_jsonl(Path(tmp) / "p.jsonl.zst"))

    spec = spec_from_config(cfg["vllm"], model, extra_args=["--no-enable-prefix-caching"])
    profile = None

    def timed(which: str):
        def run() -> dict:
            t0, c0 = time.monotonic(), time.process_time()
            tokens = (
                asyncio.run(bare(ep, rows, cfg["synth"]))
                if which == "bare"
                else pipeline(ep, rows, cfg["synth"], transport=TRANSPORT_OF[which])
            )
            wall = time.monotonic() - t0
            return {
                "tokens_per_s": tokens / wall,
                "client_cpu_ms_per_request": 1000 * (time.process_time() - c0) / len(rows),
                "tokens": tokens,
                "wall_s": wall,
            }

        return run

    with VllmServer(spec, Path(tempfile.gettempdir()) / "synth-bench-server.log") as server:
        ep = Endpoint(base_url=server.base_url, model=server.model_name, server=server)
        asyncio.run(bare(ep, rows[:4], cfg["synth"]))  # warm-up
        variants = ["pipeline", "bare"] + ["pipeline_httpx"] * args.httpx_transport
        result = rounds_lib.alternate({k: timed(k) for k in variants}, args.rounds, [server])
        if args.profile:
            profile = profiled(lambda: pipeline(ep, rows, cfg["synth"]))
    rates = {k: rounds_lib.figure(result, k, "tokens_per_s") for k in variants}
    cpu = {k: rounds_lib.figure(result, k, "client_cpu_ms_per_request") for k in rates}
    spread = {k: rounds_lib.spread(v) for k, v in rates.items()}
    cpu_spread = {k: rounds_lib.spread(v) for k, v in cpu.items()}
    ratio = spread["pipeline"]["median"] / spread["bare"]["median"]
    paired = rounds_lib.spread(rounds_lib.paired_ratios(result, "pipeline", "bare", "tokens_per_s"))
    print(
        f"\nmedian tok/s (min-max): pipeline {spread['pipeline']['median']:.1f} "
        f"({spread['pipeline']['min']:.1f}-{spread['pipeline']['max']:.1f}), "
        f"bare {spread['bare']['median']:.1f} "
        f"({spread['bare']['min']:.1f}-{spread['bare']['max']:.1f}); "
        f"ratio {ratio:.3f} (goal >= 0.95), per round {paired['min']:.3f}-{paired['max']:.3f}\n"
        f"client CPU per request: pipeline {cpu_spread['pipeline']['median']:.2f} ms, "
        f"bare {cpu_spread['bare']['median']:.2f} ms"
    )
    aiohttp_gain = None
    if args.httpx_transport:
        aiohttp_gain = rounds_lib.spread(
            rounds_lib.paired_ratios(result, "pipeline", "pipeline_httpx", "tokens_per_s")
        )
        print(
            f"pipeline (aiohttp) / pipeline over httpx: {aiohttp_gain['median']:.3f} (per round "
            f"{aiohttp_gain['min']:.3f}-{aiohttp_gain['max']:.3f}); client CPU per request "
            f"over httpx {cpu_spread['pipeline_httpx']['median']:.2f} ms"
        )
    if profile:
        print(profile)
    if args.out:
        write_result(
            args.out,
            {
                "protocol": "alternating rounds, order reversed every round",
                "runs": rates,
                "median": {k: v["median"] for k, v in spread.items()},
                "spread": spread,
                "ratio": ratio,
                "ratio_per_round": paired,
                "aiohttp_gain": aiohttp_gain,
                "client_cpu_ms_per_request": cpu,
                "client_cpu_ms_per_request_spread": cpu_spread,
                "rounds": result["rounds"],
                "surroundings_before": before,
                "surroundings_servers_up": result["before"],
                "profile_top": profile,
                "args": vars(args),
                "vllm": cfg["vllm"],
                "versions": versions(),
            },
        )


if __name__ == "__main__":
    main()
