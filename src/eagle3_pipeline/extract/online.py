"""Extraction on demand, inside training (``extract.mode`` online and hybrid): the train job's
side. Before it launches the training process, the train stage decides which rows hybrid mode
keeps on disk (:func:`kept_rows`, :func:`reset_cache`), starts the extraction servers or checks
those of ``extract.endpoints`` (:func:`extraction_endpoints`), and writes the spec the training
process's backend reads (:func:`write_spec`); afterwards it sums up what training was fed
(:func:`served_summary`). The backend itself (what runs in the training process):
:mod:`.online_transfer`. Light at import: the plan imports the train stage.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from pathlib import Path
from typing import Any

from ..engine.spec import with_memory_share
from ..hidden_states.disk import sample_bytes
from ..hidden_states.layers import resolve_layers
from ..runtime.files import AppendLog, read_json, stable_hash, write_json
from .capture import server_spec

log = logging.getLogger(__name__)

SPEC_FILE = "online.json"  # in the hidden-states path the backend is given
SPEC_FORMAT = "eagle3-pipeline/online-hidden-states@1"
# What the train job's own record of its hidden states says instead of a manifest's format
MANIFEST_FORMAT = "eagle3-pipeline/online-manifest@1"


def served_layers(target: dict, extract_cfg: dict, own_layers: list[int] | None) -> dict:
    """The layers one train job's extraction captures: those its method trains on (its own,
    else extract.layer_ids or the target's default) and the final one. Only its own: where
    the extract stage captures every method's layers once, each train job here asks for what
    it reads. An extraction server of extract.endpoints must capture exactly these."""
    aux, captured, final = resolve_layers(
        {"layer_ids": own_layers or extract_cfg["layer_ids"]}, target["architecture"]
    )
    return {"aux_layer_ids": aux, "layer_ids": [*captured, final], "final_layer_id": final}


def endpoint_spec(config: dict, target: dict, drafter: str, staging: str | Path):
    """The server an ``extract.endpoints`` entry must be: the target with the pipeline's
    connector, capturing the layers the train job of ``drafter`` reads
    (:func:`served_layers`), writing its samples under ``staging``."""
    from ..config import drafter_train_config
    from ..methods import layer_ids_of

    own = layer_ids_of(drafter_train_config(config, drafter))
    layers = served_layers(target, config["extract"], own)["layer_ids"]
    return server_spec(config["vllm"], target, layers, Path(staging), config["extract"])


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


def endpoint_gpus(
    devices: list[str], server: int, tensor_parallel_size: int, colocate: bool = False
) -> list[str]:
    """The devices of extraction server ``server``: the job's first ones, TP each, and the
    trainer gets what follows them (:func:`trainer_devices`); colocated, the trainer's own
    from ``server`` * TP on, wrapping around (the config checks that TP fits in them)."""
    start = server * tensor_parallel_size
    if colocate and devices:
        return [devices[(start + i) % len(devices)] for i in range(tensor_parallel_size)]
    return devices[start : start + tensor_parallel_size]


def trainer_devices(
    devices: list[str], servers: int, tensor_parallel_size: int, colocate: bool = False
) -> list[str]:
    return list(devices) if colocate else devices[servers * tensor_parallel_size :]


def servers_per_gpu(servers: int, tensor_parallel_size: int, gpus: int) -> int:
    """The most colocated extraction servers that one of ``gpus`` GPUs holds."""
    return -(-servers * tensor_parallel_size // max(gpus, 1))


@contextlib.contextmanager
def extraction_endpoints(
    extract_cfg: dict,
    vllm_cfg: dict,
    target: dict,
    layer_ids: list[int],
    staging: Path,
    log_path: str | None,
    devices: list[str],
):
    """The extraction servers training asks, as ``[{"base_url", "model"}]``: those of
    ``extract.endpoints`` (checked to answer), or ``extract.servers`` servers started here with
    the pipeline's connector (each writing under ``staging/server_<k>``, on its share of
    ``devices``, or with ``extract.colocate`` on the trainer's, with a share of their memory),
    stopped on exit."""
    from ..server import VllmServer, external_endpoint

    if extract_cfg["endpoints"]:
        found = []
        for url in extract_cfg["endpoints"]:
            ep = external_endpoint(url)
            found.append({"base_url": ep.base_url, "model": ep.model})
        log.info("extraction servers of extract.endpoints: %s", [e["base_url"] for e in found])
        yield found
        return
    shutil.rmtree(staging, ignore_errors=True)  # files a killed attempt left
    with contextlib.ExitStack() as stack:
        found = []
        for spec in server_specs(extract_cfg, vllm_cfg, target, layer_ids, staging, devices):
            server = stack.enter_context(VllmServer(spec, log_path))
            found.append({"base_url": server.base_url, "model": server.model_name})
        yield found
    shutil.rmtree(staging, ignore_errors=True)


def server_specs(
    extract_cfg: dict,
    vllm_cfg: dict,
    target: dict,
    layer_ids: list[int],
    staging: Path,
    devices: list[str],
) -> list:
    """The ``extract.servers`` servers a train job starts: each writing under
    ``staging/server_<k>``; on GPUs, on its devices (:func:`endpoint_gpus`) and, colocated,
    with its part of extract.colocated_gpu_memory (the trainer, started after them, has the
    rest of the memory)."""
    tp, servers = vllm_cfg["tensor_parallel_size"], extract_cfg["servers"]
    colocate = extract_cfg["colocate"]
    specs = []
    for k in range(servers):
        spec = server_spec(vllm_cfg, target, layer_ids, staging / f"server_{k}", extract_cfg)
        if vllm_cfg["device"] == "cuda":
            spec.env["CUDA_VISIBLE_DEVICES"] = ",".join(endpoint_gpus(devices, k, tp, colocate))
            if colocate:
                share = extract_cfg["colocated_gpu_memory"]
                per_gpu = servers_per_gpu(servers, tp, len(devices))
                spec.extra_args = with_memory_share(spec.extra_args, share / per_gpu)
        specs.append(spec)
    return specs


def write_spec(
    path: Path,
    *,
    endpoints: list[dict],
    model_path: str,
    arch: dict,
    dataset_dir: str,
    num_samples: int,
    layer_ids: list[int],
    kept: int,
    cache: Path,
    samples_per_shard: int,
    ledger: Path,
    attempt: int,
    extract_cfg: dict,
    enforce: bool,
) -> dict:
    """The spec the training process's backend reads (:data:`SPEC_FILE`): plain values."""
    spec = {
        "format": SPEC_FORMAT,
        "endpoints": endpoints,
        "model_path": model_path,
        "arch": arch,
        "dataset_dir": dataset_dir,
        "num_samples": num_samples,
        "layer_ids": layer_ids,
        "hidden_size": arch["hidden_size"],
        "kept_rows": kept,
        "cache": str(cache),
        "samples_per_shard": samples_per_shard,
        "ledger": str(ledger),
        "attempt": attempt,
        "positions_per_sample": extract_cfg["agreement_positions_per_sample"],
        "min_next_token_agreement": extract_cfg["min_next_token_agreement"],
        "enforce_agreement": enforce,
        "request_timeout_s": extract_cfg["request_timeout_s"],
        "retries": extract_cfg["retries"],
        "verify_device": extract_cfg["verify_device"],
        "transport": extract_cfg["transport"],
        "mooncake": extract_cfg["mooncake"] if extract_cfg["transport"] == "mooncake" else None,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, spec)
    return spec


