"""The free disk against what a run will write: one check, made by the plan before a run's first
job and by the extract and train jobs on their real rows before their servers start
(the bytes: :mod:`eagle3_pipeline.hidden_states.disk`)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

GIB = 2**30
# The config key that lets a run proceed past a failed check of the plan's
ALLOW_KEY = "plan.allow"
# Free disk must exceed what a run will write by this factor: logs, the checkpoints, the
# datasets and the estimate's error live there too
DISK_MARGIN = 1.2


class DiskBudgetError(RuntimeError):
    pass


def free_bytes(path: Path) -> tuple[int, Path]:
    """Free bytes of the file system ``path`` will be on (its nearest existing parent)."""
    p = Path(path).resolve()
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free, p


def disk_problem(
    needed: int, free: int, margin: float, where: Path, remedy: str | None = None
) -> str | None:
    """What to do when ``needed`` bytes (times ``margin``) do not fit ``free``; else None.
    ``remedy``: what to lower instead of the stored mode's levers."""
    if needed * margin <= free:
        return None
    short = needed * margin - free
    remedy = remedy or (
        "use extract.storage: fp8 (half the size, at about the same extraction rate), lower "
        "prepare.seq_length / the number of prompts, or use extract.mode: online or hybrid "
        "(docs/train.md: no stored hidden states)"
    )
    return (
        f"hidden states need about {needed / GIB:.1f} GiB (x{margin} margin = "
        f"{needed * margin / GIB:.1f} GiB) but {where} has {free / GIB:.1f} GiB free. "
        f"Free {short / GIB:.1f} GiB, point results_dir at a bigger disk, {remedy}; or set "
        f"{ALLOW_KEY}: [disk] to proceed anyway."
    )


def check_disk(root: Path, needed: int, margin: float, allow: bool = False) -> dict[str, Any]:
    """A job's check, on its real rows: refuse (DiskBudgetError) unless allowed."""
    root.mkdir(parents=True, exist_ok=True)
    free, _ = free_bytes(root)
    info = {"estimated_bytes": needed, "free_bytes": free, "margin": margin}
    problem = disk_problem(needed, free, margin, root)
    if problem and not allow:
        raise DiskBudgetError(problem)
    if problem:
        log.warning("%s (%s lists disk: proceeding)", problem, ALLOW_KEY)
    log.info("disk: %.2f GiB needed, %.1f GiB free", needed / GIB, free / GIB)
    return info


def bytes_under(path: Path) -> int:
    """Bytes already stored under ``path`` (finished samples are reused, not rewritten)."""
    if not path.is_dir():
        return 0
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
