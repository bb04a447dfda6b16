"""The three ways training gets its hidden states (``extract.mode``), side by side: the disk
each one fills at most, the GPUs of a train job, and the time of extraction and training, so a
user can choose before anything runs (docs/train.md, "Hidden states without the disk").

- stored: the extract jobs write every sample, then training reads them each epoch: the disk
  holds them all; extraction and training one after the other.
- online: each train job starts its extraction servers beside the trainer and asks for every
  row every epoch; a sample lives on the disk from the server's write until it is loaded, so
  the disk holds one sample per request in flight. The servers' GPUs are the train job's
  (its own, or with extract.colocate the trainer's).
- hybrid: online, but the rows that fit ``extract.hybrid_disk_gib`` are kept when first made
  and read back later: the disk holds the budget, and later epochs extract only the rest.

Training and extraction overlap when training has DataLoader workers (they ask while the
trainer steps); without (the CPU default) the trainer waits for each sample, and the times
add up. Every figure is an estimate from the measured rates the stage table uses. Role:
infrastructure, like the plan.
"""

from __future__ import annotations

from typing import Any

from ..config import extraction_server_gpus
from ..hidden_states.disk import staged_sample_bytes

MODES = ("stored", "online", "hybrid")


# train.num_workers auto on GPUs: min(12, cores per GPU - 2) on the node that trains, which the
# plan does not know: the most it can be, so the disk figure is an upper bound
AUTO_WORKERS_ON_GPUS = 12


def loader_workers(cfg: dict) -> int:
    """DataLoader workers per training process: train.num_workers, auto as the most it gives
    (0 on the CPU, :data:`AUTO_WORKERS_ON_GPUS` on GPUs)."""
    train = cfg["train"]
    if train["num_workers"] != "auto":
        return int(train["num_workers"])
    return AUTO_WORKERS_ON_GPUS if train["gpus"] > 0 else 0


def requests_in_flight(cfg: dict) -> int:
    """Samples a train job has asked for and not yet loaded: one per DataLoader worker (one
    per process without workers) of each of its training processes."""
    train = cfg["train"]
    return max(train["gpus"], 1) * train["nodes"] * max(1, loader_workers(cfg))


def mode_estimates(
    cfg: dict,
    stored_bytes: int | None,
    largest_sample_bytes: int,
    extract_estimate: dict | None,
    train_estimate: dict | None,
    load_s: float,
    tokens: float | None,
) -> dict[str, dict[str, Any]]:
    """Per mode: ``disk_bytes`` (the high-water mark of hidden states on the disk, every train
    job at once), ``kept_bytes`` (hybrid: what one job keeps), ``train_gpus`` (trainer,
    servers), ``seconds`` and ``bound`` of extraction plus training (None where a rate is
    missing) and how they are made up.

    ``extract_estimate``/``train_estimate`` are the stored mode's stage estimates (extract:
    extract.jobs jobs over the rows once; train: the rows' epochs), ``load_s`` one model
    load, ``tokens`` the rows' tokens."""
    x, train = cfg["extract"], cfg["train"]
    jobs = len(train["methods"])
    epochs = train["epochs"]
    trainer = train["gpus"] * train["nodes"]
    servers = x["servers"] if not x["endpoints"] else len(x["endpoints"])
    in_flight = jobs * requests_in_flight(cfg) * staged_sample_bytes(x, largest_sample_bytes)
    budget = None if x["hybrid_disk_gib"] is None else int(x["hybrid_disk_gib"] * 2**30)
    kept = stored_bytes if budget is None or stored_bytes is None else min(budget, stored_bytes)
    kept_fraction = 1.0 if not stored_bytes else (kept or 0) / stored_bytes
    overlapped = loader_workers(cfg) > 0
    # a train job over several nodes reaches only servers named in extract.endpoints
    needs_endpoints = train["nodes"] > 1 and not x["endpoints"]
    out: dict[str, dict[str, Any]] = {}

    def timing(extract_s: float | None, how: str) -> dict[str, Any]:
        if extract_s is None or train_estimate is None:
            return {"seconds": None, "bound": None}
        train_s = train_estimate["seconds"] / jobs  # the stage estimate counts every job
        if how == "stored":
            seconds = extract_s + train_s
        else:
            seconds = (max if overlapped else sum)((extract_s, train_s)) + (
                0 if x["endpoints"] else load_s
            )
        bounds = {e["bound"] for e in (extract_estimate, train_estimate)} - {"~"}
        return {"seconds": round(seconds), "bound": bounds.pop() if len(bounds) == 1 else "~"}

    stored_extract_s = extract_estimate["seconds"] if extract_estimate else None
    out["stored"] = {
        "disk_bytes": stored_bytes,
        "train_gpus": {"trainer": trainer, "servers": 0},
        **timing(stored_extract_s, "stored"),
        "how": "extract jobs, then training",
    }
    rate = extract_estimate["rate"] if extract_estimate else None
    for mode, passes in (("online", epochs), ("hybrid", 1 + (epochs - 1) * (1 - kept_fraction))):
        extract_s = tokens * passes / (servers * rate) if rate and tokens else None
        out[mode] = {
            "disk_bytes": in_flight + (jobs * kept if mode == "hybrid" and kept else 0),
            "kept_bytes": kept if mode == "hybrid" else 0,
            "train_gpus": {
                "trainer": trainer,
                "servers": extraction_server_gpus(cfg),
                "colocated": bool(x["colocate"] and not x["endpoints"] and trainer),
            },
            "extraction_passes": round(passes, 2),
            **timing(extract_s, mode),
            "how": (
                f"{passes:.2f} extraction passes over the rows on {servers} server(s) "
                + ("beside" if overlapped else "then")
                + " training"
                + ("; train.nodes > 1 needs extract.endpoints" if needs_endpoints else "")
            ),
        }
    return out
