"""Each GPU stage of a run at the scale its config asks for: how many jobs, the GPUs of each,
the wall time, the GPU-hours and, where a stage writes or reads them, the hidden-state bytes.

A stage's jobs run at once, each on its own GPUs (a node each under Slurm at tensor
parallelism 8), so its wall time is the slowest job's: its share of the stage's work at a rate
measured in this repository (:mod:`.rates`, the measurement nearest the target's size) plus one
model load at the speed the Kimi-K2.5 profiles state. GPU-hours are jobs x GPUs per job x that
wall time. Every figure is an estimate and carries where its rate comes from. Role:
infrastructure, like the plan that prints them.
"""

from __future__ import annotations

from typing import Any

from ..config import stage_gpus
from ..train.trainer_config import resolve_auto
from .rates import measured_rate

# How fast a vLLM server loads the target's weights. Not measured: config/kimi-k2.5.yaml
# (vllm.startup_timeout_s) and profiles/slurm/config.yaml state that loading Kimi-K2.5's ~600 GB
# from a shared file system takes 10-40 min. The fast end (1 GB/s) keeps every stage time a
# lower bound, like the rates measured on smaller models.
MODEL_LOAD = {
    "bytes_per_s": 600e9 / (10 * 60),
    "source": (
        "the fast end of the 10-40 min for ~600 GB of weights that profiles/slurm/config.yaml "
        "and config/kimi-k2.5.yaml state; not measured"
    ),
}


def stage_jobs(cfg: dict) -> dict[str, dict[str, Any]]:
    """Jobs and GPUs per job of each GPU stage: from the config alone, so the plan shows them
    even when the target's shape cannot be read."""
    synth, train = cfg["synth"], cfg["train"]
    drafters = len(train["methods"])
    return {
        # with synth.endpoint its jobs are clients of a server running elsewhere: no GPU here
        "synth": {
            "jobs": synth["jobs"],
            "gpus_per_job": stage_gpus(cfg, "synth"),
            "servers_per_job": synth["servers_per_gpu"],
        },
        "extract": {"jobs": cfg["extract"]["jobs"], "gpus_per_job": stage_gpus(cfg, "extract")},
        # one job per drafter, each over train.nodes nodes of train.gpus processes
        "train": {
            "jobs": drafters,
            "gpus_per_job": stage_gpus(cfg, "train") * train["nodes"],
            "nodes_per_job": train["nodes"],
        },
        # one job per drafter, and the shared baseline's when it is measured on its own
        "bench": {
            "jobs": drafters + (cfg["bench"]["pairing"] == "separate"),
            "gpus_per_job": stage_gpus(cfg, "bench"),
        },
    }


def train_batch(cfg: dict) -> dict[str, Any]:
    """Tokens of one optimizer step over every process: speculators packs up to
    train.total_seq_len tokens per process and step, and uses train.lr as given whatever the
    number of processes (nothing scales it)."""
    train = cfg["train"]
    per_process = resolve_auto(train)["total_seq_len"]
    processes = max(train["gpus"], 1) * train["nodes"]
    return {
        "tokens_per_process": per_process,
        "processes": processes,
        "gpus_per_node": train["gpus"],
        "nodes": train["nodes"],
        "global_tokens": per_process * processes,
        "lr": train["lr"],
    }


def model_load_seconds(weight_bytes: int) -> float:
    return weight_bytes / MODEL_LOAD["bytes_per_s"]


def job_estimate(
    jobs: dict, work: float | None, rate: dict | None, load_s: float = 0.0, speedup: int = 1
) -> dict[str, Any] | None:
    """One stage's wall time and GPU-hours: ``work`` split evenly over its jobs, each doing
    ``rate`` x ``speedup`` (its processes, for training), plus one model load per job."""
    if not (jobs["jobs"] and work and rate):
        return None
    seconds = work / jobs["jobs"] / (rate["rate"] * max(speedup, 1)) + load_s
    return {
        "seconds": round(seconds),
        "gpu_hours": jobs["jobs"] * jobs["gpus_per_job"] * seconds / 3600,
        "work": work,
        "load_seconds": round(load_s),
        "speedup": max(speedup, 1),
        "bound": rate["bound"],
        "rate": rate["rate"],
        "unit": rate["unit"],
        "measured_on": rate["model"],
        "file": f"benchmarks/results/{rate['file']}",
        "key": rate["key"],
    }


