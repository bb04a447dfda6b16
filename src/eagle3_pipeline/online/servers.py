"""The extraction servers of a train job (``extract.mode`` online and hybrid): the layers they
capture (:func:`served_layers`), their GPUs beside the trainer's or on them
(:func:`endpoint_gpus`, :func:`trainer_devices`), the servers started for the job or those of
``extract.endpoints`` (:func:`extraction_endpoints`), the Mooncake master they and the trainer
join (:func:`with_mooncake_master`), and the server an ``extract.endpoints`` entry must be
(:func:`endpoint_spec`, for scripts/extraction_server.py)."""

from __future__ import annotations

import contextlib
import logging
import shutil
from pathlib import Path

from ..engine.spec import with_memory_share
from ..extract.capture import server_spec
from ..hidden_states import mooncake
from ..hidden_states.layers import resolve_layers
from ..server import VllmServer, external_endpoint

log = logging.getLogger(__name__)


def served_layers(target: dict, extract_cfg: dict, own_layers: list[int] | None) -> dict:
    """The layers one train job's extraction captures: those its method trains on (its own,
    else extract.layer_ids or the target's default) and the final one. Only its own: where
    the extract stage captures every method's layers once, each train job here asks for what
    it reads. An extraction server of extract.endpoints must capture exactly these."""
    aux, captured, final = resolve_layers(
        {"layer_ids": own_layers or extract_cfg["layer_ids"]}, target["architecture"]
    )
    return {"aux_layer_ids": aux, "layer_ids": [*captured, final], "final_layer_id": final}


def endpoint_spec(
    extract_cfg: dict,
    vllm_cfg: dict,
    target: dict,
    own_layers: list[int] | None,
    staging: str | Path,
):
    """The server an ``extract.endpoints`` entry must be: the target with the pipeline's
    connector, capturing the layers of the train job whose method has ``own_layers``
    (:func:`served_layers`), writing its samples under ``staging``."""
    layers = served_layers(target, extract_cfg, own_layers)["layer_ids"]
    return server_spec(vllm_cfg, target, layers, Path(staging), extract_cfg)


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


def with_mooncake_master(stack: contextlib.ExitStack, x: dict, log_path: str | None) -> dict:
    """``extract`` with the Mooncake master its servers and trainer join
    (``extract.transport: mooncake``): the one ``extract.mooncake.master`` names, else one
    started here for the job (in ``stack``)."""
    if x["transport"] != "mooncake" or x["mooncake"]["master"]:
        return x
    master = stack.enter_context(mooncake.running_master(log_path))
    log.info("hidden states through a Mooncake store: master %s started for this job", master)
    return {**x, "mooncake": {**x["mooncake"], "master": master}}
