"""What the checkpoints in ``work_dir`` were trained from: a mismatch on the next run discards
them, so a resume never continues training on other inputs or parameters."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

from ..runtime.files import read_json, sha256_file, sha256_tree, stable_hash, write_json
from ..staleness.code import modules_hash
from .checkpoints import CHECKPOINTS

# extract.mode online/hybrid: the training process's spec, ledger and hybrid cache
ONLINE_DIR = "online"

log = logging.getLogger(__name__)

# Fields that do not change what is trained (left out of the fingerprint).
OPERATIONAL = frozenset(
    {"num_workers", "prefetch_factor", "log_freq", "log_dir", "logger", "run_name", "save_path"}
)
# Fields that are paths: what lies there is fingerprinted instead (a moved or copied run keeps
# its finished training).
PATHS = frozenset({"verifier_name_or_path", "data_path", "d2t_path", "t2d_path"})
# The code that decides what is trained, besides speculators: the config mapping, the training
# process and how it reads the data (an edit to export, metrics or plots only re-exports). What
# a method module decides for training is all in the trainer fields (``params``), so an edit to
# a method's labels, checks or predictions re-exports without retraining.
TRAINING_CODE = (
    "train.trainer_config",
    "train.entry",
    "hidden_states.dataset",
    "hidden_states.shards",
)
# Online/hybrid: the code that produces the samples inside training (the round trip to the
# server, its checks, the cache). What the samples hold is the capture fingerprint's
# (extract.CAPTURE_FORMAT among it), as for stored samples.
ONLINE_TRAINING_CODE = ("online.job", "online.servers", "online.spec", "online.transfer")
# What identifies the hidden states in their manifest (eagle3_pipeline.extract.gather); online
# (no samples on disk to hash) the capture fingerprint of the job's own extraction.
HIDDEN_STATES_KEYS = ("samples_sha256", "num_samples", "layer_ids", "storage", "hidden_size")


def fingerprint(
    *,
    train_config: dict[str, Any],
    gpus: int,
    nodes: int = 1,
    dataset_dir: str | Path,
    manifest: dict[str, Any],
    d2t: str | Path,
    t2d: str | Path,
    target: dict[str, Any],
) -> dict[str, Any]:
    """What the checkpoints in work_dir were trained from, by content only: no timestamps,
    timings or paths (manifest.json as a file holds provenance and timings), so a re-run on
    the same content finds its finished training; any change of content invalidates it."""
    import importlib.metadata as md

    try:
        spec_version = md.version("speculators")
    except md.PackageNotFoundError:
        spec_version = None
    skip = OPERATIONAL | PATHS
    hidden_states = {k: manifest.get(k) for k in HIDDEN_STATES_KEYS}
    code = list(TRAINING_CODE)
    if manifest.get("capture"):  # produced by the train job itself (extract.mode online/hybrid)
        hidden_states["capture"] = manifest["capture"]
        code += ONLINE_TRAINING_CODE
    parts = {
        "params": {k: v for k, v in sorted(train_config.items()) if k not in skip},
        # the processes training shares data between: their number sets the global batch
        "world_size": max(1, int(gpus)) * int(nodes),
        "dataset": sha256_tree(dataset_dir),
        "hidden_states": hidden_states,
        "d2t": sha256_file(d2t),
        "t2d": sha256_file(t2d),
        "target": target["identity"],
        "speculators": spec_version,
        "code": modules_hash(code),
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
    for name in (CHECKPOINTS, "logs", "job.json", ONLINE_DIR):
        p = work_dir / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
    work_dir.mkdir(parents=True, exist_ok=True)
    write_json(fp_path, fp)
    return False
