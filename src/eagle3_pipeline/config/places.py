"""Where a run writes: ``<results_dir>/<run>/`` and nowhere else.

The run name is one directory name (the schema's pattern), so every output lies under the
results directory; what is left to check is that the run's directory is a directory of its own:
not ``.`` or ``..`` (``run: ..`` would put target/, logs/, plan.json and benchmarks/ beside the
results directory: in the checkout's root with the default one, whose benchmarks/ is
tracked), and neither the checkout, the working directory nor a directory above them; the
results directory may not be the checkout itself either (a run named like one of its
directories would write into it).
"""

from __future__ import annotations

import os
from pathlib import Path

from .schema import SCHEMA_PATH

CHECKOUT = SCHEMA_PATH.parents[1]


def _holds(outer: Path, inner: Path) -> bool:
    return outer == inner or outer in inner.parents


def run_dir_problems(cfg: dict, cwd: str | Path | None = None) -> list[str]:
    """What is wrong with where ``cfg``'s run would write (relative paths from ``cwd``, the
    working directory by default)."""
    run, results = cfg["run"], cfg["results_dir"]
    problems = []
    if not run.strip("."):
        problems.append(
            f"config key `run`: {run!r} names no directory of its own (the run's outputs "
            "would land in or above results_dir); use a name with a letter or digit"
        )
    if not results.strip():
        problems.append(
            "config key `results_dir`: empty (outputs would go to /<run>/ at the root of the "
            "file system); leave it out for results/, or name a directory"
        )
    if problems:
        return problems
    here = Path(cwd or os.getcwd()).resolve()
    results_path = (here / Path(results).expanduser()).resolve()
    run_path = results_path / run
    for protected, what in ((CHECKOUT, "the pipeline's checkout"), (here, "the working directory")):
        if _holds(run_path, protected):
            return [_mixed("run", run_path, what, protected)]
    if _holds(results_path, CHECKOUT):
        return [_mixed("results_dir", results_path, "the pipeline's checkout", CHECKOUT)]
    return []


def _mixed(key: str, path: Path, what: str, protected: Path) -> str:
    return (
        f"config key `{key}`: the run would write into {path}, which holds {what} "
        f"({protected}): its outputs (target/, logs/, plan.json, benchmarks/, ...) would mix "
        "with the files there. Set results_dir to a directory for results (results/ by "
        "default) and run to a name of its own"
    )
