"""The train stage itself: map the config, keep or discard earlier checkpoints, launch
speculators' trainer, export the best checkpoint, write metrics, plot and consistency record."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path
from typing import Any

from .. import methods
from ..extract.capture import ExtractError
from ..methods import consistency, layer_ids_of
from ..online.job import online_manifest, online_verification, start_online
from ..runtime.files import AppendLog, read_json, write_json
from ..runtime.provenance import provenance
from .checkpoints import CHECKPOINTS, best_checkpoint, clean_checkpoints, training_finished
from .errors import TrainError
from .export import export_checkpoint
from .fingerprint import ONLINE_DIR, fingerprint, prepare_work_dir
from .launcher import child_env, launch, launch_command, multi_node_command
from .metrics import METRICS_FORMAT, RECORDS, read_records, summarize
from .plot import plot
from .trainer_config import (
    ONLINE_BACKEND,
    SHARDS_BACKEND,
    draft_vocab_size_of,
    resolve_auto,
    trainer_args,
)

log = logging.getLogger(__name__)


def require_torch_format(dataset_dir: Path) -> None:
    """speculators' ArrowDataset compares tensors, so the dataset must be saved in torch format
    (as prepare and speculators' prepare-data save it)."""
    state = dataset_dir / "state.json"
    if not (state.exists() and json.loads(state.read_text()).get("_format_type") == "torch"):
        raise TrainError(
            f"{dataset_dir} is not a dataset saved in torch format (set_format('torch')), as the "
            "prepare stage writes it"
        )


def run(
    target_json: str,
    dataset_dir: str,
    manifest_path: str | None,
    d2t: str,
    t2d: str,
    drafter_dir: str,
    metrics_out: str,
    plot_out: str,
    cfg: dict[str, Any],
    work_dir: str,
    log_path: str | None = None,
    online: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train (or resume) and export the drafter of ``cfg["method"]`` (the default method when
    absent); returns
    the metrics written. ``cfg`` is that method's train config
    (:func:`eagle3_pipeline.methods.method_train_config`) with the operational keys.

    ``online`` (extract.mode online or hybrid; ``manifest_path`` is then None): the job's own
    extraction, ``{"extract": section, "vllm": section, "synth_temperature": float,
    "allow_low_disk": bool}``: the training process asks extraction servers for each sample
    (:mod:`eagle3_pipeline.online`)."""
    t0 = time.time()
    method = methods.of(cfg).name
    target_info = read_json(target_json)
    verifier = str(Path(target_info["model_path"]).resolve())
    work = Path(work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    if online is None:
        manifest_path = Path(manifest_path).resolve()
        manifest = read_json(manifest_path)
        hs_root = Path(manifest.get("root") or manifest_path.parent).resolve()
        backend = SHARDS_BACKEND
    else:
        manifest = online_manifest(
            target_info, online["extract"], online["vllm"], layer_ids_of(cfg), dataset_dir
        )
        hs_root = work / ONLINE_DIR
        backend = ONLINE_BACKEND
    gpus = int(cfg.get("gpus", 0))
    nodes = int(cfg.get("nodes", 1))
    target_window = consistency.target_model_window(verifier)
    if cfg.get("sliding_window") is None and target_window is not None:
        log.warning(
            "vLLM applies the target's model-wide sliding window (%d) to draft layers "
            "without one: training the drafter with the same window",
            target_window,
        )
        cfg = {**cfg, "sliding_window": target_window}
    dataset_dir = str(Path(dataset_dir).resolve())
    require_torch_format(Path(dataset_dir))
    d2t, t2d = Path(d2t).resolve(), Path(t2d).resolve()
    k = draft_vocab_size_of(d2t)
    save_path = work / CHECKPOINTS
    records_path = work / RECORDS
    # the method's own layers, or the ones extraction captured for every method
    aux_layer_ids = layer_ids_of(cfg) or manifest["aux_layer_ids"]

    train_config, backend_args = trainer_args(
        cfg,
        verifier_path=verifier,
        dataset_dir=dataset_dir,
        hidden_states_root=str(hs_root),
        aux_layer_ids=aux_layer_ids,
        d2t_path=str(d2t),
        t2d_path=str(t2d),
        draft_vocab_size=k,
        save_path=str(save_path),
        log_dir=str(work / "logs"),
        backend=backend,
    )
    fp = fingerprint(
        train_config=train_config,
        gpus=gpus,
        nodes=nodes,
        dataset_dir=dataset_dir,
        manifest=manifest,
        d2t=d2t,
        t2d=t2d,
        target=target_info,
    )
    kept = prepare_work_dir(work, fp)
    scheduler = train_config["scheduler_type"] != "none"
    log.info(
        "train %s: %d epoch(s), %s, draft vocab %d, aux layers %s, %s",
        method,
        cfg["epochs"],
        (f"{gpus} GPU(s)" if gpus else "CPU") + (f" on each of {nodes} nodes" if nodes > 1 else ""),
        k,
        aux_layer_ids,
        "resuming from work dir" if kept else "fresh work dir",
    )

    AppendLog(records_path).open()  # drop a line torn by a kill
    AppendLog(records_path).close()
    records = read_records(records_path)
    steps_before = sum(r["kind"] == "train" for r in records)
    val_epochs = {int(r["epoch"]) for r in records if r["kind"] == "val"}
    resume = clean_checkpoints(save_path, scheduler, val_epochs)
    reused = training_finished(save_path, int(train_config["epochs"]), val_epochs)
    if reused:
        log.info("training already complete in %s: exporting it again", save_path)
    else:
        attempt = 1 + max((r["attempt"] for r in records if r["kind"] == "start"), default=0)
        if resume:
            log.info(
                "resuming from checkpoint epoch %d (local step %d, global step %d)",
                resume["epoch"],
                resume["local_step"],
                resume["global_step"],
            )
        job = {
            "train_config": train_config,
            "backend_args": backend_args,
            "metrics_path": str(records_path),
            "attempt": attempt,
            "resume_from": resume,
            "fingerprint": fp["hash"],
        }
        job_path = work / "job.json"
        write_json(job_path, job)
        if nodes > 1:
            cmd = multi_node_command(job_path, gpus, nodes)
        else:
            cmd = launch_command(job_path, gpus)
        with contextlib.ExitStack() as servers:
            devices = None
            if online is not None:
                devices = start_online(
                    servers,
                    online,
                    manifest,
                    target_info,
                    dataset_dir,
                    hs_root,
                    fp,
                    attempt,
                    train_config,
                    gpus * nodes,
                    log_path,
                )
            log.info("launching attempt %d: %s", attempt, " ".join(cmd))
            rc = launch(cmd, child_env(gpus, devices), log_path)
        val_epochs = {int(r["epoch"]) for r in read_records(records_path) if r["kind"] == "val"}
        if rc != 0 or not training_finished(save_path, int(train_config["epochs"]), val_epochs):
            # speculators returns normally after saving its SIGTERM ("interrupted") checkpoint
            problem = (
                f"exited with status {rc}"
                if rc
                else "stopped before the last epoch was trained and validated"
            )
            raise TrainError(
                f"training process {problem} (see the log); the checkpoints in "
                f"{save_path} are kept and a re-run resumes from them"
            )

    if online is not None:
        try:
            manifest["verification"] = online_verification(hs_root, online)
        except ExtractError as e:
            raise TrainError(str(e)) from e
    records = read_records(records_path)
    this_run = {
        "reused": reused,
        "trained_steps": sum(r["kind"] == "train" for r in records) - steps_before,
    }
    best = best_checkpoint(save_path, records, method)
    drafter = Path(drafter_dir)
    export_checkpoint(best, drafter, verifier)
    own = methods.get(method)
    n_positions = own.positions(train_config)
    # the first step of each attempt (worker start, compilation) is left out of throughput
    summary = summarize(records, method, n_positions, warmup_steps=1)
    resolved = {**resolve_auto(cfg), "aux_layer_ids": aux_layer_ids}
    cons = consistency.check(
        drafter,
        manifest,
        target_info,
        configured=resolved,
        vocab_map=(d2t, t2d),
        target_window=target_window,
    )
    best_epoch = int(best.name) if best.name.isdigit() else None
    best_val = next((e["val"] for e in summary["epochs"] if e["epoch"] == best_epoch), {})
    metrics = {
        "format": METRICS_FORMAT,
        "method": method,
        "best_epoch": best_epoch,
        "best_by": "validation " + ("highest " if own.best_by[1] else "lowest ") + own.best_by[0],
        "best_val_loss": best_val.get("loss"),
        "prediction": own.prediction(best_val, train_config),
        **summary,
        "consistency": cons,
        "config": {
            "method": method,
            "positions": n_positions,
            "resolved": resolved,
            "trainer": train_config,
            "launch": launch_command(work / "job.json", gpus, nodes),
        },
        "fingerprint": fp["hash"],
        # what the drafter was trained on: the extraction's manifest, or online the job's own
        # extraction and its checks (the bench stage checks the drafter against it)
        "hidden_states": _hidden_states_record(manifest),
        "this_run": this_run,
        "wall_s": time.time() - t0,
        "provenance": provenance(
            cfg,
            {
                "target": target_json,
                "dataset": dataset_dir,
                **({"manifest": manifest_path} if manifest_path else {}),
                "d2t": d2t,
                "t2d": t2d,
            },
        ),
    }
    plot(metrics, records, plot_out)
    write_json(metrics_out, metrics)
    if not cons["ok"]:
        raise TrainError(
            "train/serve consistency checks failed (details in "
            f"{metrics_out}):\n  - " + "\n  - ".join(cons["problems"])
        )
    log.info(
        "%s drafter exported to %s (epoch %s, best by %s; validation %s; %s tok/s)",
        method,
        drafter,
        best_epoch,
        metrics["best_by"],
        ", ".join(f"{k} {_short(v)}" for k, v in best_val.items()),
        _fmt(metrics["throughput"]["tokens_per_s"]),
    )
    return metrics


def _hidden_states_record(manifest: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "format",
        "mode",
        "capture",
        "num_samples",
        "samples_sha256",
        "layer_ids",
        "aux_layer_ids",
        "final_layer_id",
        "hidden_size",
        "storage",
        "tokens",
        "bytes",
        "verification",
    )
    return {k: manifest[k] for k in keys if k in manifest}


def _short(v: Any) -> str:
    if isinstance(v, list):
        return "/".join(_short(x) for x in v)
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0f}"
