"""The train job's own extraction (``extract.mode`` online or hybrid): what its hidden states
are (:func:`online_manifest`, in place of the extract stage's manifest), what it starts before
each launch of the training process (:func:`start_online`: the hybrid cache, the disk check,
the extraction servers, the spec the training process reads) and what it checks afterwards
(:func:`online_verification`). The server side and the training process's backend:
:mod:`eagle3_pipeline.extract.online`, :mod:`eagle3_pipeline.extract.online_transfer`.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

from ..extract import online
from ..extract.capture import ExtractError, capture_fingerprint
from ..extract.stage import enforce as enforce_extraction
from ..hidden_states import mooncake
from ..hidden_states.disk import sample_bytes, staged_sample_bytes
from ..runtime.disk import bytes_under, check_disk
from ..runtime.gpus import visible_devices
from .errors import TrainError

log = logging.getLogger(__name__)


def online_manifest(
    target: dict, extract_cfg: dict, vllm_cfg: dict, own_layers: list[int] | None, dataset_dir
) -> dict[str, Any]:
    """What a manifest says about the hidden states (layers, size, storage, count), for the
    extraction this train job does itself: the layers its method trains on (its own, else
    extract.layer_ids) and the final one, and the capture fingerprint that identifies what a
    sample holds (the training fingerprint's key, in place of the stored samples' hash)."""
    from datasets import load_from_disk

    layers = online.served_layers(target, extract_cfg, own_layers)
    return {
        "format": online.MANIFEST_FORMAT,
        "mode": extract_cfg["mode"],
        "capture": capture_fingerprint(target, layers["layer_ids"], extract_cfg, vllm_cfg),
        "num_samples": len(load_from_disk(str(dataset_dir))),
        "samples_sha256": None,
        **layers,
        "hidden_size": target["architecture"]["hidden_size"],
        "storage": extract_cfg["storage"],
    }


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
    kept = online.kept_rows(seq_lens, len(layer_ids), hidden, x["storage"], budget)
    cache = root / "kept"
    key = online.capture_key(manifest["capture"], fp["parts"]["dataset"])
    online.reset_cache(cache, key, kept, x["samples_per_shard"])
    one = [sample_bytes(n, len(layer_ids), hidden, x["storage"]) for n in seq_lens]
    # each training process and each of its DataLoader workers has one request in flight
    in_flight = processes_in_flight(train_config, processes) * staged_sample_bytes(
        x, max(one, default=0)
    )
    to_keep = sum(one[:kept]) - bytes_under(cache / "shards")
    check_disk(root, max(to_keep, 0) + in_flight, x["disk_margin"], allow=cfg["allow_low_disk"])
    log.info(
        "hidden states %s: %d of %d rows kept on disk (%.2f GiB), the others generated every "
        "epoch and deleted once loaded",
        x["mode"],
        kept,
        len(seq_lens),
        sum(one[:kept]) / 2**30,
    )
    devices = visible_devices() if v["device"] == "cuda" else []
    x = with_mooncake_master(stack, x, log_path)
    endpoints = stack.enter_context(
        online.extraction_endpoints(x, v, target, layer_ids, root / "staging", log_path, devices)
    )
    online.write_spec(
        root / online.SPEC_FILE,
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
    return online.trainer_devices(devices, x["servers"], v["tensor_parallel_size"], x["colocate"])


def with_mooncake_master(stack: contextlib.ExitStack, x: dict, log_path: str | None) -> dict:
    """``extract`` with the Mooncake master its servers and trainer join
    (``extract.transport: mooncake``): the one ``extract.mooncake.master`` names, else one
    started here for the job (in ``stack``)."""
    if x["transport"] != "mooncake" or x["mooncake"]["master"]:
        return x
    master = stack.enter_context(mooncake.running_master(log_path))
    log.info("hidden states through a Mooncake store: master %s started for this job", master)
    return {**x, "mooncake": {**x["mooncake"], "master": master}}


def processes_in_flight(train_config: dict[str, Any], processes: int) -> int:
    """Requests online training keeps in flight: one per DataLoader worker (or per process
    without workers) of every training process."""
    return max(1, processes) * max(1, int(train_config.get("num_workers") or 0))


def online_verification(root: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    """The checks of every sample online training was fed, over all attempts, against the
    extraction's thresholds (the agreement as the extract job enforces it)."""
    summary = online.served_summary(root / "served")
    verification = {
        **summary,
        "next_token_positions_per_sample": cfg["extract"]["agreement_positions_per_sample"],
        "min_next_token_agreement": cfg["extract"]["min_next_token_agreement"],
        "synth_temperature": cfg["synth_temperature"],
        "reference": None,
        "kept_bytes": bytes_under(root / "kept" / "shards"),
    }
    try:
        enforce_extraction(verification, cfg["extract"])
    except ExtractError as e:
        raise TrainError(str(e)) from e
    return verification
