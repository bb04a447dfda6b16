"""Train stage: an EAGLE-3 drafter with speculators' own trainer, exported for vLLM.

One code path for every device. :func:`run` maps the ``train`` config onto speculators'
``TrainConfig`` fields (:func:`trainer_args`, pure), writes a job file into ``work_dir`` and
starts :mod:`eagle3_pipeline.train_entry` in a subprocess: plain ``python -m`` on the CPU,
``torchrun --nproc-per-node train.gpus`` on GPUs. speculators' ``Trainer`` does the training,
checkpoints into ``work_dir/checkpoints`` and resumes from the newest checkpoint there.

``work_dir`` is not a declared output, so it survives a failed or killed job:

    work_dir/fingerprint.json     inputs + parameters of the checkpoints below; a mismatch wipes them
    work_dir/job.json             the job the training process runs
    work_dir/checkpoints/<epoch>/ speculators checkpoints (mid-epoch ones too), checkpoint_best link
    work_dir/logs/metrics.jsonl   records of every attempt (see train_entry)
    work_dir/dataset/             torch-format copy of the dataset, only if prepare's is not

Before each launch torn checkpoints (a kill during a save) are removed, so speculators resumes
from the last complete one. After training the best checkpoint (lowest validation loss) is
exported to ``drafter_dir`` with the verifier path made absolute, and ``metrics.json`` (per-epoch
losses and per-TTT-step accuracies, throughput, resume history, train/serve consistency record)
and ``loss.png`` are written.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

from .fileio import AppendLog, atomic_path, read_json, sha256_file, stable_hash, write_json
from . import server_guard
from .provenance import provenance

log = logging.getLogger(__name__)

METRICS_FORMAT = "eagle3-pipeline/train-metrics@1"
CHECKPOINTS = "checkpoints"
RECORDS = "logs/metrics.jsonl"

# Resolved values of the config's "auto" settings: (CPU, GPU).
AUTO = {
    "attn_impl": ("sdpa", "simple_flex_attention"),
    "loss_implementation": ("eager", "fused"),
    "hidden_states_dtype": ("float32", "bfloat16"),
    "total_seq_len": (2048, 8192),
}
# Keys the pipeline derives from its inputs; extra_args may not override them (the aux layer ids,
# for one, come from the hidden-states manifest and are never typed twice).
PROTECTED = frozenset(
    {
        "speculator_type",
        "verifier_name_or_path",
        "data_path",
        "hidden_states_backend",
        "hidden_states_path",
        "on_missing",
        "target_layer_ids",
        "d2t_path",
        "t2d_path",
        "draft_vocab_size",
        "token_freq_path",
        "save_path",
        "log_dir",
        "logger",
        "no_resume_from_checkpoint",
        "dry_run",
        "from_pretrained",
        "draft_config",
    }
)
# Fields that do not change what is trained (left out of the fingerprint).
OPERATIONAL = frozenset(
    {"num_workers", "prefetch_factor", "log_freq", "log_dir", "logger", "run_name", "save_path"}
)
DEFAULT_CHECKPOINT_FREQ = 0.25  # checkpoints per epoch < 1: mid-epoch checkpoints for resume


class TrainError(RuntimeError):
    pass


# ---- config -> speculators TrainConfig fields (pure) ---------------------------------------


def auto_workers(gpus: int, cpus: int | None = None) -> int:
    if gpus <= 0:
        return 0
    cpus = cpus or os.cpu_count() or 1
    return max(1, min(12, cpus // gpus - 2))


def resolve_auto(cfg: dict[str, Any], cpus: int | None = None) -> dict[str, Any]:
    """The train config with every ``auto`` replaced by its CPU or GPU value."""
    out = dict(cfg)
    gpu = int(cfg.get("gpus", 0)) > 0
    for key, (cpu_value, gpu_value) in AUTO.items():
        if out.get(key, "auto") == "auto":
            out[key] = gpu_value if gpu else cpu_value
    if out.get("num_workers", "auto") == "auto":
        out["num_workers"] = auto_workers(int(cfg.get("gpus", 0)), cpus)
    return out


def trainer_args(
    cfg: dict[str, Any],
    *,
    verifier_path: str,
    dataset_dir: str,
    hidden_states_root: str,
    aux_layer_ids: list[int],
    d2t_path: str,
    t2d_path: str,
    draft_vocab_size: int,
    save_path: str,
    log_dir: str,
    cpus: int | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Map the ``train`` config section onto speculators' flat ``TrainConfig`` fields.

    Returns ``(train_config, backend_args)``. Pure: no file access, no speculators import.
    """
    c = resolve_auto(cfg, cpus)
    gpus = int(c.get("gpus", 0))
    if gpus == 0:
        if c["attn_impl"] == "simple_flex_attention":
            raise TrainError(
                "train.attn_impl simple_flex_attention has no CPU backward; use "
                "sdpa (or auto) when train.gpus is 0"
            )
        if c["hidden_states_dtype"] != "float32":
            raise TrainError(
                "train.hidden_states_dtype must be float32 on the CPU (speculators "
                "autocasts only on accelerators)"
            )
        if c["loss_implementation"] == "fused":
            raise TrainError(
                "train.loss_implementation fused needs Triton on a GPU; use eager "
                "(or auto) when train.gpus is 0"
            )
    if c.get("fsdp") and gpus < 2:
        raise TrainError("train.fsdp needs train.gpus >= 2")
    num_layers = int(c["num_layers"])
    window = c.get("sliding_window")
    args: dict[str, Any] = {
        "speculator_type": "eagle3",
        "seed": int(c.get("seed", 0)),
        # verifier and data
        "verifier_name_or_path": str(verifier_path),
        "data_path": str(dataset_dir),
        "hidden_states_backend": "eagle3-pipeline-shards",
        "on_missing": "raise",
        "total_seq_len": int(c["total_seq_len"]),
        "train_data_ratio": 1.0 - float(c["val_fraction"]),
        "hidden_states_dtype": c["hidden_states_dtype"],
        "num_workers": int(c["num_workers"]),
        # draft model
        "target_layer_ids": [int(i) for i in aux_layer_ids],
        "d2t_path": str(d2t_path),
        "t2d_path": str(t2d_path),
        "draft_vocab_size": int(draft_vocab_size),
        "num_layers": num_layers,
        "draft_arch": "llama",
        "norm_before_fc": bool(c["norm_before_fc"]),
        "norm_output": bool(c["norm_output"]),
        "draft_attn_impl": c["attn_impl"],
        # speculators' default is a 2048 window on every draft layer; null means full attention
        # on every layer (the unused sliding_window value stays at speculators' default).
        "full_attention_indices": list(range(num_layers)) if window is None else [],
        # loss
        "ttt_steps": int(c["ttt_steps"]),
        "loss_implementation": c["loss_implementation"],
        # optimizer and schedule
        "optimizer": c["optimizer"],
        "lr": float(c["lr"]),
        "scheduler_type": c["scheduler"],
        "scheduler_warmup_ratio": float(c["warmup_ratio"]),
        # trainer
        "epochs": int(c["epochs"]),
        "checkpoint_freq": DEFAULT_CHECKPOINT_FREQ,
        "save_best": False,
        "no_resume_from_checkpoint": False,
        "log_freq": int(c["log_freq"]),
        "save_path": str(save_path),
        "fsdp_shard": bool(c.get("fsdp", False)),
        # metric records come from train_entry's handler; no extra logger backend
        "logger": "",
        "log_dir": str(log_dir),
        "run_name": "eagle3-pipeline",
    }
    if window is not None:
        args["sliding_window"] = int(window)
    extra = dict(c.get("extra_args") or {})
    clash = sorted(set(extra) & PROTECTED)
    if clash:
        raise TrainError(
            f"train.extra_args may not set {clash}: the pipeline derives them from its inputs"
        )
    args.update(extra)
    return args, {"hidden_states_path": str(hidden_states_root)}


