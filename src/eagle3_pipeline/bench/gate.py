"""The regression gate (``bench.gate``): floors on a drafter's acceptance on pinned prompt sets.
Below a floor the bench job fails (GATE FAILED, with the numbers), so that a drafter that
stopped learning, or one served wrong, stops a pipeline or a CI run instead of passing with a
headline someone has to read.

A floor names a prompt set of ``bench.prompt_sets`` and, optionally, the drafter, k and
temperature it judges (unset: every one measured), and the least acceptance length (τ) and/or
acceptance per draft position (the share of drafts whose position i was accepted, as vLLM
counts it) every such measurement must reach. Floors re-judge cached measurements: changing one
measures nothing (:data:`eagle3_pipeline.bench.cache.NOT_MEASURED`).

Every floor must be able to fail: one that names a set, drafter, k or temperature that is not
measured, or a position beyond k (never drafted), is a configuration error
(:func:`config_problems`, run before any job starts).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .settings import bench_sets, speculative_tokens

# Beside bench/<method>/metrics.json, and not a declared output: Snakemake deletes a failed
# job's outputs, and a failed gate's numbers must survive the failure.
GATE_FILE = "gate.json"


def floors_for(gate_cfg: dict, drafter: str) -> list[dict]:
    """The floors of ``bench.gate`` that judge drafter ``drafter`` (a name of train.methods):
    those for it by name and those for every drafter."""
    return [f for f in gate_cfg.get("floors") or [] if f.get("drafter") in (None, drafter)]


def config_problems(cfg: dict) -> list[str]:
    """Every floor of ``bench.gate`` judges something measured: its prompt set is benchmarked,
    its drafter trained, its k and temperature measured, its per-position floors within every
    k it judges (a position beyond k is never drafted). A floor that matches nothing would be a
    gate that cannot fail."""
    problems = []
    sets = bench_sets(cfg)
    drafters = cfg["train"]["methods"]
    for i, floor in enumerate(cfg["bench"]["gate"].get("floors") or []):
        key = f"config key `bench.gate.floors[{i}]"
        if floor.get("acceptance_length") is None and not floor.get("per_position"):
            problems.append(
                f"{key}`: a floor gives acceptance_length, per_position or both; this one gives "
                "neither, so it could never fail"
            )
        if floor["prompt_set"] not in sets:
            problems.append(
                f"{key}.prompt_set`: {floor['prompt_set']!r} is not benchmarked (the bench "
                f"stage measures {sets}: bench.prompt_sets, and the held-out set)"
            )
        drafter = floor.get("drafter")
        if drafter is not None and drafter not in drafters:
            problems.append(
                f"{key}.drafter`: {drafter!r} is not trained (train.methods: {drafters})"
            )
            continue
        temperature = floor.get("temperature")
        if temperature is not None and temperature not in cfg["bench"]["temperatures"]:
            problems.append(
                f"{key}.temperature`: {temperature} is not measured (bench.temperatures: "
                f"{cfg['bench']['temperatures']})"
            )
        for name in [drafter] if drafter else drafters:
            measured = speculative_tokens(cfg, name)
            k = floor.get("k")
            if k is not None and k not in measured:
                problems.append(
                    f"{key}.k`: {name} is measured at k = {measured} "
                    f"(bench.num_speculative_tokens), not at {k}; set drafter: to the drafter "
                    "it is for"
                )
                continue
            judged = [k] if k is not None else measured
            positions = len(floor.get("per_position") or [])
            if positions > min(judged):
                problems.append(
                    f"{key}.per_position`: {positions} floors, but {name} drafts "
                    f"{min(judged)} tokens at k = {min(judged)}: a position beyond k is never "
                    "drafted; give at most k floors, or set k: to the k they are for"
                )
    return problems


def _where(row: dict) -> str:
    return (
        f"{row['prompt_set']} (k={row['k']}, T={row['temperature']}, "
        f"concurrency {row['concurrency']})"
    )


def _check(row: dict, what: str, measured: float | None, floor: float) -> dict[str, Any]:
    return {
        "prompt_set": row["prompt_set"],
        "k": row["k"],
        "temperature": row["temperature"],
        "concurrency": row["concurrency"],
        "what": what,
        "measured": measured,
        "floor": floor,
        "ok": measured is not None and measured >= floor,
    }


def _text(c: dict) -> str:
    measured = "not measured (no drafts)" if c["measured"] is None else f"{c['measured']:.3f}"
    sign = ">=" if c["ok"] else "<"
    return f"{c['what']} {measured} {sign} {c['floor']}"


def judge(runs: list[dict], floors: list[dict], gate_path: str | Path | None = None) -> dict:
    """The gate on a drafter's result rows (``bench.stage.drafter_rows``) under its
    ``floors`` (:func:`floors_for`): one check per floor value and matching row, ``passed``
    when every measured value reaches its floor, and a message with the numbers (the failed
    checks, or every check when all passed). No floors: ``None``. ``gate_path``: where the
    numbers are kept, named in a failure's message."""
    if not floors:
        return None
    checks = []
    for i, floor in enumerate(floors):
        rows = [
            r
            for r in runs
            if r["prompt_set"] == floor["prompt_set"]
            and floor.get("k") in (None, r["k"])
            and floor.get("temperature") in (None, r["temperature"])
        ]
        if not rows:  # config_problems refuses such a floor before any job starts
            raise ValueError(f"bench.gate floor {i} ({floor}) matches no measurement")
        for r in rows:
            least_tau = floor.get("acceptance_length")
            if least_tau is not None:
                checks.append(_check(r, "acceptance length", r["acceptance_length"], least_tau))
            for pos, least in enumerate(floor.get("per_position") or []):
                got = r["per_position"][pos] if pos < len(r["per_position"] or []) else None
                checks.append(_check(r, f"acceptance at position {pos + 1}", got, least))
    failed = [c for c in checks if not c["ok"]]
    shown = failed or checks
    by_where: dict[str, list[str]] = {}
    for c in shown:
        by_where.setdefault(_where(c), []).append(_text(c))
    numbers = "; ".join(f"{w}: {', '.join(texts)}" for w, texts in by_where.items())
    if failed:
        message = (
            f"GATE FAILED: {len(failed)} of {len(checks)} checks below their floors "
            f"(bench.gate): {numbers}"
        )
        if gate_path is not None:
            message += (
                f". Every check's numbers are in {gate_path}; the measurements are cached, so "
                "a re-run with the same drafter judges again without measuring"
            )
    else:
        message = f"GATE PASSED: {len(checks)} checks at or above their floors: {numbers}"
    return {"passed": not failed, "message": message, "floors": floors, "checks": checks}
