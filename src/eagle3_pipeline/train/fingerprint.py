"""What the checkpoints in ``work_dir`` were trained from: a mismatch on the next run discards
them, so a resume never continues training on other inputs or parameters."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

from ..fileio import read_json, sha256_file, sha256_tree, stable_hash, write_json
from .checkpoints import CHECKPOINTS

log = logging.getLogger(__name__)

# Fields that do not change what is trained (left out of the fingerprint).
OPERATIONAL = frozenset(
    {"num_workers", "prefetch_factor", "log_freq", "log_dir", "logger", "run_name", "save_path"}
)


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
        "dataset": sha256_tree(dataset_dir),
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
    for name in (CHECKPOINTS, "logs", "job.json"):
        p = work_dir / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
    work_dir.mkdir(parents=True, exist_ok=True)
    write_json(fp_path, fp)
    return False
