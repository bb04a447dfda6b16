"""The bench stage's cache: each prompt set's measurement, kept under a fingerprint of what it
depends on (the drafter, the target, the set's content and the measurement settings), so that
an unchanged set is not measured again and, with nothing to measure, no server starts."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..runtime.files import iter_jsonl, read_json, sha256_file, stable_hash, write_json
from ..staleness.keys import RESULT_KEYS
from .measure import bench_rounds

log = logging.getLogger(__name__)

# Result-determining keys (config.RESULT_KEYS) that do not change a measurement: the sets to
# report and the gate's floors. A change re-runs the job, which re-judges cached results.
NOT_MEASURED = ("bench.prompt_sets", "bench.gate")
# Bump when what a cache entry holds changes: older entries are then measured again.
CACHE_FORMAT = 4


def measurement_settings(cfg: dict, vllm_cfg: dict, rule: str = "bench") -> dict[str, Any]:
    """The result-determining settings of a measurement by ``rule`` (``bench_baseline`` or
    ``bench``; bench and vllm keys), with ``bench.rounds`` resolved for the device."""
    sections = {"bench": cfg, "vllm": vllm_cfg}
    out = {}
    for key in RESULT_KEYS[rule]:
        if key not in NOT_MEASURED:
            section, name = key.split(".")
            out[key] = sections[section].get(name)
    out["bench.rounds"] = bench_rounds(cfg, vllm_cfg)
    return out


def drafter_identity(drafter_dir: str | Path) -> str:
    """The drafter's content: weights and config, without the verifier's path (a moved run
    keeps its cached results)."""
    drafter_dir = Path(drafter_dir)
    cfg = read_json(drafter_dir / "config.json")
    verifier = (cfg.get("speculators_config") or {}).get("verifier") or {}
    verifier.pop("name_or_path", None)
    return stable_hash({"config": cfg, "weights": sha256_file(drafter_dir / "model.safetensors")})


def set_fingerprint(drafter: str | None, target: dict, prompts_path, settings: dict) -> str:
    """What one prompt set's measurement depends on: the drafter (None: the baseline), the
    target, the prompts and the settings."""
    return stable_hash(
        {
            "format": CACHE_FORMAT,
            "drafter": drafter,
            "target": target["identity"],
            "prompts": sha256_file(prompts_path),
            "settings": settings,
        }
    )


def baseline_key(target: dict, cfg: dict, vllm_cfg: dict) -> tuple[None, dict, dict]:
    """What the baseline's cached measurements are keyed by (see measure_cached)."""
    return (None, target, measurement_settings(cfg, vllm_cfg, "bench_baseline"))


def drafter_key(drafter_dir, target: dict, cfg: dict, vllm_cfg: dict) -> tuple[str, dict, dict]:
    """What a drafter's cached measurements are keyed by (``cfg``: the bench section with the
    method's own num_speculative_tokens)."""
    return (drafter_identity(drafter_dir), target, measurement_settings(cfg, vllm_cfg))


K = "bench.num_speculative_tokens"


def unit_fingerprints(
    prompt_files: dict[str, str], key: tuple[str | None, dict, dict]
) -> dict[tuple[str, int | None], str]:
    """The units a measurement is cached in, each under its fingerprint: per prompt set and,
    for a drafter, per k (one server each), so that a failure loses only the unit at hand and
    another k measures only itself; the baseline's unit is the set (k None). ``key`` is
    (drafter identity or None, target, settings)."""
    drafter, target, settings = key
    ks = settings.get(K) or [None]
    return {
        (name, k): set_fingerprint(
            drafter, target, path, settings if k is None else {**settings, K: k}
        )
        for k in ks
        for name, path in prompt_files.items()
    }


def load_cached(cache_dir, fp: str) -> list[dict] | None:
    path = Path(cache_dir) / f"{fp}.json"
    try:
        entry = read_json(path)
    except (OSError, ValueError):
        return None
    return entry["runs"] if entry.get("fingerprint") == fp else None


def store_cached(cache_dir, fp: str, name: str, runs: list[dict]) -> None:
    """Keep one unit's runs (prompt set ``name``) under its fingerprint in ``cache_dir``."""
    write_json(
        Path(cache_dir) / f"{fp}.json", {"fingerprint": fp, "prompt_set": name, "runs": runs}
    )


def load_runs(cache_dir, prompt_files: dict[str, str], key) -> dict[str, list[dict] | None]:
    """Per prompt set, its cached runs over every k of ``key`` (None where a unit is
    missing)."""
    by_set: dict[str, list[dict] | None] = {name: [] for name in prompt_files}
    for (name, _), fp in unit_fingerprints(prompt_files, key).items():
        runs = load_cached(cache_dir, fp)
        by_set[name] = None if runs is None or by_set[name] is None else by_set[name] + runs
    return by_set


def store_runs(cache_dir, prompt_files: dict[str, str], key, by_set: dict[str, list[dict]]):
    """Keep each prompt set's runs of ``by_set`` (each run with its ``k`` for a drafter) in
    their units."""
    for (name, k), fp in unit_fingerprints(prompt_files, key).items():
        if name in by_set:
            store_cached(cache_dir, fp, name, [r for r in by_set[name] if r.get("k") == k])


MeasureTodo = Callable[[dict[int | None, dict[str, list[dict]]], Callable], int]


def measure_cached(
    prompt_files: dict[str, str],
    cache_dir,
    key: tuple[str | None, dict, dict],
    measure_todo: MeasureTodo,
) -> tuple[dict[str, list[dict]], dict[str, Any]]:
    """Per prompt set, its runs: from ``cache_dir`` where a unit (:func:`unit_fingerprints`)
    has an entry, else measured by ``measure_todo(todo, keep)`` and cached. ``todo`` is
    {k (None for the baseline): {set name: prompts}}; ``keep(name, runs, k)`` stores a unit as
    soon as it is measured, so a failure later in the job loses only the unit at hand;
    ``measure_todo`` returns how many servers it started. Returns the runs and ``this_run``
    (what was measured or reused)."""
    cache_dir = Path(cache_dir)
    fps = unit_fingerprints(prompt_files, key)
    units = {unit: load_cached(cache_dir, fp) for unit, fp in fps.items()}
    todo: dict[int | None, dict[str, list[dict]]] = {}
    for (name, k), runs in units.items():
        if runs is None:
            todo.setdefault(k, {})[name] = list(iter_jsonl(prompt_files[name]))
    measured = list(dict.fromkeys(name for sets in todo.values() for name in sets))
    cached = [name for name in prompt_files if name not in measured]
    log.info(
        "%d prompt set(s) cached (%s), %d to measure (%s)",
        len(cached),
        ", ".join(cached) or "none",
        len(measured),
        ", ".join(n if k is None else f"{n} at k={k}" for k, sets in todo.items() for n in sets)
        or "none",
    )

    def keep(name: str, runs: list[dict], k: int | None = None) -> None:
        store_cached(cache_dir, fps[(name, k)], name, runs)
        units[(name, k)] = runs

    servers = measure_todo(todo, keep) if todo else 0
    by_set = {name: [] for name in prompt_files}
    for (name, _), runs in units.items():
        by_set[name] += runs
    return by_set, {
        "servers_started": servers,
        "measured_sets": measured,
        "cached_sets": cached,
    }
