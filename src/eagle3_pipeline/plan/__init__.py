"""The plan printed before any job: what the run will need, and whether this machine has it.

From the config and the target's config.json alone (no weights loaded): the target's shape,
the layers EAGLE-3 reads, the draft vocabulary, the tokens and hidden-state bytes the run
will produce against the free disk where they go, the weights against GPU memory at the
tensor-parallel size, and per stage its jobs, GPUs, wall time, GPU-hours and hidden-state
bytes in both storages, from rates measured in benchmarks/results/ (estimates, :mod:`.stages`).
A real run is refused before its first job when the disk or the GPUs cannot hold it
(``plan.allow`` overrides); a dry run prints the same as warnings. What the user reads:
:func:`.text.format_plan`. After a failed run the workflow says what its long stages kept
(:mod:`.kept`): the same command resumes from it.

The extract and train jobs check their disk with the same code
(:func:`eagle3_pipeline.runtime.disk.check_disk`), on the rows they really have. Role:
infrastructure (its folder: staleness.code.role) — the plan decides whether and where a run
starts, never what a stage computes; no stage's result depends on it.
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
from pathlib import Path
from typing import Any

from ..engine.spec import memory_utilization
from ..hidden_states.disk import BYTES_PER_VALUE, sample_bytes
from ..hidden_states.layers import LayerIdError, resolve_layers
from ..methods import extra_layer_ids
from ..online.servers import servers_per_gpu
from ..runtime import disk
from ..runtime.disk import ALLOW_KEY, DISK_MARGIN, GIB, bytes_under, disk_problem
from ..runtime.gpus import nvidia_smi_rows
from ..target import serving
from . import model_shape
from .modes import mode_estimates
from .stages import (
    MODEL_LOAD,
    model_load_seconds,
    run_totals,
    stage_estimates,
    stage_jobs,
    train_batch,
)
from .text import format_plan  # noqa: F401  (the plan's face: make_plan, format_plan, write)

log = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4  # English text; a prompt has at most prompts.max_chars characters


# ---- GPU memory -------------------------------------------------------------------------------


def gpu_memory_gib(setting) -> tuple[float | None, str]:
    """Memory of one GPU: vllm.gpu_memory_gib, or with auto the smallest GPU nvidia-smi
    lists on the planning machine (none there, e.g. a cluster login node: unknown)."""
    if setting != "auto":
        return float(setting), "vllm.gpu_memory_gib"
    try:
        rows = nvidia_smi_rows("gpu=memory.total", timeout=20)
        if rows is None:
            return None, "unknown: no nvidia-smi here; set vllm.gpu_memory_gib"
        mib = [float(r[0]) for r in rows]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None, "unknown: nvidia-smi failed; set vllm.gpu_memory_gib"
    if not mib:
        return None, "unknown: nvidia-smi lists no GPU; set vllm.gpu_memory_gib"
    return min(mib) / 1024, f"nvidia-smi ({len(mib)} GPU(s))"


def shared_gpu_problems(cfg: dict, weights: int, gib: float, memory: dict) -> list[dict]:
    """synth.servers_per_gpu servers on one GPU share the memory one server may use: each must
    still hold the weights (a tensor-parallel size of 1 is the only one allowed with them)."""
    servers = cfg["synth"]["servers_per_gpu"]
    if servers == 1:
        return []
    util = memory_utilization([*cfg["vllm"]["extra_args"], *cfg["synth"]["server_args"]])
    memory["synth_servers_per_gpu"] = servers
    memory["synth_server_share"] = util / servers
    if weights <= gib * GIB * util / servers:
        return []
    fit = max(math.floor(gib * GIB * util / weights), 1)
    return [
        {
            "check": "gpu_memory",
            "message": (
                f"synth.servers_per_gpu: {servers} synth servers share each GPU, each with "
                f"{util}/{servers} of its {gib:.0f} GiB = {gib * util / servers:.1f} GiB, less "
                f"than the target's {weights / GIB:.1f} GiB of weights. Set "
                f"synth.servers_per_gpu to at most {fit}, or set {ALLOW_KEY}: [gpu_memory] to "
                "proceed anyway."
            ),
        }
    ]


def colocated_problems(cfg: dict, weights: int, gib: float, memory: dict) -> list[dict]:
    """extract.colocate: the train job's extraction servers share the trainer's GPUs in
    extract.colocated_gpu_memory of each; each server's part of its GPUs must still hold its
    part of the weights."""
    x, tp = cfg["extract"], cfg["vllm"]["tensor_parallel_size"]
    if x["mode"] == "stored" or not x["colocate"] or x["endpoints"]:
        return []
    per_gpu = servers_per_gpu(x["servers"], tp, cfg["train"]["gpus"])
    share = x["colocated_gpu_memory"] / per_gpu
    memory["extraction_servers_per_trainer_gpu"] = per_gpu
    memory["extraction_server_share"] = share
    if weights / tp <= gib * GIB * share:
        return []
    return [
        {
            "check": "gpu_memory",
            "message": (
                f"extract.colocate: {per_gpu} extraction server(s) on each trainer GPU, each "
                f"with {share:.2f} of its {gib:.0f} GiB = {gib * share:.1f} GiB, less than "
                f"the {weights / tp / GIB:.1f} GiB of weights one holds at "
                f"vllm.tensor_parallel_size {tp}. Raise extract.colocated_gpu_memory, lower "
                "extract.servers, set extract.colocate: false (servers on GPUs of their own), "
                f"or set {ALLOW_KEY}: [gpu_memory] to proceed anyway."
            ),
        }
    ]


# ---- the plan ---------------------------------------------------------------------------------


def expected_rows(cfg: dict, run: Path) -> dict[str, Any]:
    """Training rows and their tokens: measured (prepare/stats.json of this run) when synth
    and prepare have run, else an upper bound from the config."""
    stats = run / "prepare" / "stats.json"
    try:
        s = json.loads(stats.read_text())
    except (OSError, ValueError):  # not there yet (or an empty placeholder): the bound below
        s = {}
    if isinstance(s, dict) and s.get("rows_kept") and s.get("tokens_total"):
        return {
            "samples": s["rows_kept"],
            "tokens": s["tokens_total"],
            "tokens_per_sample": s["tokens_total"] / s["rows_kept"],
            "how": f"measured ({stats})",
        }
    ns = [src.get("n") for src in cfg["prompts"]["train"]]
    samples = None if None in ns else max(sum(ns) - cfg["prompts"]["heldout"], 0)
    per = min(
        cfg["prepare"]["seq_length"],
        math.ceil(cfg["prompts"]["max_chars"] / CHARS_PER_TOKEN) + cfg["synth"]["max_tokens"],
    )
    how = (
        f"upper bound: prompt <= prompts.max_chars/{CHARS_PER_TOKEN} tokens + "
        "synth.max_tokens, cut at prepare.seq_length"
    )
    if any(src.get("each_turn") for src in cfg["prompts"]["train"]):
        how += "; each_turn sources give more samples than prompts"
    return {
        "samples": samples,
        "tokens": samples * per if samples is not None else None,
        "tokens_per_sample": per,
        "how": how,
    }


def make_plan(cfg: dict, run: str | Path) -> dict[str, Any]:
    """Everything the plan shows, as a JSON-able dict; ``problems`` lists the refusals."""
    run = Path(run)
    problems: list[dict[str, str]] = []
    plan: dict[str, Any] = {"run": str(run), "problems": problems, "mode": cfg["extract"]["mode"]}
    v, x = cfg["vllm"], cfg["extract"]
    try:
        raw, where, model_dir, index_total = model_shape.read_config(cfg["target"], run)
    except model_shape.TargetNotFound as err:
        problems.append({"check": "hub", "message": str(err)})
        raw = None
    except (OSError, ValueError) as err:  # an unreadable config.json: the target job fails too
        problems.append({"check": "target", "message": f"cannot read the target's config: {err}"})
        raw = None
    jobs = stage_jobs(cfg)
    plan["stages"] = jobs
    plan["train_batch"] = train_batch(cfg)
    rows = expected_rows(cfg, run)
    plan["rows"] = rows
    plan["draft_vocab_size"] = cfg["vocab"]["draft_vocab_size"]
    if raw is None:
        return plan
    try:
        shape = model_shape.shape(raw)
    except (KeyError, TypeError) as err:
        msg = (
            f"{where} has no {err}: not a model config.json the plan (or the target job) can "
            "read; point target.path at the model directory (for a dry run without the "
            "weights, a directory with the model's published config.json)"
        )
        problems.append({"check": "target", "message": msg})
        return plan
    dtype = cfg["target"]["dtype"] if cfg["target"]["source"] == "packaged" else None
    weights, weights_how = model_shape.weight_bytes(raw, model_dir, index_total, dtype)
    served = serving.facts(raw)
    plan["target"] = {
        **shape,
        "config_from": where,
        "weight_bytes": weights,
        "weight_bytes_from": weights_how,
        "served_dtype": serving.served_dtype(v["device"], v["dtype"], served),
        "server_args_added": serving.required_server_args(served, v["extra_args"]),
    }
    remote_tokenizer = serving.tokenizer_is_remote_code(model_dir)
    for message in serving.problems(cfg, served, remote_tokenizer):
        problems.append({"check": "target_class", "message": message})
    try:
        aux, captured, final = resolve_layers(
            {"layer_ids": x["layer_ids"], "method_layer_ids": extra_layer_ids(cfg["train"])},
            shape,
        )
    except LayerIdError as err:
        problems.append({"check": "layers", "message": str(err)})
        return plan
    plan["layers"] = {"aux": aux, "captured": [*captured, final], "final": final}
    # both storages, whichever is configured: the user sees what the other one would take
    by_storage = {
        storage: rows["samples"]
        * sample_bytes(
            round(rows["tokens_per_sample"]), len(captured) + 1, shape["hidden_size"], storage
        )
        for storage in BYTES_PER_VALUE
        if rows["samples"] is not None
    }
    online = x["mode"] != "stored"
    # online/hybrid the train jobs' work directories hold what is on the disk (their hybrid
    # caches, the samples in flight)
    hs_dir = run / ("train_work" if online else "hidden_states")
    largest = sample_bytes(
        cfg["prepare"]["seq_length"], len(captured) + 1, shape["hidden_size"], x["storage"]
    )
    if by_storage:
        total = by_storage[x["storage"]]
        stored = bytes_under(hs_dir)
        free, on = disk.free_bytes(hs_dir)
        plan["disk"] = {
            "hidden_state_bytes": total,
            "already_stored_bytes": stored,
            "storage": x["storage"],
            "bytes_by_storage": by_storage,
            "free_bytes": free,
            "free_at": str(on),
            "margin": DISK_MARGIN,
            "how": rows["how"],
        }
        if not online:
            problem = disk_problem(max(total - stored, 0), free, DISK_MARGIN, on)
            if problem:
                problems.append({"check": "disk", "message": problem})
    if v["device"] == "cuda":
        tp = v["tensor_parallel_size"]
        gib, gib_from = gpu_memory_gib(v["gpu_memory_gib"])
        util = memory_utilization([*v["extra_args"], *x["server_args"]])
        plan["gpu_memory"] = {
            "weights_per_gpu_bytes": weights // tp,
            "tensor_parallel_size": tp,
            "gpu_gib": gib,
            "gpu_gib_from": gib_from,
            "utilization": util,
        }
        if gib is not None and weights / tp > gib * GIB * util:
            need_tp = math.ceil(weights / (gib * GIB * util))
            msg = (
                f"the target's weights ({weights / GIB:.0f} GiB, {weights_how}) need "
                f"{weights / tp / GIB:.1f} GiB per GPU at vllm.tensor_parallel_size: {tp}, "
                f"but vLLM may use {util} of a {gib:.0f} GiB GPU ({gib_from}) = "
                f"{gib * util:.1f} GiB. Set vllm.tensor_parallel_size to at least {need_tp} "
                "(it must divide the attention heads), use GPUs with more memory (set "
                f"vllm.gpu_memory_gib if it is read wrongly), or set {ALLOW_KEY}: "
                "[gpu_memory] to proceed anyway."
            )
            problems.append({"check": "gpu_memory", "message": msg})
        elif gib is not None:
            problems += shared_gpu_problems(cfg, weights, gib, plan["gpu_memory"])
            problems += colocated_problems(cfg, weights, gib, plan["gpu_memory"])
        plan["model_load"] = {
            "seconds": round(model_load_seconds(weights)),
            "weight_bytes": weights,
            "bytes_per_s": MODEL_LOAD["bytes_per_s"],
            "source": MODEL_LOAD["source"],
        }
    stages = stage_estimates(cfg, shape, rows, jobs, weights, by_storage)
    plan["modes"] = mode_estimates(
        cfg,
        by_storage.get(x["storage"]),
        largest,
        stages["extract"].get("estimate"),
        stages["train"].get("estimate"),
        model_load_seconds(weights) if v["device"] == "cuda" else 0.0,
        rows["tokens"],
    )
    if online:
        in_train(stages, plan["modes"][x["mode"]], x["mode"])
        high_water = plan["modes"][x["mode"]]["disk_bytes"]
        if high_water is not None and by_storage:
            plan["disk"]["hidden_state_bytes"] = high_water
            remedy = (
                "lower extract.hybrid_disk_gib (hybrid keeps that much per train job) or "
                "train.num_workers (a sample on the disk per request in flight)"
            )
            problem = disk_problem(max(high_water - stored, 0), free, DISK_MARGIN, on, remedy)
            if problem:
                problems.append({"check": "disk", "message": problem})
    plan["stages"] = stages
    plan["totals"] = run_totals(stages)
    return plan


def in_train(stages: dict, mode: dict, name: str) -> None:
    """extract.mode online/hybrid: no extract stage; the train jobs extract, on their own
    servers' GPUs too, in the time of ``mode`` (:func:`mode_estimates`)."""
    stages.pop("extract")
    train = stages["train"]
    train.pop("hidden_states", None)
    train.pop("read_bytes_per_s", None)
    e = train.get("estimate")
    if e and mode["seconds"] is not None:
        seconds = mode["seconds"]
        train["estimate"] = {
            **e,
            "seconds": seconds,
            "gpu_hours": train["jobs"] * train["gpus_per_job"] * seconds / 3600,
            "bound": mode["bound"],
        }
    train["extracts"] = {
        "mode": name,
        "how": mode["how"],
        "training_seconds": e["seconds"] if e else None,
    }


def refusals(plan: dict, cfg: dict) -> list[str]:
    """The problems a real run stops for: those ``plan.allow`` does not list."""
    allowed = set(cfg["plan"]["allow"])
    return [p["message"] for p in plan["problems"] if p["check"] not in allowed]


def write(plan: dict, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plan, indent=1, sort_keys=True) + "\n")
