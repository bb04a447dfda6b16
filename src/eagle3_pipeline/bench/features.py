"""The bench job's feature check: the aux hidden states the served drafter is fed, for one
extracted row, against what extraction stored for it (:mod:`eagle3_pipeline.engine.serve_probe`
records them inside the drafter's server).

Run on the job's first drafter server before anything is measured; a mismatch fails the job
(TRAIN/SERVE MISMATCH) before a benchmark could hide it in a lower acceptance. Its result is
kept beside the bench cache under the drafter's and the extraction's identity, so a job that
measures nothing (every set cached) still reports it.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

from ..engine import serve_probe
from ..hidden_states.shards import dequantize, sample_path
from ..runtime.files import read_json, stable_hash, write_json
from ..server.client import sync_client

log = logging.getLogger(__name__)

# Each served aux layer must be nearest to the stored layer it was trained on, by a wide margin
# (its distance at most DISTANCE_RATIO of the distance to any other captured layer: a shifted,
# reordered or wrongly computed layer is about as far from its own slot as from a neighbour),
# and within LIMITS of it (‖served - stored‖ / ‖stored‖). bf16 values differ with the batch
# they were computed in (a random DeepSeek-V3 miniature: 0-4% between a row extracted at
# concurrency 4 and the same row served alone); fp8 storage adds its rounding (3 mantissa bits,
# about 3% RMS). The limits leave room for that across many layers.
LIMITS = {"bf16": 0.15, "fp8": 0.2}
DISTANCE_RATIO = 0.5
PROBE_MAX_TOKENS = 4


class FeatureMismatch(RuntimeError):
    """The drafter is fed other features at serve time than it was trained on."""


def probe_env(probe_dir: Path) -> dict[str, str]:
    """The environment entry that makes a vLLM server record what its drafter is fed."""
    return {serve_probe.ENV: str(probe_dir)}


def pick_sample(manifest: dict[str, Any], max_tokens: int) -> tuple[int, dict[str, Any]] | None:
    """The first stored sample whose tokens fit ``max_tokens``: (index, its tensors)."""
    from safetensors.torch import load_file

    root, per_shard = manifest["root"], manifest["samples_per_shard"]
    for i in range(manifest["num_samples"]):
        path = sample_path(root, i, per_shard)
        if not path.exists():
            continue
        tensors = load_file(str(path))
        if 0 < len(tensors["token_ids"]) <= max_tokens:
            return i, tensors
    return None


def _ask(base_url: str, model: str, token_ids: list[int], timeout: float) -> None:
    import httpx

    client = sync_client(base_url, timeout=timeout, max_retries=0)
    body = {"model": model, "prompt": token_ids, "max_tokens": PROBE_MAX_TOKENS, "temperature": 0}
    client.post("/completions", body=body, cast_to=httpx.Response).raise_for_status()


def check(
    base_url: str,
    model: str,
    probe_dir: Path,
    manifest: dict[str, Any],
    aux_layer_ids: list[int],
    max_model_len: int,
    timeout: float = 600.0,
) -> dict[str, Any]:
    """Ask the drafter's server (started with :func:`probe_env`) for one stored row and
    compare what its drafter was fed with the stored aux layers (:func:`judge`)."""
    picked = pick_sample(manifest, max_model_len - PROBE_MAX_TOKENS)
    if picked is None:
        return {"checked": False, "why": "no stored sample fits vllm.max_model_len"}
    index, tensors = picked
    ids = tensors["token_ids"].tolist()
    stored = dequantize(tensors).float().numpy()
    layer_ids = list(manifest["layer_ids"])
    slots = [layer_ids.index(i) for i in aux_layer_ids]
    (probe_dir / serve_probe.ACTIVE).touch()
    try:
        _ask(base_url, model, ids, timeout)
    finally:
        (probe_dir / serve_probe.ACTIVE).unlink(missing_ok=True)
    calls = serve_probe.read_calls(probe_dir)
    served, seen = serve_probe.served_features(calls, ids)
    if served.shape[1] != len(slots) * stored.shape[-1]:
        raise FeatureMismatch(
            f"TRAIN/SERVE MISMATCH: the served drafter is fed {served.shape[1]} features a "
            f"token, {len(slots)} aux layers of {stored.shape[-1]} were trained on "
            f"({aux_layer_ids})"
        )
    result = serve_probe.compare(served, seen, stored, slots)
    result.update(
        sample=index,
        tokens=len(ids),
        aux_layer_ids=list(aux_layer_ids),
        storage=manifest.get("storage"),
        recorded_calls=len(calls),
    )
    return judge(result)


def judge(result: dict[str, Any]) -> dict[str, Any]:
    """A :func:`~eagle3_pipeline.engine.serve_probe.compare` result (with ``tokens`` and
    ``storage``) with its verdict: every position recorded, each served layer nearest its
    trained-on slot by :data:`DISTANCE_RATIO`, and within the storage's limit."""
    import math

    limit = LIMITS.get(result.get("storage"), LIMITS["bf16"])
    worst = result["max_rel_err"]
    ok = (
        result["positions"] == result["tokens"]
        and result["closest_slot"] == result["expected_slots"]
        and max(result["distance_ratio_to_next_layer"]) <= DISTANCE_RATIO
        and worst is not None
        and math.isfinite(worst)
        and worst <= limit
    )
    return {**result, "checked": True, "limit": limit, "ok": bool(ok)}


def verdict_problem(result: dict[str, Any]) -> str | None:
    """What is wrong with a :func:`check` result, or None."""
    if not result.get("checked") or result.get("ok"):
        return None
    ratios = [round(r, 3) for r in result["distance_ratio_to_next_layer"]]
    return (
        "TRAIN/SERVE MISMATCH: at serve time the drafter is fed other features than it was "
        f"trained on (sample {result['sample']}, {result['positions']} of {result['tokens']} "
        f"positions recorded; relative error per aux layer "
        f"{[round(e, 4) for e in result['rel_err_per_layer']]} against a limit of "
        f"{result['limit']}; each served layer closest to stored slot {result['closest_slot']}, "
        f"trained on slots {result.get('expected_slots')}, distance to the trained-on layer "
        f"over the distance to the next one {ratios}, at most {DISTANCE_RATIO}). The vLLM that "
        "serves the drafter "
        "computes the aux layers differently from the one that extracted them: extract and "
        "serve with the same vLLM and model settings, then re-extract and re-train"
    )


def cache_path(cache_dir, drafter_identity: str, manifest: dict[str, Any]) -> Path:
    key = stable_hash({"drafter": drafter_identity, "samples": manifest.get("samples_sha256")})
    return Path(cache_dir) / f"serve_features-{key}.json"


def cached(cache_dir, drafter_identity: str, manifest: dict[str, Any]) -> dict[str, Any] | None:
    path = cache_path(cache_dir, drafter_identity, manifest)
    return read_json(path) if path.exists() else None


def keep(cache_dir, drafter_identity: str, manifest: dict[str, Any], result: dict) -> None:
    path = cache_path(cache_dir, drafter_identity, manifest)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, result)


def probe_dir() -> Path:
    """A fresh directory for one server's recordings."""
    return Path(tempfile.mkdtemp(prefix="eagle3-serve-probe-"))