def stage_estimates(
    cfg: dict, shape: dict, rows: dict, jobs: dict, weight_bytes: int, hidden_state_bytes: dict
) -> dict[str, Any]:
    """``jobs`` (:func:`stage_jobs`) with each stage's estimate added, the reason where there is
    none, and the hidden-state bytes (per storage) that extract writes and train reads."""
    device = cfg["vllm"]["device"]
    train = cfg["train"]
    samples, tokens = rows["samples"], rows["tokens"]
    # one load per job (the servers of a synth job that share its GPU load side by side); the
    # load speed assumed is a GPU node's from a shared file system, and on the CPU the rates are
    # the packaged model's, whose load takes seconds
    load_s = model_load_seconds(weight_bytes) if device == "cuda" else 0.0
    out = {stage: dict(j) for stage, j in jobs.items()}

    # synth: every answer up to synth.max_tokens (an upper bound, like the rows); an external
    # endpoint answers at a speed nothing here measured
    answer_tokens = samples * cfg["synth"]["max_tokens"] if samples is not None else None
    synth_rate = measured_rate("synth", device, shape["params_active"])
    out["synth"]["estimate"] = (
        None
        if cfg["synth"]["endpoint"]
        else job_estimate(jobs["synth"], answer_tokens, synth_rate, load_s)
    )
    out["synth"]["work_unit"] = "answer tokens"

    extract_rate = measured_rate("extract", device, shape["params_active"])
    out["extract"]["estimate"] = job_estimate(jobs["extract"], tokens, extract_rate, load_s)
    out["extract"]["work_unit"] = "tokens"
    if hidden_state_bytes:
        out["extract"]["hidden_states"] = {"bytes": hidden_state_bytes, "io": "written"}

    # train: every drafter reads the training rows once per epoch; it loads no target
    processes = jobs["train"]["gpus_per_job"]
    per_drafter = tokens * (1 - train["val_fraction"]) * train["epochs"] if tokens else None
    train_rate = measured_rate(
        "train", "cuda" if processes else "cpu", shape["hidden_size"], by="hidden"
    )
    out["train"]["estimate"] = job_estimate(
        jobs["train"],
        per_drafter * jobs["train"]["jobs"] if per_drafter else None,
        train_rate,
        speedup=processes,
    )
    out["train"]["work_unit"] = f"tokens ({train['epochs']} epochs of the training rows)"
    if hidden_state_bytes:
        out["train"]["hidden_states"] = {"bytes": hidden_state_bytes, "io": "read each epoch"}
    if out["train"]["estimate"] and processes:
        # the rate was measured on a few hidden-state files read again and again (from memory):
        # a shared file system must deliver this much for the GPUs to keep it
        tokens_per_s = train_rate["rate"] * processes
        out["train"]["read_bytes_per_s"] = {
            storage: size / tokens * tokens_per_s for storage, size in hidden_state_bytes.items()
        }

    if cfg["synth"]["endpoint"]:
        out["synth"]["not_estimated"] = "external endpoint (synth.endpoint)"
    out["bench"]["not_estimated"] = "no measured rate for the bench stage"
    for stage in ("synth", "extract", "train"):
        if not out[stage]["estimate"] and "not_estimated" not in out[stage]:
            out[stage]["not_estimated"] = "no rows or no measured rate"
    return out


def run_totals(stages: dict) -> dict[str, Any]:
    """The estimated stages one after another (each waits for the one before): their wall
    times and GPU-hours added up, and which stages are left out."""
    estimated = {s: v["estimate"] for s, v in stages.items() if v.get("estimate")}
    bounds = {e["bound"] for e in estimated.values()} - {"~"}
    return {
        "seconds": sum(e["seconds"] for e in estimated.values()),
        "gpu_hours": sum(e["gpu_hours"] for e in estimated.values()),
        # a lower bound added to estimates of about the right size is still one; a lower and an
        # upper bound added up are neither
        "bound": bounds.pop() if len(bounds) == 1 else "~",
        "stages": list(estimated),
        "left_out": [s for s in stages if s not in estimated],
    }
