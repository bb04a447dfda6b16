"""Extraction throughput vs bare prefill on the same engine settings.

    .venv/bin/python benchmarks/extract_throughput.py --dataset results/default/prepare/dataset \
        --rows 64 --concurrency 8

(a) bare prefill: a vLLM server without capture answers each row's token ids as a 1-token
completion (what extraction costs at the least); (b) extraction: a server with the
extract_hidden_states method and the pipeline's connector, driven by the extract stage's client
(verification, next-token probe, checksums, shard journal); (c) on that same server, a minimal
client that only fetches each file and deletes it: (c)/(a) is what vLLM's capture costs,
(b)/(c) what the pipeline's client adds; with --python-switch-interval also (d), the extract
stage's client at Python's own switch interval instead of the client's shorter one
(extract.client.SWITCH_INTERVAL_S): (b)/(d) is what that setting buys; with --typed-requests
also (e), the client sending its rows through the openai client's typed completions route
(speculators' generate_hidden_states_async) instead of as plain JSON; with --httpx-transport
also (f), the client over the openai client's default httpx transport instead of aiohttp
(eagle3_pipeline.server.client.async_client); with --validator-wait also (g), the client with a
validator thread waiting for the server to finish writing each sample instead of a waiting
thread of its own. Every client here sends plain JSON through aiohttp
otherwise (eagle3_pipeline.server.client.completion). Both servers are up
together and every round runs every variant, the order reversed every round
(eagle3_lab.rounds; at least 3 rounds). Prefix caching is off so repeated rounds
measure the same work. Prompt tokens/s of each with its spread (median, min-max), the ratios
(goal (b)/(a) >= 0.90), and the client's CPU seconds per sample (this process: requests,
validator, probe) are printed and kept; the result records what else ran on the machine
before and after every round. A GPU that other processes use is refused unless
--allow-shared-gpu. Server start-up is excluded.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import shutil
import tempfile
import time
from pathlib import Path

from eagle3_lab import rounds as rounds_lib
from eagle3_lab.dummy_models import DUMMY_SHAPES, dummy_target, packaged_target_json
from eagle3_lab.results import write_result
from eagle3_pipeline import config as cfglib
from eagle3_pipeline import extract, target
from eagle3_pipeline.engine.spec import shared_gpu_args, spec_from_config
from eagle3_pipeline.extract.client import SWITCH_INTERVAL_S, request_hidden_states
from eagle3_pipeline.runtime import Progress, setup_logging
from eagle3_pipeline.runtime.provenance import package_versions
from eagle3_pipeline.server import VllmServer
from eagle3_pipeline.server import client as client_lib


def packaged_rows(tokenizer_dir: Path, n: int, seq_length: int, prompts_cfg: dict):
    """``n`` rows shaped like prepare's from the packaged ShareGPT prompts, for a machine
    without a pipeline run: each a chat of one prompt and, as the answer, the next prompt's
    text (loss mask on the answer), cut to ``seq_length`` tokens. Prefill and capture cost
    depend on the number of tokens only; the next-token agreement of these rows is low (the
    answers are not the target's own), the probe's work is the same."""
    import datasets
    from transformers import AutoTokenizer

    from eagle3_pipeline import prompts
    from eagle3_pipeline.runtime.files import iter_jsonl

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    with tempfile.TemporaryDirectory() as tmp:
        prompts.build_train(
            {**prompts_cfg, "train": [{"source": "sharegpt", "n": n + 1}], "heldout": 0},
            train_out=Path(tmp) / "p.jsonl.zst",
            stats_out=Path(tmp) / "s.json",
        )
        texts = [r["messages"][0]["content"] for r in iter_jsonl(Path(tmp) / "p.jsonl.zst")]
    rows = {"input_ids": [], "loss_mask": [], "seq_len": []}
    for q, a in itertools.pairwise(texts[: n + 1]):
        user = [{"role": "user", "content": q}]
        text = tok.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
        head = tok(text, add_special_tokens=False)["input_ids"]
        answer = tok(a, add_special_tokens=False)["input_ids"]
        ids = (head + answer)[:seq_length]
        rows["input_ids"].append(ids)
        rows["loss_mask"].append(([0] * len(head) + [1] * len(answer))[:seq_length])
        rows["seq_len"].append(len(ids))
    return datasets.Dataset.from_dict(rows)


async def minimal_client(base_url: str, model: str, rows: list[list[int]], concurrency: int):
    import fcntl
    import os

    def fetch(path: str) -> None:
        with open(path + ".lock") as lf:
            fcntl.flock(lf, fcntl.LOCK_SH)
        os.unlink(path + ".lock")
        os.unlink(path)

    sem = asyncio.Semaphore(concurrency)
    async with client_lib.async_client(base_url, timeout=600, max_retries=0) as c:

        async def one(ids):
            async with sem:
                path = await request_hidden_states(c, model, ids, timeout=600, max_retries=0)
                await asyncio.to_thread(fetch, path)

        await asyncio.gather(*(one(r) for r in rows))


async def bare_prefill(base_url: str, model: str, rows: list[list[int]], concurrency: int):
    sem = asyncio.Semaphore(concurrency)
    async with client_lib.async_client(base_url, timeout=600, max_retries=0) as c:

        async def one(ids):
            async with sem:
                await client_lib.completion(c, {"model": model, "prompt": ids, "max_tokens": 1})

        await asyncio.gather(*(one(r) for r in rows))


async def typed_request(client, model: str, input_ids: list[int], *, timeout, max_retries):
    """A row sent as speculators sends it: the openai client's typed completions route."""
    from speculators.data_generation.vllm_client import generate_hidden_states_async

    item = {"input_ids": input_ids}
    path, _ = await generate_hidden_states_async(
        client, model, item, timeout=timeout, max_retries=max_retries
    )
    return path


def main() -> None:
    repo = Path(__file__).resolve().parents[1]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--dataset",
        help="a prepared data set (results/<run>/prepare/dataset); default: rows built from "
        "the packaged prompts (see packaged_rows)",
    )
    ap.add_argument(
        "--target",
        help="a target.json (results/<run>/target/target.json); default: the packaged "
        "SmolLM2, materialized under tests/.cache",
    )
    ap.add_argument("--seq-length", type=int, default=512, help="of the packaged rows")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of (a), (b), (c) (>= 3)")
    ap.add_argument(
        "--allow-shared-gpu",
        action="store_true",
        help="measure even when other processes use the GPU (recorded in the result)",
    )
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
        help="override the config's share of GPU memory for each of the two servers (default "
        "on a GPU: half of what the config gives one server; an 8B target needs more than "
        "the 135M configs leave it)",
    )
    ap.add_argument(
        "--python-switch-interval",
        action="store_true",
        help="also run (d): the extraction client at Python's switch interval (5 ms) instead "
        "of its own",
    )
    ap.add_argument(
        "--typed-requests",
        action="store_true",
        help="also run (e): the extraction client on the openai client's typed route",
    )
    ap.add_argument(
        "--httpx-transport",
        action="store_true",
        help="also run (f): the extraction client over httpx instead of aiohttp",
    )
    ap.add_argument(
        "--validator-wait",
        action="store_true",
        help="also run (g): the extraction client with its validator threads waiting for the "
        "server's writes",
    )
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.rounds < 3:
        ap.error("--rounds: at least 3 (a spread needs them)")
    setup_logging(None)
    before = rounds_lib.refuse_shared_gpu(args.allow_shared_gpu)
    from datasets import load_from_disk

    base = cfglib.load(args.config) if args.config else cfglib.validate({})
    target_json = args.target or packaged_target_json(
        base["vllm"]["device"], repo / "tests" / ".cache"
    )
    info = target.load_info(target_json)
    if args.dataset:
        ds = load_from_disk(args.dataset).with_format(None)
        if len(ds) < args.rows:  # a small run's dataset: all of it
            print(f"--rows {args.rows}: the dataset has {len(ds)}, all of them are used")
            args.rows = len(ds)
        ds = ds.select(range(args.rows))
    else:
        ds = packaged_rows(Path(info["model_path"]), args.rows, args.seq_length, base["prompts"])
    extra = ["--no-enable-prefix-caching"]
    if args.dummy_shape:
        info = dummy_target(args.dummy_shape, Path(info["model_path"]), Path(tempfile.mkdtemp()))
        extra += ["--load-format", "dummy"]
    if args.gpu_memory_utilization:  # vLLM takes the last of repeated flags
        extra += ["--gpu-memory-utilization", args.gpu_memory_utilization]
    rows = ds["input_ids"]
    tokens = sum(len(r) for r in rows)
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
    arch = info["architecture"]
    _, captured, final = extract.resolve_layers(cfg["extract"], arch)
    layer_ids = [*captured, final]
    n = len(rows)

    def timed(run):
        t0, c0 = time.monotonic(), time.process_time()
        out = run() or {}
        wall, cpu = time.monotonic() - t0, time.process_time() - c0
        return {"tokens_per_s": tokens / wall, "client_cpu_s_per_sample": cpu / n, **out}

    with tempfile.TemporaryDirectory() as tmp:
        staging = Path(tmp) / "staging"
        capture_spec = extract.server_spec(cfg["vllm"], info, layer_ids, staging, cfg["extract"])
        capture_spec.extra_args += extra
        bare_spec = spec_from_config(cfg["vllm"], info["model_path"], extra_args=extra)
        if cfg["vllm"]["device"] != "cpu" and not args.gpu_memory_utilization:
            # both servers are up together on one GPU: each gets half the share one would
            for spec in (capture_spec, bare_spec):
                spec.extra_args = shared_gpu_args(spec.extra_args, 2)
            print(f"two servers on one GPU: {' '.join(bare_spec.extra_args[-2:])} each")
        probe = extract.NextTokenProbe(info["model_path"], arch, cfg["extract"]["verify_device"])
        logs = Path(tempfile.gettempdir())
        done = [0]

        def full(server, todo: list[int], **options) -> dict:
            done[0] += 1
            root = Path(tmp) / f"hs{done[0]}"
            book = extract.ShardBook(root, 64, range(args.rows))
            ex = extract.Extractor(
                ds, book, probe, layer_ids, arch["hidden_size"], cfg["extract"], staging, **options
            )
            asyncio.run(
                ex.run(
                    server.base_url,
                    server.model_name,
                    todo,
                    Progress(len(todo), "extraction round", every_s=1e9),
                    server.check_alive,
                )
            )
            book.close()
            shutil.rmtree(root)
            return {
                "validator_s_per_phase": {k: round(v, 3) for k, v in ex.timings.items()},
                "probe_batches": getattr(ex, "probe_batches", None),  # None: one per sample
                "next_token_agreement": ex.hits / ex.checked if ex.checked else None,
            }

        with (
            VllmServer(bare_spec, logs / "extract-bench-bare.log") as bare_server,
            VllmServer(capture_spec, logs / "extract-bench-capture.log") as cap,
        ):
            asyncio.run(bare_prefill(bare_server.base_url, bare_server.model_name, rows[:2], 1))
            full(cap, [0, 1])  # warm-up
            variants = {
                "bare": lambda: timed(
                    lambda: asyncio.run(
                        bare_prefill(
                            bare_server.base_url, bare_server.model_name, rows, args.concurrency
                        )
                    )
                ),
                "extract": lambda: timed(lambda: full(cap, list(range(args.rows)))),
                "minimal": lambda: timed(
                    lambda: asyncio.run(
                        minimal_client(cap.base_url, cap.model_name, rows, args.concurrency)
                    )
                ),
            }
            if args.python_switch_interval:
                variants["extract_python_switch"] = lambda: timed(
                    lambda: full(cap, list(range(args.rows)), switch_interval_s=None)
                )
            if args.typed_requests:
                variants["extract_typed"] = lambda: timed(
                    lambda: full(cap, list(range(args.rows)), request=typed_request)
                )
            if args.httpx_transport:
                variants["extract_httpx"] = lambda: timed(
                    lambda: full(cap, list(range(args.rows)), transport="httpx")
                )
            if args.validator_wait:
                variants["extract_validator_wait"] = lambda: timed(
                    lambda: full(cap, list(range(args.rows)), wait_in_validator=True)
                )
            result = rounds_lib.alternate(variants, args.rounds, [bare_server, cap])
    rates = {k: rounds_lib.figure(result, k, "tokens_per_s") for k in variants}
    cpu = {k: rounds_lib.figure(result, k, "client_cpu_s_per_sample") for k in rates}
    spread = {k: rounds_lib.spread(v) for k, v in rates.items()}
    cpu_spread = {k: rounds_lib.spread(v) for k, v in cpu.items()}
    med = {k: v["median"] for k, v in spread.items()}
    ratio = med["extract"] / med["bare"]
    paired = rounds_lib.spread(rounds_lib.paired_ratios(result, "extract", "bare", "tokens_per_s"))

    def mm(k: str) -> str:
        return f"({spread[k]['min']:.1f}-{spread[k]['max']:.1f})"

    print(
        f"\n{args.rows} rows, {tokens} tokens, concurrency {args.concurrency}, "
        f"{args.rounds} rounds, medians (min-max):\n"
        f"  extraction / bare prefill   {med['extract']:.1f} {mm('extract')} / "
        f"{med['bare']:.1f} {mm('bare')} = {ratio:.3f} (goal >= 0.90; per round "
        f"{paired['min']:.3f}-{paired['max']:.3f})\n"
        f"  capture only / bare prefill {med['minimal']:.1f} {mm('minimal')} / {med['bare']:.1f}"
        f" = {med['minimal'] / med['bare']:.3f} (what vLLM's capture costs)\n"
        f"  extraction / capture only   {med['extract'] / med['minimal']:.3f} "
        "(what the pipeline's client adds, same server)\n"
        f"  client CPU s per sample: extraction {cpu_spread['extract']['median']:.4f}, "
        f"capture only {cpu_spread['minimal']['median']:.4f}, "
        f"bare {cpu_spread['bare']['median']:.4f}"
    )

    def gain_over(variant: str, what: str) -> dict | None:
        """The pipeline's extraction over one of its variants, per round, printed."""
        if variant not in result["rounds"][0]:
            return None
        gain = rounds_lib.spread(
            rounds_lib.paired_ratios(result, "extract", variant, "tokens_per_s")
        )
        print(
            f"  extraction / {what}: {gain['median']:.3f} (per round {gain['min']:.3f}-"
            f"{gain['max']:.3f}); client CPU s per sample there "
            f"{cpu_spread[variant]['median']:.4f}"
        )
        return gain

    switch_gain = gain_over(
        "extract_python_switch",
        f"at Python's switch interval (the client's: {SWITCH_INTERVAL_S * 1e3:g} ms)",
    )
    typed_gain = gain_over("extract_typed", "on the typed route (the client's: plain JSON)")
    aiohttp_gain = gain_over("extract_httpx", "over httpx (the client's: aiohttp)")
    wait_gain = gain_over(
        "extract_validator_wait",
        "with validator threads waiting for the writes (the client's: threads of their own)",
    )
    if args.out:
        write_result(
            args.out,
            {
                "protocol": "alternating rounds, order reversed every round",
                "rates": rates,
                "median": med,
                "spread": spread,
                "ratio": ratio,
                "ratio_per_round": paired,
                "capture_ratio": med["minimal"] / med["bare"],
                "switch_interval_s": SWITCH_INTERVAL_S,
                "switch_interval_gain": switch_gain,
                "plain_json_gain": typed_gain,
                "aiohttp_gain": aiohttp_gain,
                "separate_wait_gain": wait_gain,
                "client_cpu_s_per_sample": cpu,
                "client_cpu_s_per_sample_spread": cpu_spread,
                "rounds": result["rounds"],
                "surroundings_before": before,
                "surroundings_servers_up": result["before"],
                "tokens": tokens,
                "agreement_positions_per_sample": cfg["extract"]["agreement_positions_per_sample"],
                "architecture": info["architecture"],
                "args": vars(args),
                "vllm": cfg["vllm"],
                "versions": package_versions(),
            },
        )


if __name__ == "__main__":
    main()
