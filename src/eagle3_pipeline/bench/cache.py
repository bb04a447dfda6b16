"""The bench stage's cache: each prompt set's measurement, kept under a fingerprint of what it
depends on (the drafter, the target, the set's content and the measurement settings), so that
an unchanged set is not measured again and, with nothing to measure, no server starts."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..config import RESULT_KEYS
from ..runtime.files import iter_jsonl, read_json, sha256_file, stable_hash, write_json
from .measure import bench_rounds

log = logging.getLogger(__name__)

# Result-determining keys (config.RESULT_KEYS) that do not change a measurement: the sets to
# report and the verdict's thresholds. A change re-runs the job, which re-judges cached results.
NOT_MEASURED = (
    "bench.prompt_sets",
    "bench.min_acceptance_length",
    "bench.min_measured_to_predicted",
)
# Bump when what a cache entry holds changes: older entries are then measured again.
CACHE_FORMAT = 3


def measurement_settings(cfg: dict, vllm_cfg: dict, rule: str = "bench") -> dict[str, Any]:
    """The result-determining settings of a measurement by ``rule`` (``bench_baseline`` or
    ``bench``; bench and vllm keys), with ``bench.rounds`` resolved for the device."""
    sections = {"bench": cfg, "vllm": vllm_cfg}
    out = {}
    for key in RESULT_KEYS[rule]:
        if key not in NOT_MEASURED:
            section, name = key.split(".")
            out[key] = sections[section].get(name)
    for key in ("bench.chat_template_kwargs", "bench.speculative_config"):
        if not out.get(key):
            # none: the key stays out, so entries measured before it existed still count
            out.pop(key, None)
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


def load_cached(cache_dir: Path, fp: str) -> list[dict] | None:
    path = cache_dir / f"{fp}.json"
    try:
        entry = read_json(path)
    except (OSError, ValueError):
        return None
    return entry["runs"] if entry.get("fingerprint") == fp else None


def store_cached(cache_dir, fps: dict[str, str], measured: dict[str, list[dict]]) -> None:
    """Keep each prompt set's runs under its fingerprint (``fps``) in ``cache_dir``."""
    for name, runs in measured.items():
        write_json(
            Path(cache_dir) / f"{fps[name]}.json",
            {"fingerprint": fps[name], "prompt_set": name, "runs": runs},
        )


def cache_fingerprints(
    prompt_files: dict[str, str], key: tuple[str | None, dict, dict]
) -> dict[str, str]:
    """Per prompt set, the fingerprint its measurement is cached under: ``key`` is (drafter
    identity or None, target, settings)."""
    drafter, target, settings = key
    return {
        name: set_fingerprint(drafter, target, path, settings)
        for name, path in prompt_files.items()
    }


def measure_cached(
    prompt_files: dict[str, str],
    cache_dir,
    key: tuple[str | None, dict, dict],
    measure_todo,
) -> tuple[dict[str, list[dict]], dict[str, Any]]:
    """Per prompt set, its runs: from ``cache_dir`` where the set's fingerprint (of ``key``:
    drafter identity or None, target, settings; and the set's content) has an entry, else
    measured by ``measure_todo({name: prompts})`` (-> (runs per set, servers started)) and
    cached. Returns the runs and ``this_run`` (what was measured or reused)."""
    cache_dir = Path(cache_dir)
    fps = cache_fingerprints(prompt_files, key)
    by_set = {name: load_cached(cache_dir, fp) for name, fp in fps.items()}
    todo = {
        name: list(iter_jsonl(prompt_files[name])) for name, runs in by_set.items() if runs is None
    }
    log.info(
        "%d prompt set(s) cached (%s), %d to measure (%s)",
        len(by_set) - len(todo),
        ", ".join(n for n in by_set if n not in todo) or "none",
        len(todo),
        ", ".join(todo) or "none",
    )
    servers = 0
    if todo:
        measured, servers = measure_todo(todo)
        store_cached(cache_dir, fps, measured)
        by_set.update(measured)
    return by_set, {
        "servers_started": servers,
        "measured_sets": list(todo),
        "cached_sets": [n for n in by_set if n not in todo],
    }