def draft_vocab_size_of(d2t_path: str | Path) -> int:
    import numpy as np

    return int(np.load(d2t_path, mmap_mode="r").shape[0])


# ---- fingerprint ---------------------------------------------------------------------------


def _dataset_digest(dataset_dir: Path, full_limit: int = 256 << 20) -> dict[str, Any]:
    files = sorted(p for p in dataset_dir.rglob("*") if p.is_file())
    total = sum(p.stat().st_size for p in files)
    out: dict[str, Any] = {"bytes": total, "files": {}}
    for p in files:
        rel = str(p.relative_to(dataset_dir))
        if p.suffix == ".json" or total <= full_limit:
            out["files"][rel] = sha256_file(p)
        else:  # large datasets: size plus head and tail
            import hashlib

            h = hashlib.sha256(str(p.stat().st_size).encode())
            with open(p, "rb") as fh:
                h.update(fh.read(1 << 20))
                fh.seek(max(0, p.stat().st_size - (1 << 20)))
                h.update(fh.read(1 << 20))
            out["files"][rel] = h.hexdigest()
    return out


def fingerprint(
    *,
    train_config: dict[str, Any],
    gpus: int,
    dataset_dir: str | Path,
    manifest_path: str | Path,
    d2t: str | Path,
    t2d: str | Path,
    verifier_path: str | Path,
) -> dict[str, Any]:
    """What the checkpoints in work_dir were trained from; any change invalidates them."""
    import importlib.metadata as md

    try:
        spec_version = md.version("speculators")
    except md.PackageNotFoundError:
        spec_version = None
    verifier_cfg = Path(verifier_path) / "config.json"
    parts = {
        "params": {k: v for k, v in sorted(train_config.items()) if k not in OPERATIONAL},
        "world_size": max(1, int(gpus)),
        "dataset": _dataset_digest(Path(dataset_dir)),
        "manifest": sha256_file(manifest_path),
        "d2t": sha256_file(d2t),
        "t2d": sha256_file(t2d),
        "verifier": {
            "path": str(verifier_path),
            "config": sha256_file(verifier_cfg) if verifier_cfg.exists() else None,
        },
        "speculators": spec_version,
    }
    return {"hash": stable_hash(parts), "parts": parts}


