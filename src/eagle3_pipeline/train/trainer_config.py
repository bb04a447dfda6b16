"""The ``train`` config of one drafter method mapped onto speculators' flat ``TrainConfig``
fields (pure: no file access, no speculators import). The fields every method shares are built
here, the method's own by :meth:`eagle3_pipeline.methods.base.Method.trainer_fields`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..methods import trainer_fields
from .errors import TrainError

# Resolved values of the config's "auto" settings: (CPU, GPU).
AUTO = {
    "attn_impl": ("sdpa", "simple_flex_attention"),
    "loss_implementation": ("eager", "fused"),
    "hidden_states_dtype": ("float32", "bfloat16"),
    "total_seq_len": (2048, 8192),
}
# Keys the pipeline derives from its inputs; extra_args may not override them (the aux layer ids,
# for one, come from the hidden-states manifest and are never typed twice; DFlash's causality
# flag from the window, see methods/dflash.py).
PROTECTED = frozenset(
    {
        "speculator_type",
        "verifier_name_or_path",
        "data_path",
        "hidden_states_backend",
        "hidden_states_path",
        "on_missing",
        "target_layer_ids",
        "sliding_window_non_causal",
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
# The hidden-states backends (hidden_states.dataset, online.transfer register them), by name:
# no import of either here (pure, light)
SHARDS_BACKEND = "eagle3-pipeline-shards"
ONLINE_BACKEND = "eagle3-pipeline-online"
DEFAULT_CHECKPOINT_FREQ = 0.25  # checkpoints per epoch < 1: mid-epoch checkpoints for resume

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


def device_problems(cfg: dict[str, Any]) -> list[str]:
    """What the ``train`` config asks that its device cannot do, one line each. The one rule:
    config validation reports these before any job starts, the stage refuses them too."""
    c = resolve_auto(cfg)
    gpus = int(c.get("gpus", 0))
    problems = []
    if c.get("fsdp") and gpus < 2:
        problems.append(
            f"config key `train.fsdp`: FSDP needs at least 2 GPUs, but train.gpus is {gpus}; "
            "set train.gpus >= 2 or fsdp: false"
        )
    if gpus == 0:
        if c["attn_impl"] == "simple_flex_attention":
            problems.append(
                "config key `train.attn_impl`: simple_flex_attention has no CPU backward; use "
                "sdpa (or auto) when train.gpus is 0"
            )
        if c["hidden_states_dtype"] != "float32":
            problems.append(
                "config key `train.hidden_states_dtype`: must be float32 on the CPU "
                "(speculators autocasts only on accelerators)"
            )
        if c["loss_implementation"] == "fused":
            problems.append(
                "config key `train.loss_implementation`: fused needs Triton on a GPU; use eager "
                "(or auto) when train.gpus is 0"
            )
    return problems


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
    backend: str = SHARDS_BACKEND,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Map the ``train`` config section onto speculators' flat ``TrainConfig`` fields;
    ``backend`` reads the hidden states under ``hidden_states_root`` (:data:`SHARDS_BACKEND`:
    extracted ones; :data:`ONLINE_BACKEND`: produced on demand, extract.mode online/hybrid).

    Returns ``(train_config, backend_args)``. Pure: no file access, no speculators import.
    """
    c = resolve_auto(cfg, cpus)
    problems = device_problems(cfg)
    if problems:
        raise TrainError("; ".join(problems))
    window = c.get("sliding_window")
    args: dict[str, Any] = {
        "seed": int(c.get("seed", 0)),
        # verifier and data
        "verifier_name_or_path": str(verifier_path),
        "data_path": str(dataset_dir),
        "hidden_states_backend": backend,
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
        "draft_attn_impl": c["attn_impl"],
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
        # metric records come from train.entry's handler; no extra logger backend
        "logger": "",
        "log_dir": str(log_dir),
        "run_name": "eagle3-pipeline",
    }
    # the method's model and loss: speculator type, draft decoder, layers, attention pattern
    args.update(trainer_fields(c))
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
