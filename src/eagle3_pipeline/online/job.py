"""The train job's own extraction (``extract.mode`` online or hybrid): what its hidden states
are (:func:`online_manifest`, in place of the extract stage's manifest), what it starts before
each launch of the training process (:func:`start_online`: the hybrid cache, the disk check,
the extraction servers, the spec the training process reads) and what it checks afterwards
(:func:`online_verification`)."""

from __future__ import annotations

import contextlib
import logging
import shutil
from pathlib import Path
from typing import Any

from ..extract.capture import capture_fingerprint
from ..extract.stage import enforce as enforce_extraction
from ..hidden_states.disk import sample_bytes, staged_sample_bytes
from ..runtime.disk import DISK_MARGIN, bytes_under, check_disk
from ..runtime.files import read_json, stable_hash, write_json
from ..runtime.gpus import visible_devices
from ..runtime.results import ONLINE_MANIFEST, format_tag
from . import servers, spec

log = logging.getLogger(__name__)


def online_manifest(
    target: dict, extract_cfg: dict, vllm_cfg: dict, own_layers: list[int] | None, dataset_dir
) -> dict[str, Any]:
    """What a manifest says about the hidden states (layers, size, storage, count), for the
    extraction this train job does itself: the layers its method trains on (its own, else
    extract.layer_ids) and the final one, and the capture fingerprint that identifies what a
    sample holds (the training fingerprint's key, in place of the stored samples' hash)."""
    from datasets import load_from_disk

    layers = servers.served_layers(target, extract_cfg, own_layers)
    return {
        "format": format_tag(ONLINE_MANIFEST),
        "mode": extract_cfg["mode"],
        "capture": capture_fingerprint(target, layers["layer_ids"], extract_cfg, vllm_cfg),
        "num_samples": len(load_from_disk(str(dataset_dir))),
        "samples_sha256": None,
        **layers,
        "hidden_size": target["architecture"]["hidden_size"],
        "storage": extract_cfg["storage"],
    }


def kept_rows(
    seq_lens: list[int], num_layers: int, hidden: int, storage: str, budget_gib: float | None
) -> int:
    """Hybrid mode: how many leading rows keep their samples on disk within ``budget_gib``
    (None: all). The rows are prepare's shuffled order, so the kept ones are a random subset;
    the choice is a function of the row index alone, so every process and DataLoader worker
    makes it alike with nothing to share, and a resume makes it again."""
    if budget_gib is None:
        return len(seq_lens)
    budget, used = budget_gib * 2**30, 0
    for i, n in enumerate(seq_lens):
        used += sample_bytes(n, num_layers, hidden, storage)
        if used > budget:
            return i
    return len(seq_lens)


def capture_key(capture: str, dataset_digest: str) -> str:
    """What the hybrid cache's samples were made for: the capture and the rows."""
    return stable_hash({"capture": capture, "dataset": dataset_digest})


def reset_cache(cache: Path, key: str, kept: int, samples_per_shard: int) -> None:
    """Keep the hybrid cache's samples only if they were made for ``key`` (the capture and the
    rows); drop those of rows at or past ``kept`` (a smaller budget)."""
    layout = cache / "layout.json"
    old = read_json(layout) if layout.exists() else {}
    if old.get("key") != key or old.get("samples_per_shard") != samples_per_shard:
        shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True, exist_ok=True)
    write_json(layout, {"key": key, "samples_per_shard": samples_per_shard})
    for f in (cache / "shards").glob("shard_*/hs_*.safetensors*"):
        if f.name.endswith(".partial") or int(f.name.split("_")[1].split(".")[0]) >= kept:
            f.unlink()


def start_online(
    stack: contextlib.ExitStack,
    cfg: dict[str, Any],
    manifest: dict[str, Any],
    target: dict[str, Any],
    dataset_dir: str,
    root: Path,
    fp: dict[str, Any],
    attempt: int,
    train_config: dict[str, Any],
    processes: int,
    log_path: str | None,
) -> list[str] | None:
    """Before a launch in online/hybrid mode: the hybrid cache reset to what it may keep, the
    disk checked, the extraction servers up (in ``stack``), the spec the training process
    reads written. Returns the trainer's GPUs (None on the CPU)."""
    from datasets import load_from_disk

    x, v = cfg["extract"], cfg["vllm"]
    seq_lens = load_from_disk(str(dataset_dir)).with_format(None)["seq_len"]
    layer_ids, hidden = manifest["layer_ids"], manifest["hidden_size"]
    budget = x["hybrid_disk_gib"] if x["mode"] == "hybrid" else 0
    kept = kept_rows(seq_lens, len(layer_ids), hidden, x["storage"], budget)
    cache = root / "kept"
    key = capture_key(manifest["capture"], fp["parts"]["dataset"])
    reset_cache(cache, key, kept, x["samples_per_shard"])
    one = [sample_bytes(n, len(layer_ids), hidden, x["storage"]) for n in seq_lens]
    # each training process and each of its DataLoader workers has one request in flight
    in_flight = processes_in_flight(train_config, processes) * staged_sample_bytes(
        x, max(one, default=0)
    )
    to_keep = sum(one[:kept]) - bytes_under(cache / "shards")
    check_disk(root, max(to_keep, 0) + in_flight, DISK_MARGIN, allow=cfg["allow_low_disk"])
    log.info(
        "hidden states %s: %d of %d rows kept on disk (%.2f GiB), the others generated every "
        "epoch and deleted once loaded",
        x["mode"],
        kept,
        len(seq_lens),
        sum(one[:kept]) / 2**30,
    )
    devices = visible_devices() if v["device"] == "cuda" else []
    x = servers.with_mooncake_master(stack, x, log_path)
    endpoints = stack.enter_context(
        servers.extraction_endpoints(x, v, target, layer_ids, root / "staging", log_path, devices)
    )
    spec.write_spec(
        root / spec.SPEC_FILE,
        endpoints=endpoints,
        model_path=target["model_path"],
        arch=target["architecture"],
        dataset_dir=str(Path(dataset_dir).resolve()),
        num_samples=len(seq_lens),
        layer_ids=layer_ids,
        kept=kept,
        cache=cache,
        samples_per_shard=x["samples_per_shard"],
        ledger=root / "served",
        attempt=attempt,
        extract_cfg=x,
        enforce=cfg["synth_temperature"] == 0,
    )
    if v["device"] != "cuda" or x["endpoints"]:
        return None
    return servers.trainer_devices(devices, x["servers"], v["tensor_parallel_size"], x["colocate"])


def processes_in_flight(train_config: dict[str, Any], processes: int) -> int:
    """Requests online training keeps in flight: one per DataLoader worker (or per process
    without workers) of every training process."""
    return max(1, processes) * max(1, int(train_config.get("num_workers") or 0))


def online_verification(root: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    """The checks of every sample online training was fed, over all attempts, against the
    extraction's thresholds (the agreement as the extract job enforces it: ExtractError)."""
    summary = spec.served_summary(root / "served")
    verification = {
        **summary,
        "next_token_positions_per_sample": cfg["extract"]["agreement_positions_per_sample"],
        "min_next_token_agreement": cfg["extract"]["min_next_token_agreement"],
        "synth_temperature": cfg["synth_temperature"],
        "reference": None,
        "kept_bytes": bytes_under(root / "kept" / "shards"),
    }
    enforce_extraction(verification, cfg["extract"])
    return verification
