"""speculators' checkpoints in ``work_dir/checkpoints``: which are complete, which to resume
from, which to export."""

from __future__ import annotations

import json
import logging
import shutil
import struct
import zipfile
from pathlib import Path
from typing import Any

from .. import methods
from .errors import TrainError

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"


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
    for name in [*needed, "training_state.json"]:
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


def best_checkpoint(save_path: Path, records: list[dict[str, Any]], method: str) -> Path:
    """The end-of-epoch checkpoint whose validation is best by the method's rule
    (:meth:`eagle3_pipeline.methods.base.Method.best_epoch`: lowest loss for EAGLE-3, what
    speculators' ``checkpoint_best`` link follows; highest eal for DFlash), chosen from the
    validation records of every epoch (speculators keeps ``val_metrics.json`` in the linked one
    only)."""
    val = {int(r["epoch"]): r["val"] for r in records if r["kind"] == "val"}
    epoch = methods.get(method).best_epoch(val)
    if epoch is not None and (save_path / str(epoch)).is_dir():
        return save_path / str(epoch)
    dirs = epoch_dirs(save_path)
    if not dirs:
        raise TrainError(f"training left no checkpoint in {save_path}")
    log.warning("no validated epoch checkpoint in %s: exporting the newest one", save_path)
    return dirs[-1]


def training_finished(save_path: Path, epochs: int, val_epochs: set[int]) -> bool:
    dirs = epoch_dirs(save_path)
    if not dirs or int(dirs[-1].name) != epochs - 1:
        return False
    state = json.loads((dirs[-1] / "training_state.json").read_text())
    return state.get("local_step", 0) == 0 and epochs - 1 in val_epochs