def prepare_work_dir(work_dir: Path, fp: dict[str, Any]) -> bool:
    """Keep work_dir's checkpoints only if they were trained from the same fingerprint.

    Returns True when earlier state is kept (a resume is possible)."""
    fp_path = work_dir / "fingerprint.json"
    if fp_path.exists():
        try:
            old = read_json(fp_path)
        except (OSError, json.JSONDecodeError):
            old = {}
        if old.get("hash") == fp["hash"]:
            return True
        changed = sorted(k for k in fp["parts"] if old.get("parts", {}).get(k) != fp["parts"][k])
        log.warning(
            "train inputs or parameters changed (%s): discarding the checkpoints in %s",
            ", ".join(changed) or "unknown",
            work_dir,
        )
    for name in (CHECKPOINTS, "logs", "dataset", "job.json"):
        p = work_dir / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
    work_dir.mkdir(parents=True, exist_ok=True)
    write_json(fp_path, fp)
    return False


# ---- checkpoints ---------------------------------------------------------------------------


def _safetensors_complete(path: Path) -> bool:
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
        end = max(
            (v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0
        )
        return size == 8 + n + end
    except (OSError, ValueError, KeyError, struct.error):
        return False


def _torch_file_complete(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as zf:
            return bool(zf.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def checkpoint_problem(ckpt: Path, scheduler: bool) -> str | None:
    """Why ``ckpt`` (one ``<save>/<epoch>`` dir) is not a complete checkpoint, or None.

    speculators writes model, optimizer, scheduler and ``training_state.json`` last, in place; a
    kill during that sequence leaves missing or torn files, or a state file older than the
    weights (an end-of-epoch save over a mid-epoch one)."""
    state = ckpt / "training_state.json"
    needed = ["config.json", "model.safetensors", "optimizer_state_dict.pt"]
    if scheduler:
        needed.append("scheduler_state_dict.pt")
    for name in needed + ["training_state.json"]:
        if not (ckpt / name).is_file():
            return f"missing {name}"
    try:
        json.loads(state.read_text())
        json.loads((ckpt / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return "unreadable training_state.json or config.json"
    if not _safetensors_complete(ckpt / "model.safetensors"):
        return "torn model.safetensors"
    for name in needed:
        if name.endswith(".pt") and not _torch_file_complete(ckpt / name):
            return f"torn {name}"
    newest = max((ckpt / n).stat().st_mtime for n in needed)
    if state.stat().st_mtime < newest:
        return "training_state.json older than the weights (save interrupted)"
    return None


def epoch_dirs(save_path: Path) -> list[Path]:
    if not save_path.is_dir():
        return []
    dirs = [
        d for d in save_path.iterdir() if d.is_dir() and not d.is_symlink() and d.name.isdigit()
    ]
    return sorted(dirs, key=lambda d: int(d.name))


def clean_checkpoints(
    save_path: Path, scheduler: bool, val_epochs: set[int] | None = None
) -> dict[str, Any] | None:
    """Remove incomplete checkpoints so speculators resumes from the last complete one.

    Also removes the newest checkpoint if it is an end-of-epoch one whose validation never ran
    (speculators would skip that epoch's validation on resume). Returns the state of the
    checkpoint training will resume from (``epoch``, ``local_step``, ``global_step``) or None.
    """
    removed = []
    for newest, d in enumerate(reversed(epoch_dirs(save_path))):
        problem = checkpoint_problem(d, scheduler)
        if problem is None and val_epochs is not None and newest == 0:
            state = json.loads((d / "training_state.json").read_text())
            if state.get("local_step", 0) == 0 and int(d.name) not in val_epochs:
                problem = "end-of-epoch checkpoint without a validation record"
        if problem is None:
            break
        log.warning("removing checkpoint %s: %s", d, problem)
        shutil.rmtree(d)
        removed.append(d.name)
    interrupted = save_path / "interrupted"
    if interrupted.is_dir():  # speculators' SIGTERM save: never resumed from, only disk
        shutil.rmtree(interrupted)
    if save_path.is_dir():
        for link in save_path.iterdir():
            if link.is_symlink() and not link.exists():
                link.unlink()
    dirs = epoch_dirs(save_path)
    if not dirs:
        return None
    state = json.loads((dirs[-1] / "training_state.json").read_text())
    return {
        "epoch": int(state.get("epoch", dirs[-1].name)),
        "local_step": int(state.get("local_step", 0)),
        "global_step": int(state.get("global_step", 0)),
        "removed": removed,
    }


def best_checkpoint(save_path: Path) -> Path:
    best = save_path / "checkpoint_best"
    if best.is_symlink() and best.exists():
        return best.resolve()
    dirs = epoch_dirs(save_path)
    if not dirs:
        raise TrainError(f"training left no checkpoint in {save_path}")
    log.warning("no checkpoint_best link in %s: exporting the newest checkpoint", save_path)
    return dirs[-1]


def training_finished(save_path: Path, epochs: int, val_epochs: set[int]) -> bool:
    dirs = epoch_dirs(save_path)
    if not dirs or int(dirs[-1].name) != epochs - 1:
        return False
    state = json.loads((dirs[-1] / "training_state.json").read_text())
    return state.get("local_step", 0) == 0 and epochs - 1 in val_epochs


# ---- records -> metrics --------------------------------------------------------------------


def read_records(path: Path) -> list[dict[str, Any]]:
    return AppendLog(path).read() if path.exists() else []


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return sum(xs) / len(xs) if xs else None


def _median(xs: list[float]) -> float | None:
    xs = sorted(xs)
    if not xs:
        return None
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def _per_step(metrics: dict[str, Any], prefix: str, ttt: int, suffix: str = "") -> list:
    return [metrics.get(f"{prefix}_{k}{suffix}") for k in range(ttt)]


def summarize(
    records: list[dict[str, Any]], ttt_steps: int, warmup_steps: int = 0
) -> dict[str, Any]:
    """Per-epoch train/val metrics, throughput and resume history from the records.

    A step that was trained twice (after a resume) counts once, from the later attempt.
    ``warmup_steps`` first steps of every attempt are left out of the throughput figures.
    """
    train: dict[int, dict] = {}
    for r in records:
        if r["kind"] == "train":
            train[int(r["global_step"])] = r  # later attempts overwrite
    val: dict[int, dict] = {}
    for r in records:
        if r["kind"] == "val":
            val[int(r["epoch"])] = r
    first_step: dict[int, int] = {}
    for step, r in sorted(train.items()):
        first_step.setdefault(r["attempt"], step)

    epochs = sorted(set(int(r["epoch"]) for r in train.values()) | set(val))
    per_epoch = []
    for e in epochs:
        steps = [r for _, r in sorted(train.items()) if int(r["epoch"]) == e]
        tm = [r["train"] for r in steps]
        tokens, seconds = 0.0, 0.0
        for r in steps:
            p = r.get("profile") or {}
            if r["global_step"] - first_step.get(r["attempt"], 0) < warmup_steps:
                continue
            if p.get("step_ms") and p.get("tokens_per_s") is not None:
                seconds += p["step_ms"] / 1000
                tokens += p["tokens_per_s"] * p["step_ms"] / 1000
        entry: dict[str, Any] = {
            "epoch": e,
            "logged_steps": len(steps),
            "global_steps": [steps[0]["global_step"], steps[-1]["global_step"]] if steps else None,
            "train": {
                "loss": _mean([m.get("loss") for m in tm]),
                "loss_per_ttt_step": [
                    _mean([m.get(f"loss_{k}") for m in tm]) for k in range(ttt_steps)
                ],
                "full_acc": [_mean([m.get(f"full_acc_{k}") for m in tm]) for k in range(ttt_steps)],
                "cond_acc": [_mean([m.get(f"cond_acc_{k}") for m in tm]) for k in range(ttt_steps)],
            },
            "tokens_per_s": tokens / seconds if seconds else None,
        }
        if e in val:
            vm = val[e]["val"]
            entry["val"] = {
                "loss": vm.get("loss_epoch"),
                "loss_per_ttt_step": _per_step(vm, "loss", ttt_steps, "_epoch"),
                "full_acc": _per_step(vm, "full_acc", ttt_steps, "_epoch"),
                "cond_acc": _per_step(vm, "cond_acc", ttt_steps, "_epoch"),
            }
        per_epoch.append(entry)

    # throughput: trainer's own step profile + the loader probe
    tokens = seconds = 0.0
    fetch_ms, step_ms = [], []
    for step, r in sorted(train.items()):
        p = r.get("profile") or {}
        if step - first_step.get(r["attempt"], 0) < warmup_steps or not p.get("step_ms"):
            continue
        seconds += p["step_ms"] / 1000
        tokens += (p.get("tokens_per_s") or 0) * p["step_ms"] / 1000
        step_ms.append(p["step_ms"])
        fetch_ms.append(p.get("fetch_ms") or 0.0)
    # loader probe: per batch, how long next() blocked; the interval between two batches is
    # one whole step (wait included), so wait/interval is the share of time spent starved
    waits, intervals = [], []
    by_iter: dict[tuple, list] = {}
    for r in records:
        if r["kind"] == "loader":
            by_iter.setdefault((r["attempt"], r["iter"]), []).append(r)
    for rows in by_iter.values():
        rows = [r for r in rows if r["i"] >= warmup_steps]
        for a, b in zip(rows, rows[1:]):
            waits.append(b["wait_s"])
            intervals.append(b["t"] - a["t"])
    ends = [r for r in records if r["kind"] == "end"]
    peaks = [r.get("peak_allocated_gib") for r in ends if r.get("peak_allocated_gib")]
    throughput = {
        "tokens_per_s": tokens / seconds if seconds else None,
        "step_ms_median": _median(step_ms),
        "logged_steps": len(step_ms),
        "trainer_fetch_ms_median": _median(fetch_ms),
        "loader_wait_ms_mean": 1000 * _mean(waits) if waits else None,
        "loader_wait_ms_max": 1000 * max(waits) if waits else None,
        "loader_step_interval_ms_median": 1000 * _median(intervals) if intervals else None,
        "loader_wait_fraction": (sum(waits) / sum(intervals)) if intervals else None,
        "peak_gpu_allocated_gib": max(peaks) if peaks else None,
        "peak_gpu_reserved_gib": max((r.get("peak_reserved_gib") or 0) for r in ends) or None,
        "warmup_steps_excluded": warmup_steps,
        "note": "tokens/s from the trainer's profile of logged steps (every log_freq); loader "
        "wait = time next() on the DataLoader blocked, per batch",
    }
    starts = [r for r in records if r["kind"] == "start"]
    attempts = []
    for s in starts:
        a = s["attempt"]
        attempts.append(
            {
                "attempt": a,
                "bridges": s.get("bridges"),
                "world_size": s.get("world_size"),
                "device": s.get("device_name"),
                "first_global_step": first_step.get(a),
                "clean_exit": any(r["attempt"] == a and r.get("ok", True) for r in ends),
            }
        )
    return {"epochs": per_epoch, "throughput": throughput, "attempts": attempts}


# ---- export and consistency ----------------------------------------------------------------


def safetensors_header(path: Path) -> dict[str, Any]:
    with open(path, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        return json.loads(fh.read(n))


def export_checkpoint(ckpt: Path, drafter_dir: Path, verifier_path: str) -> dict[str, Any]:
    """Copy ``ckpt`` to ``drafter_dir`` as a self-describing speculators checkpoint whose
    verifier path is absolute. Weights first, config.json last (each file atomically)."""
    drafter_dir.mkdir(parents=True, exist_ok=True)
    verifier = str(Path(verifier_path).resolve())
    config = json.loads((ckpt / "config.json").read_text())
    config.setdefault("speculators_config", {}).setdefault("verifier", {})
    config["speculators_config"]["verifier"]["name_or_path"] = verifier
    for name in ("model.safetensors", "config.py"):
        if (ckpt / name).exists():
            with atomic_path(drafter_dir / name) as tmp:
                shutil.copyfile(ckpt / name, tmp)
    with atomic_path(drafter_dir / "config.json") as tmp:
        tmp.write_text(json.dumps(config, indent=2) + "\n")
    return config


def target_model_window(model_path: str | Path) -> int | None:
    """The sliding window vLLM puts into ``CacheConfig.sliding_window`` for this target
    (vllm/engine/arg_utils.py: only when the target has no ``layer_types`` or slides on every
    layer). Draft layers without a window of their own fall back to it (attention.py)."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(str(model_path))
    text = getattr(cfg, "text_config", None) or cfg
    layer_types = getattr(text, "layer_types", None)
    if layer_types is not None and not all(t == "sliding_attention" for t in layer_types):
        return None
    window = getattr(text, "sliding_window", None)
    return int(window) if window else None


def trained_windows(layer_cfg: dict[str, Any]) -> list[int | None]:
    """The window speculators trained each draft layer with (eagle3/core.py: layers listed as
    ``sliding_attention`` in ``layer_types`` get ``sliding_window``, the others full)."""
    n = int(layer_cfg.get("num_hidden_layers", 1))
    types = layer_cfg.get("layer_types") or ["full_attention"] * n
    return [layer_cfg.get("sliding_window") if t == "sliding_attention" else None for t in types]


def served_windows(layer_cfg: dict[str, Any], target_window: int | None) -> list[int | None]:
    """The window vLLM applies to each draft layer: llama.py's LlamaAttention passes
    ``config.sliding_window`` for a ``sliding_attention`` entry of ``layer_types`` (indexed
    relative to the draft via ``target_layer_count``), else None, and attention.py then falls
    back to the target's model-wide window."""
    n = int(layer_cfg.get("num_hidden_layers", 1))
    types = layer_cfg.get("layer_types")
    if not types:
        return [target_window] * n
    return [
        layer_cfg.get("sliding_window") if t == "sliding_attention" else target_window
        for t in types
    ]


def consistency(
    config: dict[str, Any],
    drafter_dir: Path,
    manifest: dict[str, Any],
    target_info: dict[str, Any],
    cfg: dict[str, Any],
    d2t: Path,
    t2d: Path,
    target_window: int | None = None,
) -> dict[str, Any]:
    """Structural train/serve record: what vLLM will load vs what extraction captured and the
    config asked for. Acceptance rates do not reveal such slips (FACTS.md), so they are
    checked here and by the bench stage."""
    import numpy as np
    from safetensors import safe_open

    layer_cfg = config.get("transformer_layer_config", {})
    verifier = config.get("speculators_config", {}).get("verifier", {}).get("name_or_path")
    arch = target_info.get("architecture", {})
    with safe_open(str(drafter_dir / "model.safetensors"), framework="np") as f:
        keys = set(f.keys())
        ck_d2t = f.get_tensor("d2t") if "d2t" in keys else None
        ck_t2d = f.get_tensor("t2d") if "t2d" in keys else None
    want_window = cfg.get("sliding_window")
    windows = trained_windows(layer_cfg)
    served = served_windows(layer_cfg, target_window)
    record = {
        "aux_layer_ids": config.get("eagle_aux_hidden_state_layer_ids"),
        "manifest_aux_layer_ids": manifest["aux_layer_ids"],
        "final_layer_id": manifest["final_layer_id"],
        "target_num_layers": arch.get("num_layers"),
        "hidden_size": layer_cfg.get("hidden_size"),
        "manifest_hidden_size": manifest["hidden_size"],
        "vocab_size": layer_cfg.get("vocab_size"),
        "target_vocab_size": arch.get("vocab_size"),
        "draft_vocab_size": config.get("draft_vocab_size"),
        "norm_before_fc": config.get("norm_before_fc"),
        "norm_output": config.get("norm_output"),
        "num_draft_layers": layer_cfg.get("num_hidden_layers"),
        "layer_types": layer_cfg.get("layer_types"),
        "sliding_window": want_window,
        "trained_window_per_layer": windows,
        "served_window_per_layer": served,
        "target_model_window": target_window,
        "storage": manifest.get("storage"),
        "verifier_path": verifier,
        "verifier_path_exists": bool(verifier)
        and Path(verifier).is_absolute()
        and (Path(verifier) / "config.json").is_file(),
        "speculators_model_type": config.get("speculators_model_type"),
        "architectures": config.get("architectures"),
        "weights_have_d2t_t2d": ck_d2t is not None and ck_t2d is not None,
    }
    vocab_d2t, vocab_t2d = np.load(d2t), np.load(t2d)
    checks = {
        "aux_layer_ids_match_manifest": record["aux_layer_ids"] == manifest["aux_layer_ids"],
        "final_layer_is_target_last": arch.get("num_layers") is None
        or manifest["final_layer_id"] == arch["num_layers"],
        "hidden_size_matches": record["hidden_size"] == manifest["hidden_size"],
        "vocab_size_matches_target": arch.get("vocab_size") is None
        or record["vocab_size"] == arch["vocab_size"],
        "norm_flags_as_configured": record["norm_before_fc"] == bool(cfg["norm_before_fc"])
        and record["norm_output"] == bool(cfg["norm_output"]),
        "sliding_window_as_configured": all(w == want_window for w in windows),
        "sliding_window_served_as_trained": served == windows,
        # a draft vocab as large as the target's needs no map (speculators stores none)
        "draft_vocab_matches_vocab_stage": (
            record["draft_vocab_size"] == len(vocab_d2t) == record["vocab_size"]
            and not record["weights_have_d2t_t2d"]
        )
        or (
            record["weights_have_d2t_t2d"]
            and record["draft_vocab_size"] == len(vocab_d2t) == len(ck_d2t)
            and bool((ck_d2t == vocab_d2t).all())
            and bool((ck_t2d == vocab_t2d).all())
        ),
        "verifier_is_target": record["verifier_path_exists"]
        and Path(verifier).resolve() == Path(target_info["model_path"]).resolve(),
        "is_eagle3": record["speculators_model_type"] == "eagle3",
    }
    record["checks"] = checks
    record["ok"] = all(checks.values())
    return record


# ---- plot ----------------------------------------------------------------------------------


def plot(metrics: dict[str, Any], records: list[dict[str, Any]], out: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def num(x):
        return float("nan") if x is None else float(x)

    epochs = metrics["epochs"]
    ttt = metrics["config"]["ttt_steps"]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(12, 4.6))

    train = {int(r["global_step"]): r for r in records if r["kind"] == "train"}
    steps_per_epoch: dict[int, list[int]] = {}
    for g, r in sorted(train.items()):
        steps_per_epoch.setdefault(int(r["epoch"]), []).append(g)
    xs, ys = [], []
    for g, r in sorted(train.items()):
        e = int(r["epoch"])
        gs = steps_per_epoch[e]
        frac = (gs.index(g) + 1) / len(gs)
        xs.append(e + frac)
        ys.append(num(r["train"].get("loss")))
    if xs:
        ax_loss.plot(xs, ys, color="tab:blue", alpha=0.25, lw=1, label="train (logged steps)")
    ex = [e["epoch"] + 1 for e in epochs]
    ax_loss.plot(
        ex,
        [num(e["train"]["loss"]) for e in epochs],
        "o-",
        color="tab:blue",
        label="train (epoch mean)",
    )
    vx = [e["epoch"] + 1 for e in epochs if "val" in e]
    ax_loss.plot(
        vx,
        [num(e["val"]["loss"]) for e in epochs if "val" in e],
        "s-",
        color="tab:red",
        label="validation",
    )
    if metrics.get("best_epoch") is not None:
        ax_loss.axvline(
            metrics["best_epoch"] + 1,
            color="gray",
            ls=":",
            lw=1,
            label=f"exported (epoch {metrics['best_epoch'] + 1})",
        )
    finite = [y for y in ys if y == y and y > 0]
    if finite and max(finite) / min(finite) > 8:  # early spikes would flatten the rest
        ax_loss.set_yscale("log")
    ax_loss.set_xlabel("epoch")
    ax_loss.set_ylabel(f"loss (sum over {ttt} TTT steps)")
    ax_loss.set_title("Loss")
    ax_loss.grid(alpha=0.3)
    ax_loss.legend(fontsize=8)

    colors = plt.cm.viridis([i / max(1, ttt - 1) * 0.85 for i in range(ttt)])
    for k in range(ttt):
        full = [num(e["val"]["full_acc"][k]) for e in epochs if "val" in e]
        cond = [num(e["val"]["cond_acc"][k]) for e in epochs if "val" in e]
        ax_acc.plot(vx, full, "o-", color=colors[k], label=f"step {k + 1} full")
        ax_acc.plot(vx, cond, "o--", color=colors[k], alpha=0.6, label=f"step {k + 1} conditional")
    ax_acc.set_xlabel("epoch")
    ax_acc.set_ylabel("validation accuracy")
    ax_acc.set_ylim(0, 1)
    ax_acc.set_title("Validation accuracy per TTT step")
    ax_acc.grid(alpha=0.3)
    ax_acc.legend(fontsize=8, ncol=2)
    for ax in (ax_loss, ax_acc):
        ax.xaxis.get_major_locator().set_params(integer=True)
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


# ---- launch --------------------------------------------------------------------------------


def _training_process_modules() -> None:
    """Never called. The training process runs these modules in a subprocess; importing them
    here makes workflow.module_closure list them as inputs of the train rule, so an edit to
    either re-runs the stage like an edit to this module does."""
    from . import hs_backend, train_entry  # noqa: F401


def launch_command(job_path: Path, gpus: int) -> list[str]:
    entry = ["-m", "eagle3_pipeline.train_entry", str(job_path)]
    if gpus <= 0:
        return [sys.executable, *entry]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={gpus}",
        *entry,
    ]


def child_env(gpus: int) -> dict[str, str]:
    env = server_guard.with_package_on_path(dict(os.environ))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' save_pretrained bars
    if gpus <= 0:
        # FACTS.md: on small shared CPUs one thread beat two by 3-4x
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 2) // 2)))
    return env


def launch(
    cmd: list[str], env: dict[str, str], log_path: str | None, grace_s: float = 120.0
) -> int:
    """Run the training process in its own session, under the server guard so that it dies
    with this job even on ``kill -9``; on interrupt stop it (SIGTERM, then SIGKILL after
    ``grace_s``) and re-raise."""
    out = open(log_path, "ab") if log_path else None  # noqa: SIM115
    try:
        proc = subprocess.Popen(
            server_guard.command(cmd, grace_s),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
            start_new_session=True,
        )
        try:
            return proc.wait()
        except BaseException:
            log.warning("stopping the training process (pid %d)", proc.pid)
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            except ProcessLookupError:
                pass
            raise
    finally:
        if out:
            out.close()


def torch_format_dataset(dataset_dir: Path, work_dir: Path) -> Path:
    """speculators' ArrowDataset compares tensors, so it needs the dataset in torch format (as
    speculators' prepare-data saves it). Returns a dir that is; copies only if needed."""
    state = dataset_dir / "state.json"
    if state.exists() and json.loads(state.read_text()).get("_format_type") == "torch":
        return dataset_dir
    out = work_dir / "dataset"
    if (out / "state.json").exists():
        return out
    from datasets import load_from_disk

    log.info(
        "dataset %s is not in torch format: writing a torch-format copy to %s", dataset_dir, out
    )
    ds = load_from_disk(str(dataset_dir))
    ds.set_format(type="torch")
    tmp = work_dir / "dataset.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    ds.save_to_disk(str(tmp))
    tmp.rename(out)
    return out


# ---- the stage -----------------------------------------------------------------------------


def run(
    target_json: str,
    dataset_dir: str,
    manifest_path: str,
    d2t: str,
    t2d: str,
    drafter_dir: str,
    metrics_out: str,
    plot_out: str,
    cfg: dict[str, Any],
    work_dir: str,
    log_path: str | None = None,
    max_attempts: int = 1,
) -> dict[str, Any]:
    """Train (or resume) and export the drafter; returns the metrics written."""
    t0 = time.time()
    target_info = read_json(target_json)
    verifier = str(Path(target_info["model_path"]).resolve())
    manifest_path = Path(manifest_path).resolve()
    manifest = read_json(manifest_path)
    hs_root = Path(manifest.get("root") or manifest_path.parent).resolve()
    if Path(manifest.get("target", {}).get("model_path", verifier)).resolve() != Path(verifier):
        raise TrainError(
            f"hidden states were extracted from "
            f"{manifest['target']['model_path']}, but the target is {verifier}"
        )
    work = Path(work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    gpus = int(cfg.get("gpus", 0))
    target_window = target_model_window(verifier)
    if cfg.get("sliding_window") is None and target_window is not None:
        log.warning(
            "vLLM applies the target's model-wide sliding window (%d) to draft layers "
            "without one: training the drafter with the same window",
            target_window,
        )
        cfg = {**cfg, "sliding_window": target_window}
    d2t, t2d = Path(d2t).resolve(), Path(t2d).resolve()
    k = draft_vocab_size_of(d2t)
    save_path = work / CHECKPOINTS
    records_path = work / RECORDS

    train_config, backend_args = trainer_args(
        cfg,
        verifier_path=verifier,
        dataset_dir=str(Path(dataset_dir).resolve()),
        hidden_states_root=str(hs_root),
        aux_layer_ids=manifest["aux_layer_ids"],
        d2t_path=str(d2t),
        t2d_path=str(t2d),
        draft_vocab_size=k,
        save_path=str(save_path),
        log_dir=str(work / "logs"),
    )
    fp = fingerprint(
        train_config=train_config,
        gpus=gpus,
        dataset_dir=dataset_dir,
        manifest_path=manifest_path,
        d2t=d2t,
        t2d=t2d,
        verifier_path=verifier,
    )
    kept = prepare_work_dir(work, fp)
    train_config["data_path"] = str(torch_format_dataset(Path(dataset_dir).resolve(), work))
    scheduler = train_config["scheduler_type"] != "none"
    log.info(
        "train: %d epoch(s), %s, draft vocab %d, aux layers %s, %s",
        cfg["epochs"],
        f"{gpus} GPU(s)" if gpus else "CPU",
        k,
        manifest["aux_layer_ids"],
        "resuming from work dir" if kept else "fresh work dir",
    )

    for attempt_no in range(max_attempts):
        AppendLog(records_path).open()  # drop a line torn by a kill
        AppendLog(records_path).close()
        records = read_records(records_path)
        val_epochs = {int(r["epoch"]) for r in records if r["kind"] == "val"}
        resume = clean_checkpoints(save_path, scheduler, val_epochs)
        if training_finished(save_path, int(train_config["epochs"]), val_epochs):
            log.info("training already complete in %s", save_path)
            break
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
        cmd = launch_command(job_path, gpus)
        log.info("launching attempt %d: %s", attempt, " ".join(cmd))
        rc = launch(cmd, child_env(gpus), log_path)
        if rc == 0:
            records = read_records(records_path)
            val_epochs = {int(r["epoch"]) for r in records if r["kind"] == "val"}
            if training_finished(save_path, int(train_config["epochs"]), val_epochs):
                break
            # speculators returns normally after saving its SIGTERM ("interrupted") checkpoint
            problem = "stopped before the last epoch was trained and validated"
        else:
            problem = f"exited with status {rc}"
        if attempt_no + 1 >= max_attempts:
            raise TrainError(
                f"training process {problem} (see the log); the checkpoints in "
                f"{save_path} are kept and a re-run resumes from them"
            )
        log.warning("training process %s; retrying from the last checkpoint", problem)

    records = read_records(records_path)
    best = best_checkpoint(save_path)
    drafter = Path(drafter_dir)
    config = export_checkpoint(best, drafter, verifier)
    # the first step of each attempt (worker start, compilation) is left out of throughput
    summary = summarize(records, int(train_config["ttt_steps"]), warmup_steps=1)
    cons = consistency(
        config, drafter, manifest, target_info, resolve_auto(cfg), d2t, t2d, target_window
    )
    best_val = None
    vm = best / "val_metrics.json"
    if vm.exists():
        best_val = json.loads(vm.read_text()).get("loss_epoch")
    metrics = {
        "format": METRICS_FORMAT,
        "best_epoch": int(best.name) if best.name.isdigit() else None,
        "best_val_loss": best_val,
        **summary,
        "consistency": cons,
        "config": {
            "ttt_steps": int(train_config["ttt_steps"]),
            "resolved": resolve_auto(cfg),
            "trainer": train_config,
            "launch": launch_command(work / "job.json", gpus),
        },
        "fingerprint": fp["hash"],
        "wall_s": time.time() - t0,
        "provenance": provenance(
            cfg,
            {
                "target": target_json,
                "dataset": dataset_dir,
                "manifest": manifest_path,
                "d2t": d2t,
                "t2d": t2d,
            },
        ),
    }
    plot(metrics, records, plot_out)
    write_json(metrics_out, metrics)
    if not cons["ok"]:
        bad = [name for name, ok in cons["checks"].items() if not ok]
        raise TrainError(f"train/serve consistency checks failed: {bad} (details in {metrics_out})")
    last = metrics["epochs"][-1] if metrics["epochs"] else {}
    log.info(
        "drafter exported to %s (epoch %s, val loss %s, val full acc %s, %s tok/s)",
        drafter,
        metrics["best_epoch"],
        best_val,
        [round(a, 3) if a is not None else None for a in last.get("val", {}).get("full_acc", [])],
        _fmt(metrics["throughput"]["tokens_per_s"]),
    )
    return metrics


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0f}"