def read_ledger(ledger: Path) -> list[dict]:
    """Every line of every process's ledger (torn last lines dropped), by time."""
    rows = [r for f in sorted(Path(ledger).glob("*.jsonl")) for r in AppendLog(f).read()]
    return sorted(rows, key=lambda r: r["t"])


def served_summary(ledger: Path) -> dict[str, Any]:
    """What online training was fed, over all attempts: samples generated by a server and read
    back from the hybrid cache, tokens, the largest sample (what one request in flight puts on
    the disk), and the next-token agreement of every generated sample."""
    rows = read_ledger(ledger)
    made = [r for r in rows if r["source"] == "generated"]
    checked = sum(r["checked"] for r in made)
    hits = sum(r["hits"] for r in made)
    return {
        "samples_generated": len(made),
        "samples_from_disk": sum(r["source"] == "cache" for r in rows),
        "samples_kept": sum(bool(r.get("kept")) for r in made),
        "tokens_generated": sum(r["tokens"] for r in made),
        "bytes_generated": sum(r["bytes"] for r in made),
        "largest_sample_bytes": max((r["bytes"] for r in made), default=0),
        "next_token_agreement": hits / checked if checked else None,
        "next_token_positions": checked,
        "samples_probed": sum(1 for r in made if r["checked"]),
    }


def capture_key(capture: str, dataset_digest: str) -> str:
    """What the hybrid cache's samples were made for: the capture and the rows."""
    return stable_hash({"capture": capture, "dataset": dataset_digest})
