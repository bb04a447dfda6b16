"""Is the drafter served as trained? Replay a finished run's baseline outputs through its drafters.

    .venv/bin/python lab/drafter_replay.py --run results/methods \
        --out benchmarks/results/methods/drafter_replay_cpu.json
    .venv/bin/python lab/drafter_replay.py --run results/methods --rows validation training \
        --sets heldout --out benchmarks/results/methods/drafter_replay_rows_cpu.json
    .venv/bin/python lab/drafter_replay.py --run results/X --methods dflash \
        --k dflash=3,15 --sets heldout --limit 8

For each prompt set, the baseline's greedy outputs (bench/baseline.json, T=0, concurrency 1 or
``--concurrency``) are rendered with the chat template, the target's hidden states for prompt +
output computed with transformers in float32 (as extraction stores them), and every drafter of
drafter/<method>/ run on them with speculators' own model code (eagle3_lab.diagnostics): the
proposals from every output position, then greedy speculative decoding simulated and counted as
vLLM's counters count. Per method, k and set it prints and writes:

* replay: tau and acceptance per position of the walk (what vLLM would reach serving exactly
  what was trained); served: the bench stage's figures at the same set and k
  (bench/<method>/metrics.json); served / replay (about 1 when vLLM serves what was trained);
* uniform: a draft from every position, averaged (what validation's prediction estimates, here
  on the benchmark's text); predicted: validation's tau;
* for DFlash at k < block_size - 1 a second row with the block it was trained on (vLLM builds
  k + 1 queries), block = trained block size.

``--rows validation training`` replays the prepared data set's rows too (the target's greedy
synth answers; nothing served there): on the validation rows the uniform figure is what
validation measured, so the prediction, the uniform figure and the walk can be compared on the
very text validation saw.

Reading them: predicted vs uniform is the prompts' distribution; uniform vs replay is how
speculative decoding visits anchors (the walk skips what it accepted); served vs replay is a
train/serve mismatch (and numerics: a GPU run served bfloat16, the replay is float32). It runs
on the CPU; the run's drafter weights (model.safetensors) and target model must be there.
"""

from __future__ import annotations

import argparse
import sys
import time

from eagle3_lab.diagnostics.replay import replay_run
from eagle3_lab.results import write_result
from eagle3_pipeline.runtime import setup_logging
from eagle3_pipeline.runtime.provenance import package_versions


def fmt(v, digits: int = 3) -> str:
    """A table cell (as benchmarks/methods_compare.py writes them)."""
    if v is None:
        return "-"
    if isinstance(v, list):
        return " / ".join(fmt(x, 2) for x in v)
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def parse_ks(items: list[str] | None, methods: list[str] | None) -> dict[str, list[int]]:
    """``3 7`` (every method) or ``dflash=3,15 eagle3=3``."""
    out: dict[str, list[int]] = {}
    for item in items or []:
        if "=" in item:
            method, ks = item.split("=", 1)
            out[method] = [int(k) for k in ks.split(",")]
        else:
            for method in methods or ["eagle3", "dflash"]:
                out.setdefault(method, []).append(int(item))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="results/<run> of a finished run")
    ap.add_argument("--methods", nargs="*", help="default: every drafter/<method>/ with weights")
    ap.add_argument("--k", nargs="*", help="3 7, or per method: dflash=3,15 (default: bench's)")
    ap.add_argument("--sets", nargs="*", help="prompt sets (default: every set of the baseline)")
    ap.add_argument(
        "--rows",
        nargs="*",
        default=[],
        choices=["validation", "training"],
        help="also the prepared data set's rows (validation: what validation measured)",
    )
    ap.add_argument("--limit", type=int, help="replay the first N prompts (rows) of each set")
    ap.add_argument("--target", help="the target model directory (default: target.json's)")
    ap.add_argument(
        "--concurrency", type=int, default=1, help="the bench runs compared (default: 1)"
    )
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()
    setup_logging(None)

    t0 = time.monotonic()
    result = replay_run(
        args.run,
        methods=args.methods,
        ks=parse_ks(args.k, args.methods),
        sets=args.sets,
        limit=args.limit,
        target_path=args.target,
        rows=args.rows,
        concurrency=args.concurrency,
    )
    result["elapsed_s"] = round(time.monotonic() - t0, 1)
    print(
        "| method | k | block | prompt set | τ replay | τ served | served / replay | "
        "τ uniform | τ predicted | per position replay | per position served |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(
        result["results"],
        key=lambda r: (r["method"], r["k"], r["prompt_set"], not r["as_served"]),
    ):
        served = r["served"] or {}
        block = (
            "-" if r["block"] is None else f"{r['block']}{'' if r['as_served'] else ' (trained)'}"
        )
        print(
            f"| {r['method']} | {r['k']} | {block} | {r['prompt_set']} | "
            f"{fmt(r['replay']['acceptance_length'])} | {fmt(served.get('acceptance_length'))} | "
            f"{fmt(r.get('served_over_replay')) if r['as_served'] else '-'} | "
            f"{fmt(r['uniform']['acceptance_length'])} | "
            f"{fmt(r['predicted_acceptance_length'])} | {fmt(r['replay']['per_position'])} | "
            f"{fmt(served.get('per_position'))} |"
        )
    agree = ", ".join(
        f"{name} {fmt(a['rate'])} of {a['checked']}"
        for name, a in result["target_agreement"].items()
    )
    print(f"\ntransformers float32 target's greedy token = the baseline's output: {agree}")
    print(f"{result['elapsed_s']:.0f} s")
    if args.out:
        result["command"] = " ".join(["python", *sys.argv])
        result["versions"] = package_versions()
        write_result(args.out, result)


if __name__ == "__main__":
    main()
